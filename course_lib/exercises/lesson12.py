"""Lesson 12 exercises: FSDP specs for a 2-D mesh, the FSDP layer gather, predicting an FSDP step's collectives.

Each checker builds its own small models and meshes (other shapes, device counts and values than the lesson's), runs
the learner's code there, and reads what the compiler made of it: the shardings and bytes of the state per device,
and the collectives in the compiled program (``compiled_collectives``, the method of the lesson's
``collectives_per_step``; its counts are the CPU compiler's).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from ..hlo import compiled_collectives, gather_axes
from . import (Case, Mismatch, Mistake, Said, _NotStarted, call, describe, describe_tree, diagnose, difference,
               exercise, returned_none)
from ._diagnose import _numbers
from .lesson06 import _leaves

AXIS = "data"

HINTS = {
    "12.1": ["FSDP here is a sharding of each array and nothing else. For every array: which of its axes can the "
             "'fsdp' axis divide evenly? And which mesh axis should no parameter be split over in hybrid sharding?",
             "Section 5, \"Hybrid FSDP on a 2-D mesh\" (HYBRID_SPECS), and for convolutions and biases Going "
             "further, \"Your own layers on an Explicit mesh\" (CNN_SPECS).",
             "What the checker reads: the bytes of state per device (every array that can be split over 'fsdp' is "
             "split) and the mesh axes that each all-gather of the compiled step runs over (only 'fsdp', the fast "
             "links). Walk the parameters with jax.tree.map and decide per array from its shape."],
    "12.2": ["Inside shard_map, each device holds a slice of every leaf. Which collective hands every device all the "
             "slices, in order, as one array?",
             "jax.lax.all_gather (lesson section 4's gather_layer uses it). Read its axis and tiled options: along "
             "which axis were these leaves split, and should the slices come back joined or stacked?",
             "The mechanism the checker reads: the leaves come back in the shape they had before sharding (compare, "
             "per leaf rank, the shape your gather returns with the whole leaf's), and the compiled step holds the "
             "gather's transpose, a reduce-scatter, so no stop on the gradient path."],
    "12.3": ["Count one layer first, then multiply: a scan over n_layers runs its body n_layers times. Which passes "
             "over a layer need its whole weights, and which of its arrays does each pass need?",
             "Section 4, \"Which arrays the backward gathers again\": its cell counts the all-gathers of each "
             "array of one layer (a bias inside and a bias at the end of the layer); and section 4's jax.checkpoint "
             "bullet.",
             "The mechanism: without jax.checkpoint, the backward pass reads what the forward pass saved; with it, "
             "the backward runs the layer's forward again, but only the operations that its gradients need. A "
             "gather's transpose, its gradient, is a reduce-scatter: which gathers does the step differentiate, and "
             "which does the backward pass only run? The loss is averaged over the devices."],
}


def _mesh(n: int):
    return jax.make_mesh((n,), (AXIS,), devices=jax.devices()[:n])


# ----------------------------------------------------------------------------------------------
# 12.1 FSDP specs for a 2-D mesh (hybrid sharding)

MESH_AXES = ("data", "fsdp")


def solution_fsdp_specs(params, mesh):
    size = mesh.shape["fsdp"]

    def spec(array):
        for axis, length in enumerate(array.shape):
            if length % size == 0:
                return P(*[None] * axis, "fsdp")
        return P()

    return jax.tree.map(spec, params)


def _cnn_shapes(c_in, c_out, hidden):
    return {"conv": {"w": (3, 3, c_in, c_out), "b": (c_out,)}, "dense": {"w": (c_out, hidden), "b": (hidden,)},
            "out": {"w": (hidden, 10), "b": (10,)}}


@functools.lru_cache(maxsize=None)
def _hybrid_cases():
    """(mesh shape, model shapes, optimizer): fsdp sizes 4, 2 and 8; leaves whose only divisible axis is not the
    first, leaves that no size divides, lengths that 4 divides but 8 does not, and a bias as long as 'fsdp' is wide."""
    n = len(jax.devices())
    cases = [((2, 4), _cnn_shapes(2, 4, 20), optax.adamw(0.01)),
             ((4, 2), _cnn_shapes(1, 6, 9), optax.sgd(0.1, momentum=0.9)),
             ((1, 8), _cnn_shapes(1, 12, 16), optax.adam(0.02))]
    return [c for c in cases if c[0][0] * c[0][1] <= n] or [((1, n), _cnn_shapes(1, 2 * n, 4 * n), optax.adam(0.02))]


def _cnn_params(shapes, seed):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda s: (rng.normal(size=s) / np.sqrt(np.prod(s[:-1]) or 1)).astype(np.float32), shapes,
                        is_leaf=lambda s: isinstance(s, tuple))


def _cnn_loss(p, x, y, gather=lambda w: w):
    h = jax.lax.conv_general_dilated(x, gather(p["conv"]["w"]), (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    h = jax.nn.relu(h + gather(p["conv"]["b"])).mean(axis=(1, 2))
    h = jax.nn.relu(h @ gather(p["dense"]["w"]) + gather(p["dense"]["b"]))
    logits = h @ gather(p["out"]["w"]) + gather(p["out"]["b"])
    return optax.softmax_cross_entropy(logits, jax.nn.one_hot(y, 10)).mean()


@functools.lru_cache(maxsize=None)
def _jitted_update(case: int, sharded: bool):
    """One jitted step per case (the checker's optimizer; gathered weights when sharded), reused across answers."""
    optimizer = _hybrid_cases()[case][2]
    gather = (lambda w: jax.reshard(w, P())) if sharded else (lambda w: w)

    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(_cnn_loss)(params, x, y, gather)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss
    return jax.jit(step, donate_argnums=(0, 1) if sharded else ())


def _kind(name, spec, shape, size) -> Said:
    """What a spec does to one array, in words: the same words for every right spec of that array."""
    leaf = f"params{name} {shape}"
    if not isinstance(spec, P):
        return Said(f"{leaf}: {spec!r:.60}, not a PartitionSpec (P from jax.sharding)")
    names = [a for entry in spec if entry is not None                 # the mesh axes named; an entry may name several
             for a in (entry if isinstance(entry, (tuple, list)) else [entry])]
    unknown = [a for a in names if a not in MESH_AXES]
    axis = next((i for i, entry in enumerate(spec) if entry is not None), None)
    divisible = [i for i, length in enumerate(shape) if length % size == 0]
    if unknown:
        return Said(f"{leaf}: {spec} names {unknown[0]!r}, not an axis of the mesh (its axes are {MESH_AXES})")
    if len(spec) > len(shape):
        return Said(f"{leaf}: {spec} has {len(spec)} entries; the array has only {len(shape)} axes")
    if "data" in names:
        return Said(f"{leaf}: split over 'data' ({spec}), gathered across the groups, on the slow links")
    if axis is None:
        return Said(f"{leaf}: whole" if not divisible else f"{leaf}: stays whole on every device, although its "
                    f"axis {divisible[0]} (length {shape[divisible[0]]}) splits over the {size} devices of 'fsdp'")
    if names.count("fsdp") > 1:
        return Said(f"{leaf}: {spec} names 'fsdp' for {names.count('fsdp')} of its axes; a mesh axis can split "
                    "only one axis of an array")
    if shape[axis] % size:
        return Said(f"{leaf}: {spec}, along axis {axis} of length {shape[axis]}, which the {size} devices of "
                    "'fsdp' do not divide")
    return Said(f"{leaf}: split over 'fsdp' along an axis it divides")


def _specs_runner(fn, case):
    """What each of ``fn``'s specs does, in words (the mesh axes named, the axis split, whether it divides)."""
    mesh_shape, shapes, _ = _hybrid_cases()[case.args[0]]
    mesh = jax.make_mesh(mesh_shape, MESH_AXES, devices=jax.devices()[:mesh_shape[0] * mesh_shape[1]])
    params = jax.tree.map(jnp.asarray, _cnn_params(shapes, 40 + case.args[0]))
    specs = call(fn, params, mesh, name="fsdp_specs", hints=_NESTED)
    if any(isinstance(s, NamedSharding) for s in jax.tree.leaves(specs)):
        raise Mismatch("fsdp_specs returned NamedShardings; return the PartitionSpecs themselves (the checker places "
                       "the arrays on its meshes with them).")
    if jax.tree.structure(specs, is_leaf=lambda s: isinstance(s, P)) != jax.tree.structure(params):
        raise Mismatch(f"fsdp_specs should return a dict shaped like params (one PartitionSpec per array, the same "
                       f"keys); got {describe_tree(specs)}.")
    named = [(name, leaf.shape) for name, leaf in _leaves(params)]
    kinds = [_kind(name, spec, shape, mesh.shape["fsdp"])
             for (name, shape), spec in zip(named, jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, P)))]
    axes = [k if any(w in k for w in ("'data'", "not a PartitionSpec", "not an axis")) else
            Said(f"params{name} {shape}: split over 'fsdp' only, or whole") for k, (name, shape) in zip(kinds, named)]
    return axes, kinds                  # the mesh axes first: an array split over 'data' is the main error


