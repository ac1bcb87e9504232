"""Lesson 04 exercises: collectives built from ppermute, global statistics, a ring rotation.

Each exercise asks for a function ``f(x, axis_name)`` that runs *inside* ``jax.pmap`` on one
device's value ``x``. The checkers run it on several device counts and shapes and compare
every device's result with the NumPy references of ``course_lib.collectives``.
"""

import jax
import jax.numpy as jnp
import numpy as np

from .. import collectives as C
from . import Mismatch, as_array, call, describe_tree, exercise, expect_array, primitives

AXIS = "i"


def _run(fn, xs, name):
    """Run the learner's per-device ``fn(x, "i")`` under pmap over ``xs`` (n, ...); per-device results."""
    n = xs.shape[0]
    mapped = jax.pmap(lambda x: fn(x, AXIS), axis_name=AXIS, devices=jax.devices()[:n])
    return call(mapped, jnp.asarray(xs), name=f"pmap({name})", hints={
        "unbound axis name": "Use the axis_name argument your function receives for every collective.",
        "must be unique": "A permutation lists each device at most once as a source and once as a destination.",
    })


def _uses(fn, xs, primitive: str) -> bool:
    mapped = jax.pmap(lambda x: fn(x, AXIS), axis_name=AXIS, devices=jax.devices()[:xs.shape[0]])
    return any(e.primitive.name == primitive for e in primitives(mapped, jnp.asarray(xs), name="your function"))


def _cases(shapes, seed=0):
    rng = np.random.default_rng(seed)
    n_all = len(jax.devices())
    for n in sorted({n_all, 4, 2}, reverse=True):
        for shape in shapes:
            yield rng.integers(-9, 10, size=(n,) + shape).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# 04.1 A ring all-reduce from ppermute


def solution_ring_allreduce(x, axis_name):
    n = jax.lax.psum(1, axis_name)               # the number of devices, a Python int
    ring = [(i, (i + 1) % n) for i in range(n)]  # everyone sends to the right-hand neighbour
    total, passing = x, x
    for _ in range(n - 1):                       # after n - 1 hops every value has visited every device
        passing = jax.lax.ppermute(passing, axis_name, ring)
        total = total + passing
    return total


@exercise("04.1", "Build psum from ppermute (a ring all-reduce)", solution=solution_ring_allreduce,
          returns="on each device, an array shaped like x: the sum of every device's x",
          hints=["Pass a value round the ring: each device sends to its right-hand neighbour and adds what "
                 "arrives from its left. How many hops until every value has visited every device?",
                 "n = jax.lax.psum(1, axis_name) is the device count; "
                 "jax.lax.ppermute(v, axis_name, [(i, (i + 1) % n) for i in range(n)]) is one hop. Do n - 1 "
                 "hops, keep passing the received value on, and add each one to a running total."])
def check_ring_allreduce(ring_allreduce):
    for xs in _cases([(), (3,), (2, 2)], seed=1):
        n = xs.shape[0]
        what = f"ring_allreduce on {n} devices, per-device shape {xs.shape[1:]}"
        got = as_array(_run(ring_allreduce, xs, "ring_allreduce"), what=what, expected_shape=xs.shape)
        right = np.shape(got) == xs.shape and np.allclose(got, C.psum(xs))
        if not right and np.shape(got) == xs.shape and np.allclose(got, C.psum(xs) + xs):
            raise Mismatch(f"{what}: every device ends with the sum plus its own value once more: that is n = {n} "
                           f"hops; n - 1 = {n - 1} bring every other value exactly once.")
        if not right and np.shape(got) == xs.shape and np.allclose(got, xs + C.ppermute(xs, C.ring_permutation(n))):
            raise Mismatch(f"{what}: each device ends with its own value plus its neighbour's: one hop only. "
                           f"Keep passing the received value on, n - 1 = {n - 1} times in all.")
        expect_array(got, C.psum(xs), what=what)
    if _uses(ring_allreduce, xs, "psum") or not _uses(ring_allreduce, xs, "ppermute"):
        raise Mismatch("right values, but the sum must be built from jax.lax.ppermute, not psum.")
    return "n - 1 hops round the ring, and every device holds the total: an all-reduce."


# ----------------------------------------------------------------------------------------------
# 04.2 The global mean and variance from per-device shards


def solution_global_mean_var(x, axis_name):
    mean = jax.lax.pmean(jnp.mean(x), axis_name)                   # every shard has the same size
    var = jax.lax.pmean(jnp.mean((x - mean) ** 2), axis_name)      # deviations from the *global* mean
    return mean, var


@exercise("04.2", "A global mean and variance from per-device shards", solution=solution_global_mean_var,
          returns="a pair (mean, var), each one number per device, the same on every device",
          hints=["Each device sees only its shard. The statistics of ALL the data need a collective; and the "
                 "variance must measure deviations from the global mean, not the shard's.",
                 "mean = jax.lax.pmean(jnp.mean(x), axis_name); then var = jax.lax.pmean(jnp.mean((x - mean) ** 2),"
                 " axis_name). (Every shard has the same size, so the mean of means is the global mean.)"])
