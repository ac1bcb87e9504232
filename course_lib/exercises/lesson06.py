"""Lesson 06 exercises: placing arrays on a mesh, out_specs that check_vma accepts."""

import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from .. import sharding
from . import Case, Mismatch, Mistake, Said, call, describe_tree, diagnose, exercise, placement
from .lesson08 import SPEC_ALONE, mixed_devices

AXIS = "i"


def _mesh(n, mixed=False):
    """A mesh of ``n`` devices; with fewer than all, the last ``n`` in reverse order; all of them in id order, or with
    ``mixed`` out of it (``mixed_devices``): an answer that builds its own mesh, or puts a block elsewhere, shows."""
    devices = (mixed_devices() if mixed else jax.devices()) if n == len(jax.devices()) else jax.devices()[::-1][:n]
    return jax.make_mesh((n,), (AXIS,), axis_types=(jax.sharding.AxisType.Explicit,), devices=devices)


# JAX's DuplicateSpecError, in the course's words: what a PartitionSpec's entries mean
DUPLICATE = {"duplicate entries": "A PartitionSpec names each mesh axis at most once: its k-th entry says which mesh "
                                  "axis splits the array's axis k, and one mesh axis can split only one of them."}


def _spec(x):
    return getattr(x.sharding, "spec", None) if isinstance(x, jax.Array) else None


# ----------------------------------------------------------------------------------------------
# 06.1 Parameters replicated, batch split


def solution_place(params, batch, mesh):
    params = jax.device_put(params, NamedSharding(mesh, P()))
    batch = jax.device_put(batch, NamedSharding(mesh, P("i")))
    return params, batch


def _place_cases(n0):
    """(devices, params, batch): other names, nesting, shapes and trailing axes in each case."""
    rng = np.random.default_rng(61)
    f32 = lambda *shape: rng.normal(size=shape).astype(np.float32)
    return [
        (n0, {"w": f32(3, 2), "b": f32(2)}, {"x": f32(4 * n0, 3), "y": rng.integers(0, 9, 4 * n0).astype(np.int32)}),
        (4, {"layer": {"kernel": f32(5, 3), "bias": f32(3)}},
         {"image": f32(3 * 4, 2, 3), "meta": {"label": rng.integers(0, 9, 3 * 4).astype(np.int32)}}),
        (2, {"w": f32(6), "scale": f32(2).astype(jnp.bfloat16)},     # one bfloat16 leaf: a cast shows
         {"x": f32(5 * 2, 4), "mask": (rng.random(5 * 2) > 0.5)}),
    ]