def _specs_as(axis_of, names=lambda mesh, a, i: "fsdp"):
    """fsdp_specs with one mistake: ``axis_of(mesh, array)`` picks the axis to split (None: whole)."""
    def fsdp_specs(params, mesh):
        def spec(a):
            i = axis_of(mesh, a)
            return P() if i is None else P(*[None] * i, names(mesh, a, i))
        return jax.tree.map(spec, params)
    return fsdp_specs


def _first(*sizes):     # the first axis that a size divides, the sizes tried in turn
    return lambda mesh, a: next((i for size in sizes for i, n in enumerate(a.shape) if n % size(mesh) == 0), None)


_HYBRID = ("In hybrid sharding each 'data' group holds a whole copy of the parameters, split only within the group "
           "over 'fsdp': an array split over 'data' is gathered across the groups, on the slow links.")
MISTAKES_12_1 = [
    Mistake("over data", "Every array is split over 'data' where it can be. " + _HYBRID,
            _specs_as(_first(lambda m: m.shape["data"]), lambda m, a, i: "data")),
    Mistake("over both axes", "That is plain FSDP over all the devices where it fits. " + _HYBRID, _specs_as(
        _first(lambda m: m.size, lambda m: m.shape["fsdp"]),
        lambda m, a, i: ("data", "fsdp") if a.shape[i] % m.size == 0 else "fsdp")),
    *[Mistake(name, f"Every array is split along its {which} axis, whatever its length. Choose, per array, an "
              "axis the mesh's 'fsdp' size divides (read the size from the mesh you are given).",
              _specs_as(lambda m, a, last=last: (a.ndim - 1 if last else 0) if a.ndim else None))
      for name, which, last in (("always axis 0", "first", False), ("always the last axis", "last", True))],
    Mistake("nothing split", "Every array stays whole on every device: that is data parallelism's memory. FSDP "
            "splits every array it can.", _specs_as(lambda m, a: None)),
]