def check_global_mean_var(global_mean_var):
    for xs in _cases([(6,), (3,)], seed=2):
        xs = xs + np.arange(xs.shape[0], dtype=np.float32)[:, None] * 3  # shards with different means
        got = _run(global_mean_var, xs, "global_mean_var")
        n = xs.shape[0]
        what = f"global_mean_var on {n} devices with {xs.shape[1]} values each"
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise Mismatch(f"{what} should return a pair (mean, var); got {describe_tree(got)}.")
        mean, var = (as_array(v, what=f"{what}: {k}", expected_shape=(n,)) for k, v in zip(("mean", "var"), got))
        if mean.shape != (n,) or var.shape != (n,):
            raise Mismatch(f"{what}: mean and var should be one number per device (pmap gives shape ({n},)); got "
                           f"{mean.shape} and {var.shape}.")
        if not np.allclose(mean, mean[0]) or not np.allclose(var, var[0]):
            raise Mismatch(f"{what}: the devices disagree (means {[round(float(m), 2) for m in mean]}): each computed its "
                           "own shard's statistics. Combine them across devices with pmean (or psum).")
        if np.allclose(var, xs.var(axis=1).mean(), rtol=1e-4) and not np.isclose(xs.var(axis=1).mean(), xs.var()):
            raise Mismatch(f"{what}: the variance is the mean of the per-device variances, "
                           f"{xs.var(axis=1).mean():.4f}; the variance of all the data is {xs.var():.4f}. Measure "
                           "each value's deviation from the global mean, not from its shard's mean.")
        expect_array(mean, np.full(n, xs.mean()), what=f"{what}: the mean", rtol=1e-4, atol=1e-4)
        expect_array(var, np.full(n, xs.var()), what=f"{what}: the variance", rtol=1e-4, atol=1e-4)
    return "every device knows the statistics of the whole batch."


# ----------------------------------------------------------------------------------------------
# 04.3 Rotate shards one device to the right


def solution_rotate_right(x, axis_name):
    n = jax.lax.psum(1, axis_name)
    return jax.lax.ppermute(x, axis_name, [(i, (i + 1) % n) for i in range(n)])


@exercise("04.3", "Rotate the shards one device to the right", solution=solution_rotate_right,
          returns="on device i, an array shaped like x: device (i - 1) % n's x",
          hints=["One collective, one hop: every device sends its x to its right-hand neighbour, and the last "
                 "device's x wraps round to device 0.",
                 "jax.lax.ppermute(x, axis_name, perm) with perm = [(i, (i + 1) % n) for i in range(n)], "
                 "n = jax.lax.psum(1, axis_name): pairs (source, destination)."])
def check_rotate_right(rotate_right):
    for xs in _cases([(2,), (2, 3)], seed=3):
        n = xs.shape[0]
        what = f"rotate_right on {n} devices"
        got = as_array(_run(rotate_right, xs, "rotate_right"), what=what, expected_shape=xs.shape)
        shifted = np.roll(xs, 1, axis=0)
        right = np.shape(got) == xs.shape and np.allclose(got, shifted)
        if not right and np.shape(got) == xs.shape and np.allclose(got, np.roll(xs, -1, axis=0)):
            raise Mismatch(f"{what}: device i got device i + 1's value: that rotates left. Send from i to "
                           "(i + 1) % n.")
        if not right and np.shape(got) == xs.shape and np.allclose(got[1:], shifted[1:]) and np.allclose(got[0], 0):
            raise Mismatch(f"{what}: device 0 received nothing (zeros): the last device must send to device 0, so "
                           f"the ring closes: (n - 1, 0) = ({n - 1}, 0).")
        expect_array(got, shifted, what=f"{what} (row i is what device i holds)")
    if not _uses(rotate_right, xs, "ppermute"):
        raise Mismatch("right values, but the rotation must be one jax.lax.ppermute: each device sends its own x.")
    return "each shard moved one device to the right, and the last one wrapped round to device 0."


# ----------------------------------------------------------------------------------------------
# 04.4 all_gather from ppermute


def solution_gather_all(x, axis_name):
    n = jax.lax.psum(1, axis_name)
    me = jax.lax.axis_index(axis_name)
    ring = [(i, (i + 1) % n) for i in range(n)]
    gathered = jnp.zeros((n,) + x.shape, x.dtype).at[me].set(x)
    passing, owner = x, me
    for _ in range(n - 1):
        passing = jax.lax.ppermute(passing, axis_name, ring)
        owner = (owner - 1) % n                      # the value now here came from one device further left
        gathered = gathered.at[owner].set(passing)
    return gathered


@exercise("04.4", "Build all_gather from ppermute", solution=solution_gather_all,
          returns="on each device, an array of shape (n,) + x.shape: row j is device j's x",
          hints=["The ring of 04.1 again, but instead of adding what arrives, store it; and keep track of "
                 "which device each arriving value came from.",
                 "Start from jnp.zeros((n,) + x.shape).at[me].set(x), me = jax.lax.axis_index(axis_name). After "
                 "each ppermute hop to the right the value came from one device further left: owner = "
                 "(owner - 1) % n; store it with .at[owner].set(value)."])
def check_gather_all(gather_all):
    for xs in _cases([(), (2,)], seed=4):
        n = xs.shape[0]
        what = f"gather_all on {n} devices, per-device shape {xs.shape[1:]}"
        expected = C.all_gather(xs)
        got = got_arr = as_array(_run(gather_all, xs, "gather_all"), what=what, expected_shape=expected.shape)
        if got_arr.shape == expected.shape and not np.allclose(got_arr, expected):
            rolled = np.stack([np.roll(xs, -i, axis=0) for i in range(n)])
            if np.allclose(got_arr, rolled):
                raise Mismatch(f"{what}: each device has every value, but starting with its own: row j of every "
                               "device's result must be device j's value. Place each received value at the index "
                               "of the device it came from.")
        expect_array(got, expected, what=f"{what} (every device should hold all {n} values, in device order)")
    if _uses(gather_all, xs, "all_gather") or not _uses(gather_all, xs, "ppermute"):
        raise Mismatch("right values, but it must be built from jax.lax.ppermute, not all_gather.")
    return "every device holds every device's value, in device order: an all-gather."
