"""Lesson 12 exercises: the data-parallel step on an Explicit mesh, the FSDP layer gather, predicting collectives.

Each checker builds its own small model and mesh (8 devices, then 4), runs the learner's code there, and reads
what the compiler made of it: the shardings of the results, whether the old state was donated, and the
collectives in the compiled program (``compiled_collectives``, the method of the lesson's
``collectives_per_step``).
"""

from __future__ import annotations

import collections
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from . import Mismatch, _NotStarted, call, describe, describe_tree, exercise

AXIS = "data"

HINTS = {
    "12.1": ["The step is the single-device training step you would write anyway: loss and gradients, the "
             "optimizer's update, the new parameters. Where do the shardings come from, if the step has no sharding "
             "code?",
             "Section 2 of the lesson, 'The step, jitted with donation': jax.value_and_grad, the optimizer's update "
             "method, optax.apply_updates, then jax.jit with donate_argnums for the first two arguments.",
             "In words: define step(params, opt_state, x, y) that computes the loss and gradients of loss_fn, asks "
             "the optimizer for updates and its new state, applies the updates, and returns the three; return the "
             "jitted step from make_dp_step, donating arguments 0 and 1."],
    "12.2": ["Inside shard_map, each device holds a slice of every leaf. Which collective hands every device all the "
             "slices, in order, as one array?",
             "jax.lax.all_gather (lesson section 4's gather_layer uses it). Read its axis and tiled options: along "
             "which axis were these leaves split, and should the slices come back joined or stacked?",
             "In words: for each leaf (jax.tree.map), all-gather it over the 'data' axis, tiled so the slices are "
             "joined rather than stacked, along the leaf's last axis (its index is 1 for a matrix slice, 0 for the "
             "vector); return the dict of whole leaves."],
    "12.3": ["Count for one layer and one weight array, then multiply: a scan over n_layers runs its body n_layers "
             "times. How many passes over the layers does one step make, and which collectives does each need?",
             "Lesson section 4, 'FSDP': the forward gathers each array once; jax.checkpoint drops the gathered "
             "weights, so the backward gathers them again; the transpose of each gather is one reduce-scatter; the "
             "loss's pmean is an all-reduce.",
             "In words: all-gathers twice the number of arrays times layers, reduce-scatters once that number, and "
             "a single all-reduce."],
}


# ----------------------------------------------------------------------------------------------
# Reading a compiled program

_COLLECTIVE = re.compile(r"= (.+?) (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\(")
_BYTES = {"f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2, "f64": 8, "s64": 8, "pred": 1, "s8": 1, "u8": 1}


def compiled_collectives(text: str) -> dict[str, tuple[int, int]]:
    """``{kind: (ops run per call, bytes of their results per device)}`` from compiled HLO text.

    A collective inside a ``while`` loop's body (a compiled ``lax.scan``) counts once per iteration, read from the
    loop's ``known_trip_count``. Example: ``compiled_collectives(jax.jit(f).lower(x).compile().as_text())``.
    """
    trips = {body: int(n) for body, n in
             re.findall(r'body=%?([\w.\-]+).*?"known_trip_count":\{"n":"(\d+)"\}', text)}
    found: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    runs = 1
    for line in text.splitlines():
        if line and not line.startswith(" "):
            name = re.match(r"(?:ENTRY )?%?([\w.\-]+)", line)
            runs = trips.get(name.group(1), 1) if name else 1
        hit = _COLLECTIVE.search(line)
        if hit:
            shapes = re.findall(r"(\w+)\[([\d,]*)\]", hit.group(1))
            nbytes = sum(_BYTES.get(t, 4) * int(np.prod([int(d) for d in dims.split(",") if d]))
                         for t, dims in shapes)
            found[hit.group(2)][0] += runs
            found[hit.group(2)][1] += runs * nbytes
    return {kind: (v[0], v[1]) for kind, v in sorted(found.items())}


def _no_paths(error) -> str:
    """An error's text without the file path some JAX errors name ('This error occurs at source: /path/...')."""
    return re.sub(r"\s*This error occurs at source:\s*\S+", "", str(error))


def _mesh(n: int):
    return jax.make_mesh((n,), (AXIS,), devices=jax.devices()[:n])


def _sizes() -> list[int]:
    n = len(jax.devices())
    return [n, 4] if n >= 8 else [n]


# ----------------------------------------------------------------------------------------------
# 12.1 The data-parallel step, sharded jit on an Explicit mesh

VOCAB, WIDTH, TOKENS = 7, 16, 4


def _toy_params(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"embed": rng.normal(size=(VOCAB, WIDTH)).astype(np.float32),
            "w": (rng.normal(size=(WIDTH, WIDTH)) / 4).astype(np.float32),
            "out": (rng.normal(size=(WIDTH, VOCAB)) / 4).astype(np.float32)}


def _toy_loss(params, x, y):
    """A one-layer model on token sequences: x, y int32 (B, 4) -> mean cross entropy."""
    h = params["embed"].at[x].get(out_sharding=jax.typeof(x).sharding)
    h = jnp.tanh(h @ params["w"])
    return optax.softmax_cross_entropy_with_integer_labels(h @ params["out"], y).mean()


def _toy_batch(seed: int, size: int = 64):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, VOCAB, size=(size, TOKENS)).astype(np.int32),
            rng.integers(0, VOCAB, size=(size, TOKENS)).astype(np.int32))