_NESTED = {"'dict' object has no attribute": "The params given are a nested pytree, not a flat dict of arrays: "
           "params['conv'] is itself a dict, {'w': array, 'b': array}, so a loop over params.items() meets a dict "
           "where it expects an array. jax.tree.map(f, params) calls f on every array, however deep, and returns "
           "the same nesting."}


@exercise("12.1", "FSDP specs for a 2-D mesh: hybrid sharding, checked by running a step",
          solution=solution_fsdp_specs,
          returns="a dict like params of PartitionSpecs, split over 'fsdp' only")
def check_fsdp_specs(fsdp_specs):
    cases = [Case((i,), f"on a {m[0]} x {m[1]} mesh", n=m[0] * m[1])       # the widest 'fsdp' first: all 8
             for i, (m, _, _) in reversed(list(enumerate(_hybrid_cases())))]   # devices divide some axes
    diagnose(fsdp_specs, cases, solution=solution_fsdp_specs, mistakes=MISTAKES_12_1, run=_specs_runner,
             name="fsdp_specs")
    passed = []
    for case, (mesh_shape, shapes, optimizer) in enumerate(_hybrid_cases()):     # one step with the specs
        mesh = jax.make_mesh(mesh_shape, MESH_AXES, devices=jax.devices()[:mesh_shape[0] * mesh_shape[1]])
        host = _cnn_params(shapes, 40 + case)
        specs = fsdp_specs(jax.tree.map(jnp.asarray, host), mesh)
        rng = np.random.default_rng(50 + case)
        x = rng.normal(size=(4 * mesh.size, 4, 4, shapes["conv"]["w"][2])).astype(np.float32)
        y = rng.integers(0, 10, 4 * mesh.size).astype(np.int32)
        want = _jitted_update(case, False)(host, optimizer.init(host), x, y)
        with jax.set_mesh(mesh):
            params = jax.device_put(host, specs)
            args = (params, optimizer.init(params), *jax.device_put((x, y), P(MESH_AXES)))
            text = _jitted_update(case, True).lower(*args).compile().as_text()
            got = _jitted_update(case, True)(*args)
        diff = difference((got[2], got[0]), (want[2], want[0]), rtol=1e-4, atol=1e-5)
        if diff:
            raise Mismatch(f"on a {mesh_shape[0]} x {mesh_shape[1]} mesh: after one step with your specs, (loss, "
                           f"params) differ from the single-device step: {diff}.")
        axes = gather_axes(text)
        if axes - {"fsdp"}:
            raise Mismatch(f"on a {mesh_shape[0]} x {mesh_shape[1]} mesh: the compiled step gathers over "
                           f"{sorted(axes)}; the parameters should be gathered over 'fsdp' only.")
        state = sum(int(np.prod(a.sharding.shard_shape(a.shape))) * a.dtype.itemsize for a in jax.tree.leaves(params))
        passed.append(f"{mesh_shape[0]} x {mesh_shape[1]}: {state:,} B of parameters per device, gathers over "
                      f"{sorted(axes) or 'nothing'}")
    return ("every array that can be split over 'fsdp' is, none over 'data', and one step matches a single device "
            "on each mesh (" + "; ".join(passed) + ").")


