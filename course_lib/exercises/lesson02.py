"""Lesson 02 exercises: reshaping a batch for pmap, a pmapped reduction, reading one device's block."""

import jax
import jax.numpy as jnp
import numpy as np

from . import Case, Mismatch, Mistake, Said, call, diagnose, exercise, expect_pmapped, placement
from .lesson00 import _array, _data


# ----------------------------------------------------------------------------------------------
# 02.1 Split a batch for pmap


def solution_split_batch(x, n):
    return x.reshape((n, x.shape[0] // n) + x.shape[1:])


def _blocks_first(x, n):
    return x.reshape((x.shape[0] // n, n) + x.shape[1:])


MISTAKES_02_1 = [
    Mistake("device axis second", "The device axis (size {n}) should come first: pmap maps over axis 0.",
            _blocks_first),
    Mistake("interleaved rows", "Device 0 got rows 0, {n}, ... (every {n}-th row): the rows were interleaved (an "
            "extra transpose or swap of axes), so no device gets consecutive rows.",
            lambda x, n: _blocks_first(x, n).swapaxes(0, 1)),
]


@exercise("02.1", "Reshape a batch for pmap: (B, ...) -> (n, B // n, ...)", solution=solution_split_batch,
          returns="an array of shape (n, B // n, ...) with x's values, device i's block the rows "
                  "i * B // n to (i + 1) * B // n",
          hints=["Only the shape changes, not the order of the values: no transpose, no copy by hand. And x "
                 "may have any number of axes after the batch axis.",
                 "Section 5, \"By hand\": one `reshape`; x's `shape` attribute holds the sizes of its axes."])
def check_split_batch(split_batch):
    ints = (np.arange(30, dtype=np.int32).reshape(10, 3, 1) * 7) % 11      # integers too: an answer must not cast them
    cases = [Case((x, n), f"split_batch(x {x.shape} {x.dtype.name}, n={n})", n=n) for x, n in [
        (_data((16, 3), seed=27), 8), (_data((12, 2, 2), seed=20), 4), (_data((6,), seed=9), 3),
        (_data((8, 5), seed=14), 1), (ints, 5)]]
    hints = {"cannot be interpreted as an integer": "A shape needs whole numbers, and B / n is a float even when n "
                                                    "divides B: divide with integer division."}
    diagnose(split_batch, cases, solution=solution_split_batch, mistakes=MISTAKES_02_1,
             run=lambda fn, case: call(fn, *case.args, name="split_batch", hints=hints))
    return "each device's block is B // n consecutive rows, and the device axis comes first."


# ----------------------------------------------------------------------------------------------
# 02.2 A pmapped reduction


def solution_sum_of_squares(xs):
    return jax.pmap(lambda block: jnp.sum(block**2))(xs)


# A mistake of 02.2: what one device does with its block (f), under pmap
MISTAKES_02_2 = [Mistake(name, text, lambda xs, f=f: jax.pmap(f, axis_name="i")(xs)) for name, text, f in [
    ("mean", "Each block's mean of the squares: the sum divided by the number of values in a block. The exercise "
     "asks for the sum.", lambda b: jnp.mean(b ** 2)),
    ("square of the sum", "That is the square of each block's sum: the sum was taken first and squared afterwards, "
     "where each value is squared before the sum.", lambda b: jnp.sum(b) ** 2),
    ("last axis only", "Each device summed only its block's last axis, not the whole block.",
     lambda b: jnp.sum(b ** 2, axis=-1)),
    ("first axis only", "Each device summed only its block's first axis (one sum per column), not the whole block.",
     lambda b: jnp.sum(b ** 2, axis=0)),
    ("not squared", "That is each block's plain sum: the values were not squared before the sum.", jnp.sum),
    ("square root", "That is the square root of each block's sum of squares (its norm): the exercise asks for the "
     "sum of squares itself.", lambda b: jnp.sqrt(jnp.sum(b ** 2))),
    ("total everywhere", "Every device holds the total over ALL the blocks (a psum of the block sums): each device's "
     "own block's sum was asked, no collective.", lambda b: jax.lax.psum(jnp.sum(b ** 2), "i")),
]]


@exercise("02.2", "Per-device sums of squares with pmap", solution=solution_sum_of_squares,
          returns="a jax.Array of shape (n,), device i's sum of squares of xs[i], spread over the n devices",
          hints=["Write what ONE device does with its block (b, d): one number. pmap does the rest.",
                 "Section 1 of the lesson: `jax.pmap`; and `jnp.sum`'s documentation, for what it sums when "
                 "given no axis."])
def check_sum_of_squares(sum_of_squares):
    devices = jax.devices()
    cases = [Case((jnp.asarray(_data((n, b, d), seed=n * 100 + b * 10 + d)),), f"sum_of_squares(xs {(n, b, d)})",
                  n=n) for n, b, d in [(len(devices), 2, 3), (4, 5, 2), (2, 1, 1)]]
    results = diagnose(sum_of_squares, cases, solution=solution_sum_of_squares, mistakes=MISTAKES_02_2,
                       name="sum_of_squares", rtol=1e-4)
    for case, got in zip(cases, results):
        maps = expect_pmapped(sum_of_squares, got, case.args, devices[:case.n], what=case.label, in_order=True,
                              name="sum_of_squares", how="each device summing its own block",
                              work=[({"reduce_sum", "dot_general"}, "sum of squares")])
        shapes = [tuple(v.aval.shape) for e in maps for v in e.outvars]
        if (case.n,) not in shapes:
            raise Mismatch(f"{case.label} has the right values, but the pmap returned shape "
                           f"{', '.join(str(sh) for sh in shapes)}, not ({case.n},): part of "
                           "each block's sum ran after pmap, outside the devices' program. Each device should "
                           "reduce its whole block inside the pmapped function.")
    return "one sum per device, computed where its block lives."


# ----------------------------------------------------------------------------------------------
# 02.3 One device's block, where it lives


def _moves_data(fn, *args, guard=lambda: jax.transfer_guard("disallow_explicit")) -> bool:
    """Whether ``fn(*args)`` copies data between devices or through the host (the copies ``guard()`` refuses;
    by default explicit device_puts too: JAX 0.11 lets those through): JAX's transfer guard says. A value sent from
    the host to a device is no copy of a block (``x * 1`` sends its 1)."""
    jax.block_until_ready(args)  # the inputs' own transfers are done before the guard starts
    try:
        with guard(), jax.transfer_guard_host_to_device("allow"):
            fn(*args)
    except Exception as e:  # only the guard's own refusal counts; the checker has already run fn once
        return "Disallowed" in str(e)
    return False


def solution_block_on(y, i):
    return y.addressable_shards[i].data[0]


def _y(shape):
    """A fresh pmap result each time: NumPy keeps a host copy of an array it has read once."""
    return jax.pmap(lambda x: x * 2)(jnp.asarray(_data(shape, seed=shape[-1])))


def _block_and_place(fn, case):
    """What reading a block gives: its values, where it lives, and whether building it moved data."""
    shape, i = case.args
    got = _array(call(fn, _y(shape), i, name="block_on"), "block_on", "02.3")
    moved = _moves_data(fn, _y(shape), i)
    return got, placement(got), Said("building it moved data" if moved else "building it moved no data")


_READ_IN_PLACE = " Read the block the device already holds instead (section 3)."
MISTAKES_02_3 = [
    Mistake("global index", "Indexing the global array (y[i]) computes the value on every device and copies it to "
            "all of them." + _READ_IN_PLACE, lambda y, i: y[i]),
    Mistake("copied back", "Building it moved data: the result is a new array on device i, copied from elsewhere, "
            "not the block that device already holds (an index into y then a device_put does this)." + _READ_IN_PLACE,
            lambda y, i: jax.device_put(y[i], jax.devices()[i])),
    Mistake("on the host", "It was copied to the host: return the jax.Array that the device holds.",
            lambda y, i: np.asarray(y)[i]),
    Mistake("device axis kept", "The extra leading axis of size 1 is pmap's device axis, which a shard's data "
            "keeps.", lambda y, i: y.addressable_shards[i].data),
    Mistake("every size-1 axis dropped", "Every axis of size 1 was dropped, including y's own: only the leading "
            "axis of the shard's data, pmap's device axis, should go (a squeeze with no axis named removes them "
            "all).", lambda y, i: y.addressable_shards[i].data.squeeze()),
    Mistake("device 0's block", "That is device 0's block, whatever device is asked for: each shard says which "
            "device holds it.", lambda y, i: y.addressable_shards[0].data[0]),
    Mistake("the device before", "That is the block of the device before the one asked for (device i - 1): each "
            "shard says which device holds it.", lambda y, i: y.addressable_shards[i - 1].data[0]),
]


@exercise("02.3", "Read one device's block where it lives", solution=solution_block_on,
          returns="a jax.Array of shape y.shape[1:], living on device i only",
          hints=["Indexing y[i] is a computation on the global array, and its result is copied to every "
                 "device. Ask y for the piece device i already holds instead.",
                 "Section 3, \"Reading one device's result\": `jax.Array.addressable_shards` lists each device's "
                 "block, and a shard's `data` is that block, still on its device."])
def check_block_on(block_on):
    n = len(jax.devices())
    cases = [Case((shape, i), f"block_on(y {shape}, {i})", n=shape[0])
             for shape in [(n, 3), (n, 2, 2), (n, 1, 2), (4, 2, 3)] for i in sorted({0, 3, shape[0] - 1})]
    diagnose(block_on, cases, solution=solution_block_on, mistakes=MISTAKES_02_3, run=_block_and_place,
             names=("the block", "placement", "moves"))
    return "you read device i's block where it lives, with nothing copied to the other devices."