def solution_make_dp_step(loss_fn, optimizer):
    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1))


def _reference_step(optimizer, scale=1.0):
    def step(params, opt_state, x, y):             # the solution's step, without donation (scale: a wrong gradient)
        loss, grads = jax.value_and_grad(_toy_loss)(params, x, y)
        grads = jax.tree.map(lambda g: g * scale, grads)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def _leaf_names(tree) -> list[tuple[str, object]]:
    return [(jax.tree_util.keystr(path), leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _expect_replicated(tree, mesh, what: str) -> None:
    for name, leaf in _leaf_names(tree):
        if not isinstance(leaf, jax.Array):
            raise Mismatch(f"{what}{name} is {describe(leaf)}, not a jax.Array on the mesh: keep the state in JAX "
                           "(no NumPy conversion inside or after the step).")
        sharding = leaf.sharding
        if set(leaf.devices()) != set(mesh.devices.flat):
            raise Mismatch(f"{what}{name} lives on {len(leaf.devices())} device(s), but the mesh has "
                           f"{mesh.devices.size}: the step must follow its inputs' mesh, not build or name its own.")
        if not sharding.is_fully_replicated:
            spec = getattr(sharding, "spec", sharding)
            raise Mismatch(f"{what}{name} comes back split over the devices ({spec}); data parallelism keeps a whole "
                           "copy of the state on every device, as it came in: let jit follow the inputs' shardings "
                           "instead of resharding the state.")


@exercise("12.1", "The data-parallel step: sharded jit on an Explicit mesh, with donation",
          solution=solution_make_dp_step,
          returns="a jitted function step(params, opt_state, x, y) -> (params, opt_state, loss)")
def check_make_dp_step(make_dp_step):
    optimizer = optax.adam(0.05)
    for n in _sizes():
        mesh = _mesh(n)
        where = f"on {n} devices"
        step = call(make_dp_step, _toy_loss, optimizer, name="make_dp_step")
        if not callable(step):
            raise Mismatch(f"make_dp_step(loss_fn, optimizer) returned {describe_tree(step)}; expected the step "
                           "function itself (jitted), which the checker then calls.")
        if not hasattr(step, "lower"):
            raise Mismatch("make_dp_step returned a plain Python function, not a jitted one: without jit there is "
                           "no compiled program to donate buffers to, and nothing to read its collectives from. "
                           "Return the result of jax.jit itself, not a function that calls it.")
        x, y = _toy_batch(100 + n)                          # a held-out batch: not one the learner has seen
        with jax.set_mesh(mesh):
            reference = jax.jit(_reference_step(optimizer))
            ref_params = jax.device_put(_toy_params(), P())
            ref_opt = optimizer.init(ref_params)
            xs, ys = jax.device_put(x, P(AXIS)), jax.device_put(y, P(AXIS))
            ref_params, ref_opt = reference(ref_params, ref_opt, xs, ys)[:2]     # one step in, so Adam has state
            want_params, want_opt, want_loss = reference(ref_params, ref_opt, xs, ys)
            params = jax.device_put(_toy_params(), P())
            opt_state = optimizer.init(params)
            params, opt_state = reference(params, opt_state, xs, ys)[:2]
            try:
                text = step.lower(params, opt_state, xs, ys).compile().as_text()
            except Exception:
                text = None                                  # the call below reports the error with its inputs
            try:
                got = call(step, params, opt_state, xs, ys, name="step", hints={
                    "unbound axis name": "Sharded jit has no named axes inside the step: there the compiler "
                                         "inserts the collectives itself. pmean and psum belong in shard_map.",
                    "Array has been deleted": "The step read an array that an earlier donation deleted.",
                    "incompatible devices": "The step names a mesh or devices of its own: let it follow its inputs, "
                                            "whatever mesh they are on.",
                    "should match the mesh": "The step sets a mesh of its own, which is not the mesh its inputs are "
                                             "on: let it follow its inputs (the caller sets the mesh).",
                    "does not match the sharding on the respective arg": "The step pins its inputs' shardings "
                        "(jit's in_shardings) to something other than what they came in with: the state replicated, "
                        "the batch split over 'data'. Let jit follow its inputs' shardings.",
                })
            except _NotStarted:
                raise
            except Mismatch as e:
                raise Mismatch(f"{where}: {_no_paths(e)}") from None
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            raise Mismatch(f"step(params, opt_state, x, y) returned {describe_tree(got)}; expected a tuple of three: "
                           "the new parameters, the new optimizer state, the loss.")
        new_params, new_opt, loss = got
        if jax.tree.structure(new_params) != jax.tree.structure(want_params):
            raise Mismatch(f"the first result should be the new parameters, structured like the input "
                           f"{describe_tree(want_params)}; got {describe_tree(new_params)}.")
        if jax.tree.structure(new_opt) != jax.tree.structure(want_opt):
            raise Mismatch(f"the second result should be the optimizer's new state, structured like "
                           f"optimizer.init(params); got {describe_tree(new_opt)}.")
        loss_dtype = getattr(loss, "dtype", None)
        if loss_dtype is not None and np.dtype(loss_dtype) != np.float32:
            raise Mismatch(f"the loss comes back as {np.dtype(loss_dtype).name}; the model computes it in float32: "
                           "return it as the gradient function gives it, without a cast.")
        try:
            got_loss = float(np.asarray(loss))
        except Exception:
            raise Mismatch(f"the third result should be the loss, one number; got {describe_tree(loss)}.") from None
        if not np.isclose(got_loss, float(want_loss), rtol=1e-5, atol=1e-6):
            raise Mismatch(f"{where}, on a held-out batch: loss {got_loss:.6f}, expected {float(want_loss):.6f}. "
                           "Return the loss of the parameters the step was given (before the update).")
        for name, leaf in _leaf_names(new_params):
            if np.dtype(leaf.dtype) != np.float32:
                raise Mismatch(f"the new parameters{name} are {np.dtype(leaf.dtype).name}; they came in as float32 "
                               "and should stay float32.")
        before = {name: np.asarray(leaf) for name, leaf in _leaf_names(ref_params)}
        for (name, leaf), (_, want) in zip(_leaf_names(new_params), _leaf_names(want_params)):
            value = np.asarray(leaf)
            if np.allclose(value, before[name], rtol=0, atol=0):
                raise Mismatch(f"{where}: the parameters{name} did not change. Apply the optimizer's updates to the "
                               "parameters (optax.apply_updates) and return the result.")
            if np.allclose(2 * before[name] - value, np.asarray(want), rtol=1e-4, atol=1e-6):
                raise Mismatch(f"{where}: the parameters{name} moved the wrong way. optax's updates already carry "
                               "the minus sign: add them to the parameters, do not subtract them.")
            if not np.allclose(value, np.asarray(want), rtol=1e-4, atol=1e-6):
                for how, scale in ((f"{n} times too large", n), (f"{n} times too small", 1 / n)):
                    with jax.set_mesh(mesh):                 # what a gradient scaled by n would have given
                        wrong = jax.jit(_reference_step(optimizer, scale))(ref_params, ref_opt, xs, ys)[0]
                    if all(np.allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6) for a, b in
                           zip(jax.tree.leaves(new_params), jax.tree.leaves(wrong))):
                        raise Mismatch(
                            f"{where}: the new parameters are one Adam step with a gradient {how}: each device's "
                            f"gradient was summed or averaged once too often, or not enough. In shard_map, a P() "
                            f"parameter's gradient already arrives summed over the devices, so a pmean or psum on "
                            f"top of it leaves it {n} times too large (lesson section 3, 'The same step with "
                            f"jax.shard_map'). Sharded jit needs no collective at all. Adam hides most of this in "
                            f"the loss curve; the parameters show it.")
                raise Mismatch(f"{where}: the new parameters{name} differ from one Adam step on this batch (largest "
                               f"difference {np.abs(value - np.asarray(want)).max():.2e}). Use the gradients of "
                               "loss_fn at the given parameters, and the optimizer you were given.")
        for (name, leaf), (_, want) in zip(_leaf_names(new_opt), _leaf_names(want_opt)):
            if not np.allclose(np.asarray(leaf), np.asarray(want), rtol=1e-4, atol=1e-6):
                raise Mismatch(f"{where}: the optimizer state{name} is not the one the optimizer's update returned. "
                               "Return the new state from the update, not the one passed in.")
        _expect_replicated(new_params, mesh, "the new parameters")
        _expect_replicated(new_opt, mesh, "the new optimizer state")
        kept = [name for name, leaf in _leaf_names(params) + _leaf_names(opt_state) if not leaf.is_deleted()]
        if kept:
            raise Mismatch(f"{where}: after the step, the old state ({', '.join(kept[:3])}) still exists: the step "
                           "does not donate it, so it holds two copies of the state while it runs. Tell jax.jit "
                           "which arguments it may reuse.")
        if text is None:
            raise Mismatch("the checker could not compile your step with .lower(...).compile().")
        found = compiled_collectives(text)
        if "all-gather" in found:
            raise Mismatch(f"{where}: the compiled step holds {found['all-gather'][0]} all-gather(s): something "
                           "was gathered to every device, most likely the batch (every device then computes the "
                           "whole batch, and there is nothing left to sum). Keep the batch as it came in, split "
                           "over 'data'.")
        if "all-reduce" not in found:
            raise Mismatch(f"{where}: the compiled step has no all-reduce, so the devices' gradients are never "
                           "summed. Compute the gradient of the loss over the whole (sharded) batch inside the "
                           "jitted step.")
    reduced = ", ".join(f"{k}: {v[0]}" for k, v in found.items())
    return (f"loss, parameters and Adam state match on {' and '.join(map(str, _sizes()))} devices; the state stays "
            f"replicated and is donated; the compiled step's collectives ({reduced}) sum the gradients and the "
            "loss, and nothing else.")


# ----------------------------------------------------------------------------------------------
# 12.2 The FSDP layer gather

LAYERS, D = 3, 16
# Each leaf of a layer is split over 'data' along its last axis (the stacked arrays: one axis more in front).
SPECS = {"w_in": P(None, None, AXIS), "w_out": P(None, None, AXIS), "b": P(None, AXIS)}


def _layer_params(seed: int = 12) -> dict:
    rng = np.random.default_rng(seed)
    return {"w_in": (rng.normal(size=(LAYERS, D, 2 * D)) / 4).astype(np.float32),
            "w_out": (rng.normal(size=(LAYERS, 2 * D, D)) / 6).astype(np.float32),
            "b": (rng.normal(size=(LAYERS, D)) / 4).astype(np.float32)}


def _layer(h, p):
    return h + jnp.tanh(h @ p["w_in"]) @ p["w_out"] + p["b"]


def _stack_loss(params, x, target, gather):
    def one_layer(h, layer):
        return _layer(h, gather(layer)), None

    h, _ = jax.lax.scan(jax.checkpoint(one_layer), x, params)
    return jnp.mean((h - target) ** 2)


def solution_gather_layer(layer):
    return jax.tree.map(lambda w: jax.lax.all_gather(w, "data", axis=w.ndim - 1, tiled=True), layer)


class _Bad(Exception):
    """The learner's gather returned something the layer cannot use (raised while tracing)."""


def _fsdp_grads(gather, mesh, specs=SPECS):
    def checked(layer):
        given = dict(layer)                             # the slices as they came in, kept from an in-place edit
        out = gather(layer)
        if out is None:
            raise _NotStarted("gather_layer(layer) returned None: write the function's body, and `return` the dict "
                              "of whole leaves.")
        if not isinstance(layer, dict) or set(layer) != set(given) or any(layer[k] is not given[k] for k in given):
            raise _Bad("gather_layer changed the dict it was given in place: leave `layer` as it came and build "
                       "a new dict of whole leaves to return (the caller, or another transformation, may still "
                       "read the slices).")
        layer = given
        if jax.tree.structure(out) != jax.tree.structure(layer):
            raise _Bad(f"gather_layer(layer) should return a dict like the layer it was given (keys "
                       f"{sorted(layer)}); got {describe_tree(out)}.")
        for key in layer:
            if not hasattr(out[key], "shape") or not hasattr(out[key], "dtype"):
                raise _Bad(f"gather_layer returned layer[{key!r}] as {describe(out[key])}, not an array: each "
                           "leaf must come back as the whole weight array.")
            whole = tuple(layer[key].shape[:-1]) + (layer[key].shape[-1] * jax.lax.axis_size(AXIS),)
            if tuple(out[key].shape) == tuple(layer[key].shape):
                raise _Bad(f"gather_layer returned layer[{key!r}] with the shape of this device's slice, "
                           f"{tuple(layer[key].shape)}: it is still split over the devices. Each leaf must come "
                           f"back whole, {whole}.")
            if np.dtype(out[key].dtype) != np.dtype(layer[key].dtype):
                raise _Bad(f"gather_layer returned layer[{key!r}] as {np.dtype(out[key].dtype).name}; it came in as "
                           f"{np.dtype(layer[key].dtype).name}. A gather moves the numbers as they are: cast "
                           "nothing (a lower precision belongs in the model's compute, not in the gather).")
            size = int(np.prod(whole))
            if len(out[key].shape) == len(whole) + 1 and int(np.prod(out[key].shape)) == size:
                raise _Bad(f"gather_layer returned layer[{key!r}] with shape {tuple(out[key].shape)}: the "
                           f"{jax.lax.axis_size(AXIS)} slices came back stacked along a new axis instead of joined "
                           f"into the whole leaf {whole}. See all_gather's tiled option (hint 2, and lesson section "
                           "4).")
            if tuple(out[key].shape) != whole:
                raise _Bad(f"gather_layer returned layer[{key!r}] with shape {tuple(out[key].shape)}; the whole leaf "
                           f"is {whole} (the slices are joined along the last axis, the one that was split).")
        return out

    def per_device(params, x, target):
        loss, grads = jax.value_and_grad(_stack_loss)(params, x, target, checked)
        n = jax.lax.axis_size(AXIS)
        return jax.lax.pmean(loss, AXIS), jax.tree.map(lambda g: g / n, grads)

    return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(specs, P(AXIS), P(AXIS)),
                                 out_specs=(P(), specs)))