# ----------------------------------------------------------------------------------------------
# 12.2 The FSDP layer gather

LAYERS, D = 3, 16
# Each leaf of a layer is split over 'data' along its last axis (the stacked arrays: one axis more in front).
SPECS = {"w_in": P(None, None, AXIS), "w_out": P(None, None, AXIS), "b": P(None, AXIS)}


def _stack_loss(params, x, target, gather):
    def one_layer(h, layer):
        p = gather(layer)
        return h + jnp.tanh(h @ p["w_in"]) @ p["w_out"] + p["b"], None

    h, _ = jax.lax.scan(jax.checkpoint(one_layer), x, params)
    return jnp.mean((h - target) ** 2)


def solution_gather_layer(layer):
    return jax.tree.map(lambda w: jax.lax.all_gather(w, "data", axis=w.ndim - 1, tiled=True), layer)


def _expect_whole(said, shape, came, axis) -> None:
    """Raise, saying what the shapes show, unless ``shape`` is that of ``came`` (a slice along ``axis``) whole."""
    n = jax.lax.axis_size(AXIS)
    whole = tuple(c * n if i == axis % len(came) else c for i, c in enumerate(came))
    if shape == whole:
        return
    stacked = len(shape) == len(whole) + 1 and np.prod(shape) == np.prod(whole)
    raise Mismatch(f"{said} with shape {shape}; the whole leaf is {whole}: " + (
        "the shape of this device's slice. Inside shard_map every leaf, vectors too, arrives as a slice, and only a "
        "collective that joins the slices makes it whole (a sharding change such as jax.reshard or device_put does "
        "not, there)." if shape == came else f"the {n} slices came back stacked along a new axis instead of joined. "
        "See jax.lax.all_gather's tiled option (lesson 10, section 3; lesson 12, section 4)." if stacked else
        f"join the slices along the {'first' if axis == 0 else 'last'} axis, the one that was split."))