def _leaves(tree):
    return [(jax.tree_util.keystr(path), leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _layout(leaf, mesh) -> str:
    """How ``leaf`` is laid out, in words: ``on the host``, ``whole on devices [0, 1]``, ``in blocks of (3, 2) on
    devices [7, 6, 5, 4]`` (in block order: ``placement``); and its mesh's axes and devices, if not ``mesh``'s."""
    if not isinstance(leaf, jax.Array):
        return "on the host"
    own, given = ((m.axis_names, m.device_ids.tolist()) for m in (getattr(leaf.sharding, "mesh", mesh), mesh))
    other = "" if own == given else (f", on a mesh of its own (axes {own[0]}, devices {own[1]}; the mesh given: "
                                     f"{given[0]}, {given[1]})")
    blocks = sorted({s.data.shape for s in leaf.addressable_shards})
    how = "whole" if leaf.sharding.is_fully_replicated else f"in blocks of {blocks[0] if len(blocks) == 1 else blocks}"
    return f"{how} {placement(leaf)}{other}"


_PLACE_HINTS = {
    "must be >= the product of mesh_shape": "Use the mesh you were given (the argument mesh); do not build "
                                            "another one.",
    "is not found in mesh": "The mesh you were given names its axis 'i': a spec can only name the axes of "
                                "that mesh.", **SPEC_ALONE, **DUPLICATE,
}


def _placed(fn, case):
    """What a placing answer gives: (params' values, batch's values, where each leaf lives, in words)."""
    try:
        out = call(fn, *case.args, name="place", hints=_PLACE_HINTS)
    except Mismatch as e:                    # JAX's own words say which array was split, and how many times
        split = re.search(r"axis (\d+) is partitioned (\d+) times.*?(?:Got|full) shape: \(([\d, ]*)\)", str(e))
        if not split:
            raise
        axis, times, shape = int(split[1]), int(split[2]), tuple(int(v) for v in split[3].split(",") if v.strip())
        if times != case.n:
            raise Mismatch(f"it split an array over {times} devices, and the mesh given has {case.n}: build the "
                           "NamedSharding on the mesh you were given (the argument mesh).") from None
        part = "a parameter" if any(np.shape(v) == shape for _, v in _leaves(case.args[0])) else "a batch leaf"
        raise Mismatch(f"it split {part} of shape {shape} along axis {axis} over 'i', and {times} devices do not "
                       "divide that axis. Only the batch is split, along axis 0, its rows; the parameters stay "
                       "whole on every device.") from None
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise Mismatch(f"place should return a pair (params, batch); got {describe_tree(out)}.")
    for name, part, given in zip(("params", "batch"), out, case.args):
        if part is None:
            raise Mismatch(f"{name} is None, where {describe_tree(given)} was expected.")
    values = tuple(jax.tree.map(lambda v: np.asarray(v) if hasattr(v, "shape") else v, part) for part in out)
    return values + ([Said(f"{root}{name} {_layout(leaf, case.args[2])}") for root, part in
                      zip(("params", "batch"), out) for name, leaf in _leaves(part)],)


def _to_f32(tree):
    return jax.tree.map(lambda v: np.asarray(v).astype(np.float32), tree)


NO_CAST = " Placing an array should not change its dtype: no cast."
MISTAKES_06_1 = [
    Mistake("batch replicated", "The batch is replicated: every device holds the whole batch, where each should "
            "hold only its own rows.",
            lambda p, b, m: jax.device_put((p, b), NamedSharding(m, P()))),
    Mistake("stacked copies", "A stacked copy per device is the pmap way (sharding.replicate). On a mesh the "
            "array keeps its own shape; its sharding alone says that every device holds all of it (lesson 06, "
            "section 1).", lambda p, b, m: (sharding.replicate(p, devices=list(m.devices.flat)),
                                            jax.device_put(b, NamedSharding(m, P(AXIS))))),
    Mistake("left on the host", "Nothing was placed: the arrays are still on the host.", lambda p, b, m: (p, b)),
    Mistake("swapped", "That is (batch, params): the batch first. Return them in the order (params, batch).",
            lambda p, b, m: solution_place(p, b, m)[::-1]),
    *[Mistake(name, "The parameters are on one device; every device of the mesh needs the whole array.",
              lambda p, b, m, first=first: (jax.device_put(p, m.devices.flat[0] if first else None),
                                            solution_place(p, b, m)[1]))
      for name, first in (("params on one device", True), ("params on the default device", False))],
    Mistake("batch cast", "The batch came back as float32." + NO_CAST,
            lambda p, b, m: solution_place(p, _to_f32(b), m)),
    Mistake("params cast", "The parameters came back as float32." + NO_CAST,
            lambda p, b, m: solution_place(_to_f32(p), b, m)),
]


@exercise("06.1", "Replicate the parameters and split the batch on a mesh", solution=solution_place,
          returns="a pair (params, batch) with the same keys and shapes as the inputs: params leaves replicated "
                  "on the mesh (P()), batch leaves split along axis 0 over 'i' (P('i'))",
          hints=["On a mesh nothing is stacked or reshaped: you only say, for each array, how it is laid out "
                 "over the mesh axis 'i'. Which of the two inputs is the same on every device, and which is "
                 "divided between them?",
                 "Lesson 06, section 1: `jax.device_put` with a `NamedSharding`, and the cells that print a "
                 "PartitionSpec's layout. device_put accepts a whole pytree (a dict of arrays) at once."])
def check_place(place):
    cases = [Case((params, batch, _mesh(n, mixed=True)), f"on a mesh of {n} devices", n=n)
             for n, params, batch in _place_cases(len(jax.devices()))]
    diagnose(place, cases, solution=solution_place, mistakes=MISTAKES_06_1, run=_placed, rtol=0, atol=0,
             names=("params", "batch", "placement"))
    return "parameters whole on every device (P()), the batch split along axis 0 (P('i')), on 8, 4 and 2 devices."


# ----------------------------------------------------------------------------------------------
# 06.2 out_specs that check_vma accepts


def stats(x):
    """Per device: this device's sum, and the total over all devices."""
    local = jnp.sum(x, keepdims=True)
    return local, jax.lax.psum(local, AXIS)


def solution_stats_out_specs():
    return (P("i"), P())


def _run_stats(fn, case):
    """The out_specs ``fn()`` returns, applied: ``stats`` under ``shard_map`` on the case's mesh."""
    specs = call(fn, name="stats_out_specs")
    if not isinstance(specs, (tuple, list)) or len(specs) != 2 or not all(isinstance(s, P) for s in specs):
        raise Mismatch(f"stats_out_specs() should return a pair of PartitionSpecs, one per output of stats; got "
                       f"{describe_tree(specs)}.")
    mesh = _mesh(case.n)
    x = jax.device_put(np.random.default_rng(62 + case.n).normal(size=(2 * case.n, 3)).astype(np.float32),
                       NamedSharding(mesh, P(AXIS)))
    label = "P()" if specs[0] == P() else f"{specs[0]} (it names no mesh axis: the same as P())"
    other = f"it names a mesh axis that the mesh does not have: its only axis is {AXIS!r}."
    return call(jax.shard_map(stats, mesh=mesh, in_specs=P(AXIS), out_specs=tuple(specs)), x,
                name=f"shard_map(stats, out_specs={tuple(specs)})", summaries={
                    "can't be statically inferred": f"check_vma rejects {label} for the per-device sums, which differ "
                    "from device to device. Only the psum total is known to be the same everywhere.",
                    "marked as manual": other, "not found in mesh": other, **DUPLICATE})


MISTAKES_06_2 = [
    Mistake("total stacked", "The total is the same on every device, and check_vma knows it (it came out of "
            "psum): naming 'i' for it stacks {n} copies of one value.", lambda: (P(AXIS), P(AXIS))),
    Mistake("sums along axis 1", "The per-device sums were stacked along axis 1: each device's value is a row of "
            "the blocks' first axis, so 'i' belongs to axis 0.", lambda: (P(None, AXIS), P())),
]


@exercise("06.2", "Choose the out_specs that check_vma accepts", solution=solution_stats_out_specs,
          returns="a pair of PartitionSpecs (spec of the per-device sums, spec of the total)",
          hints=["Ask of each output: is it the same on every device, and can check_vma SEE that it is? Only a "
                 "value that came out of a collective is known to be the same everywhere.",
                 "Lesson 06, section 3 ('What check_vma checks'): read what an out_specs entry that names an axis "
                 "does, and what an empty one claims."])
def check_stats_out_specs(stats_out_specs):
    cases = [Case((), f"out_specs on a mesh of {n} devices", n=n) for n in (len(jax.devices()), 4, 2)]
    diagnose(stats_out_specs, cases, solution=solution_stats_out_specs, mistakes=MISTAKES_06_2, run=_run_stats,
             rtol=1e-4, atol=1e-4)
    return ("P('i') for values that differ per device; P() for the psum, which check_vma can see is replicated "
            "(on 8, 4 and 2 devices).")