def _fsdp_inputs(mesh, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(32, D)).astype(np.float32)
    target = rng.normal(size=(32, D)).astype(np.float32)
    host = _layer_params()
    params = {k: jax.device_put(v, NamedSharding(mesh, SPECS[k])) for k, v in host.items()}
    return host, params, jax.device_put(x, NamedSharding(mesh, P(AXIS))), \
        jax.device_put(target, NamedSharding(mesh, P(AXIS))), x, target


@exercise("12.2", "Gather one layer's weights inside the scan (FSDP)", solution=solution_gather_layer,
          returns="a dict like `layer`, each leaf whole (its last axis n_devices times longer)")
def check_gather_layer(gather_layer):
    if not callable(gather_layer):
        raise Mismatch(f"expected a function gather_layer(layer); got {describe_tree(gather_layer)}.")
    for n in _sizes():
        mesh = _mesh(n)
        where = f"on {n} devices"
        host, params, xs, ts, x, target = _fsdp_inputs(mesh, 200 + n)
        want_loss, want_grads = jax.jit(jax.value_and_grad(_stack_loss), static_argnums=3)(
            host, x, target, lambda layer: layer)
        f = _fsdp_grads(gather_layer, mesh)
        try:
            text = f.lower(params, xs, ts).compile().as_text()
        except _NotStarted:
            raise
        except _Bad as e:
            raise Mismatch(f"{where}: {_no_paths(e)}") from None
        except Exception:
            text = None
        try:
            got = call(f, params, xs, ts, name="the checker's FSDP step with your gather_layer", hints={
                "unbound axis name": f"The mesh axis is named {AXIS!r}: use that name in the collective.",
                "cannot reshape": f"Your gather assumes a number of devices; this run has {n}. Inside shard_map, "
                                  "jax.lax.axis_size gives it, or let the collective join the slices itself.",
            })
        except _NotStarted:
            raise
        except Mismatch as e:
            raise Mismatch(f"{where}: {_no_paths(e)}") from None
        loss, grads = got
        if not np.isclose(float(loss), float(want_loss), rtol=1e-5, atol=1e-6):
            raise Mismatch(f"{where}: the loss is {float(loss):.6f}, expected {float(want_loss):.6f}: the layers ran "
                           "with the wrong weights. The slices must be joined in device order along the axis that "
                           "was split (the last one), so that each leaf comes back exactly as it was before "
                           "sharding.")
        for key in host:
            g = np.asarray(grads[key])
            if np.allclose(g, 0):
                raise Mismatch(f"{where}: the gradient of {key!r} is zero: no gradient flows back through your "
                               "gather. Use the collective itself, without stopping its gradient.")
            if not np.allclose(g, np.asarray(want_grads[key]), rtol=1e-4, atol=1e-6):
                raise Mismatch(f"{where}: the loss is right but the gradient of {key!r} is not (largest difference "
                               f"{np.abs(g - np.asarray(want_grads[key])).max():.2e}).")
        found = compiled_collectives(text or "")
        if "all-gather" not in found:
            raise Mismatch(f"{where}: loss and gradients are right, but the compiled program has no all-gather "
                           f"(it holds {', '.join(found) or 'no collectives'}): the slices were combined another "
                           "way, which moves more data. FSDP gathers each layer's weights with an all-gather.")
        if "reduce-scatter" not in found:
            raise Mismatch(f"{where}: the compiled program has no reduce-scatter: each device receives the whole "
                           "gradient and keeps a slice. With the gather written as an all-gather, its gradient is a "
                           "reduce-scatter by itself.")
    gathers, scatters = found["all-gather"][0], found["reduce-scatter"][0]
    return (f"each layer is gathered whole inside the scan; on {n} devices the compiled step runs {gathers} "
            f"all-gathers (forward, and again in the checkpointed backward for the weights it needs) and {scatters} "
            "reduce-scatters per step, "
            "and the loss and gradients match the unsharded model.")