def _fsdp_grads(gather, mesh, specs=SPECS):
    def checked(layer):
        try:
            out = call(gather, layer, name="gather_layer", hints={
                "unbound axis name": f"The mesh axis is named {AXIS!r}: use that name in the collective.",
                "cannot reshape": f"Your gather assumes a number of devices; this run has {jax.lax.axis_size(AXIS)}. "
                                  "Inside shard_map, jax.lax.axis_size gives it, or let the collective join the "
                                  "slices itself."})
        except _NotStarted:         # a placeholder: the words the lesson's stored output shows
            raise returned_none("gather_layer(layer)", gather, "the dict of whole leaves") from None
        if jax.tree.structure(out) != jax.tree.structure(layer):
            raise Mismatch(f"gather_layer(layer) should return a dict like the layer it was given (keys "
                           f"{sorted(layer)}); got {describe_tree(out)}.")
        for key in layer:
            said = f"gather_layer returned layer[{key!r}]"
            if not hasattr(out[key], "shape") or not hasattr(out[key], "dtype"):
                raise Mismatch(f"{said} as {describe(out[key])}, not an array: each leaf must come back as the "
                               "whole weight array.")
            _expect_whole(said, tuple(out[key].shape), tuple(layer[key].shape), -1)
            if np.dtype(out[key].dtype) != np.dtype(layer[key].dtype):
                raise Mismatch(f"{said} as {np.dtype(out[key].dtype).name}; it came in as "
                               f"{np.dtype(layer[key].dtype).name}. A gather moves the numbers as they are: cast "
                               "nothing (a lower precision belongs in the model's compute, not in the gather).")
        return out

    def per_device(params, x, target):
        loss, grads = jax.value_and_grad(_stack_loss)(params, x, target, checked)
        n = jax.lax.axis_size(AXIS)
        return jax.lax.pmean(loss, AXIS), jax.tree.map(lambda g: g / n, grads)

    return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(specs, P(AXIS), P(AXIS)),
                                 out_specs=(P(), specs)))


def _fsdp_inputs(mesh, seed):
    """The stacked layers (the same weights on every mesh) and a batch (x, target) drawn from ``seed``, on ``mesh``."""
    w, rng = np.random.default_rng(12), np.random.default_rng(seed)
    put = lambda v, spec: jax.device_put(v, NamedSharding(mesh, spec))
    return ({"w_in": put((w.normal(size=(LAYERS, D, 2 * D)) / 4).astype(np.float32), SPECS["w_in"]),
             "w_out": put((w.normal(size=(LAYERS, 2 * D, D)) / 6).astype(np.float32), SPECS["w_out"]),
             "b": put((w.normal(size=(LAYERS, D)) / 4).astype(np.float32), SPECS["b"])},
            *(put(rng.normal(size=(32, D)).astype(np.float32), P(AXIS)) for _ in range(2)))


def _gather_runner(fn, case):
    """(gradients, loss, what its compiled program holds) of the checker's FSDP step with ``fn`` as its gather."""
    f, args = _fsdp_grads(fn, _mesh(case.n)), _fsdp_inputs(_mesh(case.n), 200 + case.n)
    text = _or_none(lambda: f.lower(*args).compile().as_text())
    loss, grads = call(f, *args, name="the checker's FSDP step with your gather_layer")
    return grads, loss, _gather_and_transpose(text)    # the gradients first: a leaf gathered wrongly shows in its own


def _gather_and_transpose(text) -> Said:
    """Whether a compiled FSDP step holds an all-gather and its transpose, a reduce-scatter, in words."""
    found = compiled_collectives(text or "")
    holds = f"(it holds {', '.join(found) or 'no collectives'})"
    if "all-gather" not in found:
        return Said(f"a compiled program with no all-gather {holds}: the slices were combined another way, which "
                    "moves more data. FSDP gathers each layer's weights with an all-gather")
    if "reduce-scatter" not in found:
        return Said(f"a compiled program with no reduce-scatter {holds}: each device receives the whole summed "
                    "gradient and keeps a slice. A gather declared the same on every device (all_gather with "
                    "to=\"invarying\") has that transpose; a plain all_gather's is a reduce-scatter")
    runs, size = found.get("all-reduce", (1, 0))      # the loss's: one number per all-reduce
    other = [k for k in found if k not in ("all-gather", "reduce-scatter", "all-reduce")] + [
        "all-reduces of more than one number"][:size > 4 * runs]
    if other:
        return Said(f"a compiled program with {' and '.join(other)} {holds}: some slices were combined another way "
                    "than by an all-gather, which moves more data. FSDP gathers every leaf with an all-gather")
    return Said("a compiled program with all-gathers and their transposes, reduce-scatters")


