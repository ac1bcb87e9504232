"""Lesson 06 exercises: placing arrays on a mesh, out_specs that check_vma accepts."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from . import Case, Mismatch, Mistake, call, describe_tree, diagnose, exercise, expect_array, expect_structure

AXIS = "i"


def _mesh(n):
    return jax.make_mesh((n,), (AXIS,), axis_types=(jax.sharding.AxisType.Explicit,), devices=jax.devices()[:n])


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
         {"image": f32(3 * 4, 2, 3), "label": rng.integers(0, 9, 3 * 4).astype(np.int32)}),
        (2, {"w": f32(6), "scale": f32(2).astype(jnp.bfloat16)},     # one bfloat16 leaf: a cast shows
         {"x": f32(5 * 2, 4), "mask": (rng.random(5 * 2) > 0.5)}),
    ]


def _leaves(tree):
    return [(jax.tree_util.keystr(path), leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


@exercise("06.1", "Replicate the parameters and split the batch on a mesh", solution=solution_place,
          returns="a pair (params, batch) with the same keys and shapes as the inputs: params leaves replicated "
                  "on the mesh (P()), batch leaves split along axis 0 over 'i' (P('i'))",
          hints=["On a mesh nothing is stacked or reshaped: you only say, for each array, how it is laid out "
                 "over the mesh axis 'i'. Which of the two inputs is the same on every device, and which is "
                 "divided between them?",
                 "Lesson 06, section 1: `jax.device_put` with a `NamedSharding`, and the cells that print a "
                 "PartitionSpec's layout. device_put accepts a whole pytree (a dict of arrays) at once."])
def check_place(place):
    for n, params, batch in _place_cases(len(jax.devices())):
        mesh = _mesh(n)
        where = f"on a mesh of {n} devices"
        try:
            out = call(place, params, batch, mesh, name="place", hints={
                "must be >= the product of mesh_shape": "Use the mesh you were given (the argument mesh); do not "
                                                        "build another one.",
                "is not found in mesh": "The mesh you were given names its axis 'i': a spec can only name the "
                                        "axes of that mesh.",
                "if a PartitionSpec is passed": "A PartitionSpec alone does not say which mesh it refers to: pair "
                                                "it with the mesh you were given (lesson 06, section 1).",
            })
        except Mismatch as e:
            import re
            shape = re.search(r"Got shape: \(([\d, ]*)\)", str(e))
            axis = re.search(r"array axis (\d+) is partitioned", str(e))
            if not shape:
                raise
            shape = tuple(int(s) for s in shape.group(1).split(",") if s.strip())
            size = re.search(r"Mesh\('[^']*': (\d+)", str(e))
            if size and int(size.group(1)) != n:
                raise Mismatch(f"place {where} put an array on a mesh of {size.group(1)} devices: build the "
                               "NamedSharding on the mesh you were given (the argument mesh), not on another "
                               "one.") from None
            if any(np.shape(v) == shape for _, v in _leaves(params)):
                raise Mismatch(f"place {where} split a parameter of shape {shape} over 'i', and its size does not "
                               "divide over the devices. Only the batch is split; the parameters stay whole on "
                               "every device.") from None
            raise Mismatch(f"place {where} split a batch leaf of shape {shape} along axis "
                           f"{axis.group(1) if axis else '?'}. The batch is split along axis 0, its rows, and "
                           "along no other axis.") from None
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise Mismatch(f"place should return a pair (params, batch); got {describe_tree(out)}.")
        p, b = out
        if isinstance(p, dict) and isinstance(b, dict) and set(p) == set(batch) and set(b) == set(params):
            raise Mismatch("place returned (batch, params): the batch first. Return them in the order "
                           "(params, batch).")
        expect_structure(p, params, what="the params place returns")
        expect_structure(b, batch, what="the batch place returns")
        for (name, leaf), (_, given) in zip(_leaves(p), _leaves(params)):
            name = f"params{name}"
            if not isinstance(leaf, jax.Array):
                raise Mismatch(f"{name} is still a {type(leaf).__name__} on the host: use jax.device_put.")
            if leaf.ndim == np.ndim(given) + 1 and leaf.shape[0] == n:
                raise Mismatch(f"{name} has shape {leaf.shape}: a stacked copy per device is the pmap way "
                               "(sharding.replicate). On a mesh the array keeps its own shape; its sharding alone "
                               "says that every device holds all of it (lesson 06, section 1).")
            if len(leaf.devices()) != n and isinstance(leaf.sharding, NamedSharding) and leaf.sharding.mesh.size > 1:
                raise Mismatch(f"{name} lives on a mesh of {len(leaf.devices())} devices, but the mesh you were given "
                               f"has {n}: build the NamedSharding on that mesh (the argument mesh), not on another "
                               "one.")
            if not leaf.sharding.is_fully_replicated or len(leaf.devices()) != n:
                raise Mismatch(f"{name} has sharding {_spec(leaf)} on {len(leaf.devices())} device(s); every one of "
                               f"the {n} devices needs the whole array.")
        for (name, leaf), (_, given) in zip(_leaves(b), _leaves(batch)):
            name = f"batch{name}"
            if not isinstance(leaf, jax.Array):
                raise Mismatch(f"{name} is still a {type(leaf).__name__} on the host: use jax.device_put.")
            if len(leaf.devices()) != n and isinstance(leaf.sharding, NamedSharding) and leaf.sharding.mesh.size > 1:
                raise Mismatch(f"{name} lives on a mesh of {len(leaf.devices())} devices, but the mesh you were given "
                               f"has {n}: build the NamedSharding on that mesh (the argument mesh), not on another "
                               "one.")
            if leaf.sharding.is_fully_replicated:
                raise Mismatch(f"{name} is replicated: every device holds the whole batch, where each "
                               "should hold only its own rows.")
            rows = np.shape(given)[0] // n
            blocks = {s.data.shape for s in leaf.addressable_shards}
            if blocks != {(rows,) + np.shape(given)[1:]}:
                raise Mismatch(f"{name} {where} is split into blocks of shape {sorted(blocks)}; expected axis 0 split "
                               f"over the {n} devices, blocks of {(rows,) + np.shape(given)[1:]}.")
        for (name, leaf), (_, given) in zip(_leaves((p, b)), _leaves((params, batch))):
            name = ("params" if name.startswith("[0]") else "batch") + name[3:]
            if np.dtype(leaf.dtype) != np.dtype(jnp.asarray(given).dtype):
                raise Mismatch(f"{name} came back as {np.dtype(leaf.dtype).name}; it came in as "
                               f"{np.dtype(given.dtype).name} (as {np.dtype(jnp.asarray(given).dtype).name} on the "
                               "devices). Placing an array should not change its dtype: no cast.")
            if np.dtype(leaf.dtype) == np.dtype(jnp.bfloat16):   # compared exactly, in a dtype NumPy checks
                leaf, given = np.asarray(leaf).astype(np.float32), np.asarray(given).astype(np.float32)
            expect_array(leaf, given, what=f"{name} (the values must not change)", rtol=0, atol=0)
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
    try:
        return jax.shard_map(stats, mesh=mesh, in_specs=P(AXIS), out_specs=tuple(specs))(x)
    except Exception as e:
        text = str(e).strip()
        if "can't be statically inferred" in text:
            label = "P()" if specs[0] == P() else f"{specs[0]} (it names no mesh axis: the same as P())"
            why = (f"check_vma rejects {label} for the per-device sums, which differ from device to device. Only "
                   "the psum total is known to be the same everywhere.")
        elif "marked as manual" in text or "not found in mesh" in text:
            why = f"it names a mesh axis that the mesh does not have: its only axis is {AXIS!r}."
        else:
            why = (f"shard_map raised {type(e).__name__}: {text.splitlines()[0][:200] if text else ''}. Each spec "
                   f"names, per axis of that output, the mesh axis it is split over: {AXIS!r} or nothing.")
        raise Mismatch(f"out_specs {tuple(specs)}: {why}") from None


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