# ----------------------------------------------------------------------------------------------
# 12.3 Predict the collectives of an FSDP step


def solution_predict(n_layers, arrays_per_layer):
    per_pass = n_layers * arrays_per_layer
    return {"all-gather": 2 * per_pass, "reduce-scatter": per_pass, "all-reduce": 1}


def _square_stack(n_layers, k, mesh, seed=0):
    rng = np.random.default_rng(seed)
    host = {f"w{i}": (rng.normal(size=(n_layers, D, D)) / 5).astype(np.float32) for i in range(k)}
    specs = {name: P(None, AXIS) for name in host}

    def gather(layer):
        return jax.tree.map(lambda w: jax.lax.all_gather(w, AXIS, axis=0, tiled=True), layer)

    def loss(params, x):
        def one_layer(h, layer):
            layer = gather(layer)
            for i in range(k):
                h = h + jnp.tanh(h @ layer[f"w{i}"])
            return h, None

        h, _ = jax.lax.scan(jax.checkpoint(one_layer), x, params)
        return jnp.mean(h ** 2)

    def per_device(params, x):
        value, grads = jax.value_and_grad(loss)(params, x)
        n = jax.lax.axis_size(AXIS)
        new = jax.tree.map(lambda p, g: p - 0.1 * g / n, params, grads)
        return new, jax.lax.pmean(value, AXIS)

    step = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(specs, P(AXIS)), out_specs=(specs, P())))
    params = {k_: jax.device_put(v, NamedSharding(mesh, specs[k_])) for k_, v in host.items()}
    x = jax.device_put(np.ones((8 * mesh.devices.size, D), np.float32), NamedSharding(mesh, P(AXIS)))
    return step.lower(params, x).compile().as_text()