MISTAKES_12_2 = [
    Mistake("slices reversed", "The slices were joined in reverse device order: the layers ran with other weights "
            "than the model's. Join them in device order along the axis that was split (the last one).",
            lambda layer: jax.tree.map(lambda w: jnp.concatenate(list(jax.lax.all_gather(w, AXIS)[::-1]), axis=-1),
                                       layer)),
    Mistake("gradient stopped", "No gradient reaches the slices: the gather's result was cut from the gradient path "
            "(stop_gradient), so its transpose, the reduce-scatter, never runs.",
            lambda layer: jax.tree.map(jax.lax.stop_gradient, solution_gather_layer(layer))),
]


@exercise("12.2", "Gather one layer's weights inside the scan (FSDP)", solution=solution_gather_layer,
          returns="a dict like `layer`, each leaf whole (its last axis n_devices times longer)")
def check_gather_layer(gather_layer):
    every = len(jax.devices())
    cases = [Case((), f"on {n} devices", n=n) for n in [every] + [k for k in (4, 2) if k < every]]
    diagnose(gather_layer, cases, solution=solution_gather_layer, mistakes=MISTAKES_12_2, run=_gather_runner,
             name="gather_layer", rtol=1e-4, atol=1e-6, names=("the gradient of params", "the loss"))
    return ("each layer is gathered whole inside the scan, the compiled step holds all-gathers and their transposes, "
            "reduce-scatters, and the loss and gradients match the unsharded model.")


# ----------------------------------------------------------------------------------------------
# 12.3 Predict the collectives of an FSDP step: biases inside and after the nonlinearity, with and without remat


def solution_predict(n_layers, matrices, inner_biases, outer_biases, remat):
    needed_again = matrices + inner_biases                 # what the recomputation reads
    arrays = needed_again + outer_biases
    gathers = n_layers * (arrays + (needed_again if remat else 0))
    return {"all-gather": gathers, "reduce-scatter": n_layers * arrays, "all-reduce": 1}


WIDTH = 16


def _bias_stack_text(n_layers, k, inner, outer, remat, n_devices):
    mesh = _mesh(n_devices)
    rng = np.random.default_rng(n_layers * 100 + k * 10 + inner)
    host = {f"w{i}": (rng.normal(size=(n_layers, WIDTH, WIDTH)) / 5).astype(np.float32) for i in range(k)}
    host |= {f"b{i}": (rng.normal(size=(n_layers, WIDTH)) / 5).astype(np.float32) for i in range(inner)}
    host |= {f"c{j}": (rng.normal(size=(n_layers, WIDTH)) / 5).astype(np.float32) for j in range(outer)}
    specs = {name: P(None, AXIS) for name in host}

    def one_layer(h, layer):
        layer = jax.tree.map(lambda w: jax.lax.all_gather(w, AXIS, axis=0, tiled=True), layer)
        for i in range(k):
            z = h @ layer[f"w{i}"]
            h = h + jnp.tanh(z + layer[f"b{i}"] if i < inner else z)
        for j in range(outer):
            h = h / 2 + layer[f"c{j}"]
        return h, None

    def loss(params, x):
        h, _ = jax.lax.scan(jax.checkpoint(one_layer) if remat else one_layer, x, params)
        return jnp.mean(h ** 2)

    def per_device(params, x):
        value, grads = jax.value_and_grad(loss)(params, x)
        n = jax.lax.axis_size(AXIS)
        return jax.tree.map(lambda p, g: p - 0.1 * g / n, params, grads), jax.lax.pmean(value, AXIS)

    step = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(specs, P(AXIS)), out_specs=(specs, P())))
    params = {name: jax.device_put(v, NamedSharding(mesh, specs[name])) for name, v in host.items()}
    x = jax.device_put(np.ones((4 * n_devices, WIDTH), np.float32), NamedSharding(mesh, P(AXIS)))
    return step.lower(params, x).compile().as_text()


@functools.lru_cache(maxsize=None)
def measured_collectives(n_layers, matrices, inner_biases, outer_biases, remat, n_devices=None) -> dict[str, int]:
    """How many of each collective one FSDP step (lesson 12, section 4 style, in shard_map) runs on this CPU
    backend, read from its compiled HLO."""
    text = _bias_stack_text(n_layers, matrices, inner_biases, outer_biases, remat, n_devices or len(jax.devices()))
    return {kind: count for kind, (count, _) in compiled_collectives(text).items()}


# 3 layers first (a count per layer differs), then biases after the nonlinearity, then no remat, then both.
_CASES = [(3, 1, 1, 0, True), (2, 2, 1, 1, True), (2, 1, 0, 2, True), (3, 2, 1, 1, False), (1, 3, 2, 1, True)]


_OPS = ("all-gather", "reduce-scatter", "all-reduce")
_SPELLINGS = {"psum": "all-reduce", "pmean": "all-reduce", "allreduce": "all-reduce", "psumscatter": "reduce-scatter",
              "reducescatter": "reduce-scatter", "allgather": "all-gather"}      # read without '_', '-' or spaces


def _read_counts(got, every=False) -> dict:
    """A predicted ``{collective: runs per step}`` as ``{op: int}`` for every op of ``_OPS`` (0 where not named; with
    ``every``, each must be named), in the compiled program's names (JAX's accepted: psum is an all-reduce). 10.5 and
    12.3 read predictions so."""
    if not isinstance(got, dict):
        raise Mismatch(f"the prediction is {describe_tree(got)}; expected a dict from a collective's name to how "
                       'many times one step runs it, e.g. {"all-gather": 1}.')
    counts, named = dict.fromkeys(_OPS, 0), set()
    for op, count in got.items():
        name = _SPELLINGS.get("".join(filter(str.isalnum, op.lower())), op) if isinstance(op, str) else op
        if name not in _OPS and _whole(count) == 0:       # none of a kind these programs lack: right
            continue
        if name not in _OPS:
            raise Mismatch(f"the prediction counts {op!r}; the counts asked for are of "
                           f"{', '.join(map(repr, _OPS))} (psum is an all-reduce, psum_scatter a reduce-scatter).")
        if _whole(count) is None or _whole(count) < 0:
            raise Mismatch(f"the prediction's [{op!r}] is {describe(count) if hasattr(count, 'shape') else repr(count)}"
                           "; expected a whole number of runs per step (an int, 0 or more; 3.0 is accepted too).")
        counts[name] += _whole(count)
        named.add(name)
    if every and named != set(_OPS):
        raise Mismatch(f"the prediction leaves out {', '.join(repr(op) for op in _OPS if op not in named)}: give a "
                       f"count for each of {', '.join(map(repr, _OPS))} (0 where you predict none).")
    return counts


def _or_none(thunk):
    """``thunk()``; None where it raises other than a ``Mismatch`` (what the learner's code returned, measured while
    tracing), since ``call()`` then reports that error with the inputs."""
    try:
        return thunk()
    except Mismatch:
        raise
    except Exception:  # noqa: BLE001: the learner's error, reported by call()
        return None


def _whole(value):
    """``value`` as an int when it is one whole number: a Python, NumPy or JAX scalar or 0-d array (3, 3.0,
    np.int64(3), jnp.float32(3)); otherwise None (a bool too: no number)."""
    a = _numbers(value)
    ok = a is not None and a.ndim == 0 and a.dtype != bool and np.isrealobj(a) and np.isfinite(a)
    return int(a) if ok and float(a).is_integer() else None


def _counts(gathers=None, scatters=None, reduces=None):
    """A prediction: the right counts, with the named kinds computed another way (n, k, inner, outer, remat)."""
    def predict(*case):
        right = solution_predict(*case)
        return {kind: f(*case) if f else right[kind] for kind, f in zip(_OPS, (gathers, scatters, reduces))}
    return predict