def measured_collectives(n_layers, arrays_per_layer, n_devices=None) -> dict[str, int]:
    """How many of each collective one FSDP step (lesson 12, section 4 style) runs, read from its compiled HLO."""
    mesh = _mesh(n_devices or len(jax.devices()))
    found = compiled_collectives(_square_stack(n_layers, arrays_per_layer, mesh))
    return {kind: count for kind, (count, _) in found.items()}


_CASES = [(3, 1), (2, 3), (1, 2)]    # 3 layers first: a count per layer and a missing backward gather differ


def _whole(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    if isinstance(value, jax.Array) and value.shape == () and jnp.issubdtype(value.dtype, jnp.integer):
        return int(value)
    return None


@exercise("12.3", "Predict an FSDP step's collectives, then read them from the compiled program",
          solution=solution_predict,
          returns="a dict {'all-gather': int, 'reduce-scatter': int, 'all-reduce': int}")
def check_predict(predict):
    kinds = ("all-gather", "reduce-scatter", "all-reduce")
    for n_layers, k in _CASES:
        got = call(predict, n_layers, k, name="predict")
        shown = f"predict(n_layers={n_layers}, arrays_per_layer={k})"
        if not isinstance(got, dict) or set(got) != set(kinds):
            raise Mismatch(f"{shown} should return a dict with exactly the keys {list(kinds)}; got "
                           f"{got!r:.200}.")
        numbers = {}
        for kind in kinds:
            number = _whole(got[kind])
            if number is None:
                raise Mismatch(f"{shown}[{kind!r}] is {describe(got[kind]) if hasattr(got[kind], 'shape') else repr(got[kind])}; "
                               "expected a whole number of operations (an int).")
            numbers[kind] = number
        measured = measured_collectives(n_layers, k)
        measured = {kind: measured.get(kind, 0) for kind in kinds}
        if numbers == measured:
            continue
        lines = [f"{shown}: you predicted {numbers}; the compiled step runs {measured}."]
        ag, rs, ar = numbers["all-gather"], numbers["reduce-scatter"], numbers["all-reduce"]
        if n_layers > 1 and (ag * n_layers, rs * n_layers) == (measured["all-gather"], measured["reduce-scatter"]):
            lines.append(f"Those are one layer's collectives: the step runs the scan's body {n_layers} times in the "
                         "forward pass and again in the backward, each time with its own collectives. Count per "
                         "step, over all the layers.")
            raise Mismatch(" ".join(lines))
        if ag * 2 == measured["all-gather"]:
            lines.append("Half the all-gathers: the forward pass gathers each layer's arrays, and jax.checkpoint "
                         "does not keep what the forward computed inside the layer. What must the backward pass "
                         "do before it can use a layer's weights?")
        elif ag != measured["all-gather"]:
            lines.append("All-gathers: one per weight array per layer per pass over the layers; count the passes.")
        if rs != measured["reduce-scatter"]:
            lines.append("Reduce-scatters: each gathered array's gradient comes back to its slices once, in the "
                         "backward pass (the transpose of an all-gather).")
        if ar != measured["all-reduce"]:
            lines.append("All-reduces: the sharded weights' gradients are reduce-scattered, not all-reduced; what "
                         "else in the step is averaged over the devices?")
        raise Mismatch(" ".join(lines))
    return ("right for every size: forward and checkpointed backward each gather every array of every layer, each "
            "gradient is reduce-scattered once, and the loss's mean is the one all-reduce.")