_SCATTERS = ("Reduce-scatters: in what form does a sharded array's gradient come back to each device, and how "
             "many gradients does one array of a layer get in a step?")
_REDUCES = "All-reduces: which values in the step are averaged over the devices, whole on each, and how often?"
_AGAIN = ("All-gathers, with jax.checkpoint: the backward pass runs the layer's forward again, but only the "
          "operations whose results the gradients need. Which arrays do those operations read? Section 4's cell "
          "counts the gathers of each array of one layer.")
MISTAKES_12_3 = [
    Mistake("one layer", "Those are one layer's collectives: the step runs the scan's body n_layers times in the "
            "forward pass and again in the backward, each time with its own collectives. Count per step, over all "
            "the layers.", lambda n, k, i, o, r: solution_predict(1, k, i, o, r)),
    Mistake("no re-gather", "All-gathers, with jax.checkpoint: it does not keep what the forward computed inside "
            "the layer, the gathered weights included. What must the backward pass do before it can use a layer's "
            "weights?", _counts(lambda n, k, i, o, r: n * (k + i + o))),
    Mistake("re-gather without remat", "All-gathers, without jax.checkpoint: what does the backward pass read "
            "there, what the forward pass saved or weights gathered anew?",
            _counts(lambda n, k, i, o, r: n * (2 * (k + i) + o))),
    Mistake("outer biases re-gathered", _AGAIN, _counts(lambda n, k, i, o, r: n * (2 if r else 1) * (k + i + o))),
    Mistake("inner biases not re-gathered", _AGAIN,
            _counts(lambda n, k, i, o, r: n * ((2 * k + i + o) if r else (k + i + o)))),
    Mistake("always re-gathered", "All-gathers: your counts are the same with and without jax.checkpoint. What "
            "does the backward pass read in each: what the forward pass saved, or what it computes again?",
            _counts(lambda n, k, i, o, r: 2 * n * (k + i + o))),
    Mistake("gradients all-reduced", "Reduce-scatters and all-reduces: each device keeps only its slice of a "
            "sharded array. Does its gradient come back whole on every device, or only as that slice?",
            _counts(scatters=lambda *c: 0, reduces=lambda n, k, i, o, r: n * (k + i + o) + 1)),
    Mistake("outer biases not scattered", _SCATTERS, _counts(scatters=lambda n, k, i, o, r: n * (k + i))),
    Mistake("a scatter per gather", _SCATTERS,
            _counts(scatters=lambda n, k, i, o, r: solution_predict(n, k, i, o, r)["all-gather"])),
    Mistake("a scatter per remat gather", _SCATTERS, _counts(scatters=lambda n, k, i, o, r: n * (2 * (k + i) + o))),
    Mistake("an all-reduce per layer", _REDUCES, _counts(reduces=lambda n, k, i, o, r: n)),
    Mistake("no all-reduce", _REDUCES, _counts(reduces=lambda n, k, i, o, r: 0)),
]


@exercise("12.3", "Predict an FSDP step's collectives, then read them from the compiled program",
          solution=solution_predict,
          returns="a dict {'all-gather': int, 'reduce-scatter': int, 'all-reduce': int}")
def check_predict(predict):
    label = "predict(n_layers={}, matrices={}, inner_biases={}, outer_biases={}, remat={})"
    diagnose(predict, [Case(c, label.format(*c)) for c in _CASES], mistakes=MISTAKES_12_3, reveal=False,
             run=lambda fn, case: _read_counts(call(fn, *case.args, name="predict"), every=True),
             solution=lambda *c: {kind: measured_collectives(*c).get(kind, 0) for kind in _OPS}, name="predict")
    return ("right in every case: the forward gathers every array of every layer; with jax.checkpoint the backward "
            "gathers again what the recomputation reads; each sharded array's gradient is reduce-scattered once per "
            "layer, and the loss's mean is the one all-reduce. (These are the CPU compiler's counts: a GPU merges "
            "each layer's arrays into fewer ops.)")
