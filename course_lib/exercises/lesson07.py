"""Lesson 07 exercises: porting pmap code to shard_map, and a whole training step to a mesh."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from . import (Mismatch, as_array, call, describe_tree, exercise, expect_array, expect_scalar, expect_structure,
               primitives)
from .lesson06 import AXIS, _mesh, _spec


# ----------------------------------------------------------------------------------------------
# 07.1 Port a pmap function to shard_map


def pmap_version(x, w):
    """The lesson's pmap code: x (n, b, d) one block per device, w (d, k) broadcast -> (n, b, k)."""
    return jax.pmap(lambda xb, wb: jnp.tanh(xb @ wb), in_axes=(0, None))(x, w)


def solution_ported(x, w, mesh):
    def block(xb, wb):                 # xb: this device's rows (B // n, d); wb: all of w
        return jnp.tanh(xb @ wb)

    return jax.shard_map(block, mesh=mesh, in_specs=(P("i"), P()), out_specs=P("i"))(x, w)


def _call_ported(ported, x, w, mesh):
    return call(ported, x, w, mesh, name="ported", hints={
            "can't be statically inferred": "The output differs from device to device: an out_specs that names "
                                            "'i' stacks the blocks; P() would claim they are all the same.",
            "does not match the specs of the input": "in_specs must match how the inputs are placed: x split "
                                                     "over 'i', w whole on every device.",
            "marked as manual": "A spec names a mesh axis that this mesh does not have: its only axis is 'i'.",
            "not found in mesh": "A spec names a mesh axis that this mesh does not have: its only axis is 'i'.",
    })


@exercise("07.1", "Port a pmap function to shard_map", solution=solution_ported,
          returns="a jax.Array of shape (B, k), tanh(x @ w), split by rows over the mesh axis 'i' (P('i'))",
          hints=["Each entry of pmap's in_axes becomes an entry of in_specs: which argument is divided between "
                 "the devices, and which does every device need whole? How is the output laid out? No reshape to "
                 "(n, b, ...): shard_map works on the global shapes.",
                 "jax.shard_map with mesh, in_specs and out_specs; lesson 07's migration table, rows 1 and 2, "
                 "shows a split and a broadcast argument side by side with pmap.",
                 "In words: the per-device function is the pmap version's, unchanged. x's spec splits axis 0 over "
                 "'i'; w's spec splits nothing (it was in_axes=None); the output's spec splits axis 0 over 'i', "
                 "like x. Call the shard_mapped function on x and w and return its result."])
def check_ported(ported):
    rng = np.random.default_rng(6)
    for n, b, d, k in [(len(jax.devices()), 2, 3, 4), (4, 3, 2, 2)]:
        mesh = _mesh(n)
        x = jax.device_put(rng.normal(size=(n * b, d)).astype(np.float32), NamedSharding(mesh, P(AXIS)))
        w = jax.device_put(rng.normal(size=(d, k)).astype(np.float32), NamedSharding(mesh, P()))
        try:
            got = _call_ported(ported, x, w, mesh)
        except Mismatch as e:
            if "raised KeyError: 'i'" in str(e):
                raise Mismatch(f"ported(x {x.shape}, w {w.shape}) on {n} devices raised KeyError: 'i'. That is "
                               "what jax.pmap does with arrays already placed on a mesh with an Explicit axis, as "
                               "x and w are here. The port replaces pmap: the per-device function runs under "
                               "jax.shard_map on the given mesh, on the global x with no reshape (lesson 07, "
                               "migration table).") from None
            if "evenly divi" not in str(e):
                raise
            raise Mismatch(f"ported(x {x.shape}, w {w.shape}) on {n} devices raised ValueError: an array is split "
                           f"over 'i' along an axis that does not divide over the {n} devices. That is w, of shape "
                           f"{tuple(w.shape)}: w is broadcast in the pmap version (in_axes=None), so every device "
                           "needs all of it, and its in_specs entry should split nothing.") from None
        what = f"ported(x {x.shape}, w {w.shape}) on {n} devices"
        if hasattr(got, "dtype") and hasattr(got, "shape") and np.dtype(got.dtype) != np.float32:
            raise Mismatch(f"{what} is {np.dtype(got.dtype).name}; x and w are float32, and so is the pmap version's "
                           "result. Keep the dtype: no cast.")
        if hasattr(got, "shape") and tuple(got.shape) == (b, k):
            raise Mismatch(f"{what} has shape {tuple(got.shape)}, one device's block; expected ({n * b}, {k}). An "
                           "out_specs entry that names no axis returns a single block, as if all were the same "
                           "(with check_vma=False nothing checks that claim): name the axis the rows are split "
                           "over.")
        as_array(got, what=what, expected_shape=(n * b, k))
        expect_array(got, np.tanh(np.asarray(x) @ np.asarray(w)), what=what, rtol=1e-5)
        if not isinstance(got, jax.Array) or _spec(got) is None or tuple(_spec(got))[:1] != (AXIS,):
            raise Mismatch(f"{what} has sharding {_spec(got)}; expected the rows split over 'i', as the input "
                           "was: look at the output's spec.")
        eqns = primitives(lambda a, c: ported(a, c, mesh), x, w, name="ported")
        if not any(e.primitive.name == "shard_map" for e in eqns):
            raise Mismatch(f"{what} has the right values but does not use jax.shard_map.")
    return "the same program as the pmap version, written for a mesh, with no reshape to (n, b, ...)."


# ----------------------------------------------------------------------------------------------
# 07.2 Port lesson 05's whole training step (optax optimizer included) to a mesh


def mlp_loss(params, x, y):
    """A small classifier: x (B, 5) float32, y (B,) int32 class labels in 0..2 -> the mean cross entropy."""
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    logits = hidden @ params["w2"] + params["b2"]
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))


def pmap_train_step(loss_fn, optimizer, devices=None):
    """Lesson 05's data-parallel step: per-device gradients, pmean, the same optax update on every copy.

    Works on stacked copies: params and opt_state (n, ...), x (n, B // n, ...), y (n, B // n).
    """
    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        grads, loss = jax.lax.pmean((grads, loss), "i")
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.pmap(step, axis_name="i", devices=devices)


def solution_make_sharded_step(loss_fn, optimizer, mesh):
    # Sharded jit: the single-device step, unchanged. The batch arrives split over the mesh and the
    # parameters replicated; the compiler adds the all-reduce of the gradients (the mean over the
    # global batch needs no pmean). Run it inside `with jax.set_mesh(mesh):`.
    @jax.jit
    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def _tree_norm(tree) -> float:
    return float(np.sqrt(sum(np.sum(np.square(np.asarray(v, np.float64))) for v in jax.tree.leaves(tree)
                             if np.issubdtype(np.asarray(v).dtype, np.floating))))


def _moments(opt_state):
    """The first moments (mu) of an optax.adam state: the gradients the optimizer was fed, averaged."""
    return [s.mu for s in jax.tree.leaves(opt_state, is_leaf=lambda s: hasattr(s, "mu")) if hasattr(s, "mu")]


def _collectives(hlo: str) -> dict:
    names = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
    return {c: len(re.findall(rf" {c}(?:-start)?\(", hlo)) for c in names}


_STEPS = 3


def _wraps_one_jit(step, *args) -> bool:
    """Whether ``step`` (no ``.lower`` of its own) wraps jitted code: it only calls jitted functions, or it enters
    ``jax.set_mesh`` itself (which cannot be traced, so such a step is taken as a wrapper around its jitted step)."""
    try:
        eqns = jax.make_jaxpr(step)(*args).jaxpr.eqns
    except Exception as e:
        return "set_mesh` can only be used outside" in str(e)
    return bool(eqns) and all(e.primitive.name in ("pjit", "jit") for e in eqns)


@exercise("07.2", "Port lesson 05's training step, optimizer and all, to a mesh",
          solution=solution_make_sharded_step,
          returns="a function step(params, opt_state, x, y) -> (params, opt_state, loss) on global arrays: params "
                  "and opt_state replicated on the mesh, loss a scalar",
          hints=["Start from what one device would do with the whole global batch. Which line of the pmap step "
                 "exists only because each device saw a part of the batch?",
                 "Lesson 07, section 2 ('One training step, three ways'): sharded jit needs no collective in the "
                 "source; lesson 06, section 3 explains why a pmean added under shard_map gives gradients n times "
                 "too large. Section 2 also says where jax.set_mesh is needed.",
                 "In words: jit a function that takes the value and gradient of the loss on the global batch, "
                 "feeds the gradients to the optimizer's update, applies the updates and returns the new "
                 "parameters, the new optimizer state and the loss. Leave out the pmean: the compiler adds the "
                 "sum over devices itself."])
def check_make_sharded_step(make_sharded_step):
    rng = np.random.default_rng(7)
    for n in (len(jax.devices()), 4):
        mesh = _mesh(n)
        rows = 4 * n
        params0 = {"w1": rng.normal(size=(5, 8)).astype(np.float32) * 0.5, "b1": np.zeros(8, np.float32),
                   "w2": rng.normal(size=(8, 3)).astype(np.float32) * 0.5, "b2": np.zeros(3, np.float32)}
        batches = [(rng.normal(size=(rows, 5)).astype(np.float32), rng.integers(0, 3, size=rows).astype(np.int32))
                   for _ in range(_STEPS)]
        optimizer = optax.adam(0.05)

        # The reference: lesson 05's pmap step on stacked copies, built before the learner's code runs.
        devices = jax.devices()[:n]
        ref_step = pmap_train_step(mlp_loss, optimizer, devices=devices)
        stack = lambda tree: jax.tree.map(lambda v: np.broadcast_to(v, (n,) + np.shape(v)), tree)
        ref_params, ref_state = stack(params0), stack(optimizer.init(params0))
        ref = []
        for x, y in batches:
            ref_params, ref_state, ref_loss = ref_step(ref_params, ref_state, x.reshape(n, 4, 5), y.reshape(n, 4))
            ref.append((jax.tree.map(lambda v: np.asarray(v[0]), ref_params),
                        jax.tree.map(lambda v: np.asarray(v[0]), ref_state), float(ref_loss[0])))

        step = call(make_sharded_step, mlp_loss, optimizer, mesh, name="make_sharded_step")
        if not callable(step):
            raise Mismatch(f"make_sharded_step should return the step function; got {describe_tree(step)}.")
        replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P(AXIS))
        params = jax.device_put(params0, replicated)
        opt_state = jax.device_put(optimizer.init(params0), replicated)
        where = f"on a mesh of {n} devices"
        with jax.set_mesh(mesh):
            x, y = jax.device_put(batches[0], split)
            if not hasattr(step, "lower") and not _wraps_one_jit(step, params, opt_state, x, y):
                raise Mismatch(f"the step make_sharded_step returns is not jitted ({type(step).__name__}): outside "
                               "jit, JAX runs it one operation at a time, each its own dispatch. Wrap the step in "
                               "jax.jit, as lesson 07, section 2 does.")
            try:
                hlo = jax.jit(step).lower(params, opt_state, x, y).compile().as_text()
            except Exception:
                hlo = None  # the call below reports the learner's error
            for i, (x_np, y_np) in enumerate(batches):
                x, y = jax.device_put((x_np, y_np), split)
                out = call(step, params, opt_state, x, y, name="step", hints={
                    "should match the mesh passed to shard_map": "A shard_map (pmap is one too) was built on another "
                                                                 "mesh than the one the step runs under: the checker "
                                                                 "runs step inside jax.set_mesh on the mesh it gave "
                                                                 "make_sharded_step. Build on that mesh, and leave "
                                                                 "pmap out of the port.",
                    "not evenly divisible": f"Build nothing for a fixed device count: this mesh has {n} devices; "
                                            "use the mesh make_sharded_step was given.",
                    "can't be statically inferred": "Under shard_map, a P() output must be visibly the same on "
                                                    "every device (lesson 06, section 3).",
                    "unbound axis name": "A collective (pmean, psum) names a mesh axis, and only per-device code "
                                         "under shard_map has one. Under plain jit each value is a global one: "
                                         "the gradient of the loss on the global batch already is the mean over "
                                         "all rows, and the compiler adds the sum over the devices itself (lesson "
                                         "07, section 2).",
                    "too long to be compatible": "An out_specs entry splits an axis that its output does not have: "
                                                 "the loss is a scalar. Make it the same on every device and "
                                                 "return it once, like the state.",
                })
                if not isinstance(out, (tuple, list)) or len(out) != 3:
                    raise Mismatch(f"step should return a triple (params, opt_state, loss); step {i + 1} returned "
                                   f"{describe_tree(out)}.")
                new_params, new_state, loss = out
                expect_structure(new_params, params0, what=f"the params step {i + 1} returns")
                if jax.tree.structure(new_state) != jax.tree.structure(opt_state):
                    raise Mismatch(f"the opt_state step {i + 1} returns has the structure "
                                   f"{describe_tree(new_state)}; expected the optimizer's own state, as "
                                   "optimizer.update returns it.")
                for name, leaf in [*((f"params[{k!r}]", v) for k, v in new_params.items()),
                                   *((f"an opt_state leaf", v) for v in jax.tree.leaves(new_state))]:
                    if not isinstance(leaf, jax.Array):
                        raise Mismatch(f"{name} after step {i + 1} is a {type(leaf).__name__}: keep the state on the "
                                       "devices, as the step's jax.Array outputs.")
                    want = np.asarray(jax.tree.leaves(params0)[0]).dtype if name.startswith("params") else None
                    if want is not None and leaf.dtype != want:
                        raise Mismatch(f"{name} after step {i + 1} is {np.dtype(leaf.dtype).name}; the parameters "
                                       f"came in as {want.name}. Keep their dtype: no cast in the step.")
                    if len(leaf.devices()) != n or not leaf.sharding.is_fully_replicated:
                        stacked = name.startswith("params") and leaf.ndim and leaf.shape[0] == n and \
                            leaf.shape[1:] == np.shape(params0[name[8:-2]])
                        if stacked:
                            raise Mismatch(f"{name} after step {i + 1} has shape {leaf.shape}: stacked copies, one "
                                           "per device, are pmap's layout. On a mesh the parameters keep their own "
                                           "shape and are replicated.")
                        raise Mismatch(f"{name} after step {i + 1} {where} has sharding {_spec(leaf)} on "
                                       f"{len(leaf.devices())} device(s): the new state should be replicated on "
                                       f"all {n} devices of the mesh, as it came in, ready for the next step.")
                if hasattr(loss, "dtype") and np.dtype(loss.dtype) != np.float32:
                    raise Mismatch(f"the loss of step {i + 1} is {np.dtype(loss.dtype).name}; the parameters and the "
                                   "batch are float32, and so is the pmap step's loss. Compute in their dtype: no "
                                   "cast in the step.")
                loss = expect_scalar(loss, what=f"the loss of step {i + 1}")
                ref_params, ref_state, ref_loss = ref[i]
                mine, theirs = _moments(new_state), _moments(ref_state)
                ratio = _tree_norm(mine) / max(_tree_norm(theirs), 1e-30)
                if i == 0 and mine and abs(ratio - 1) > 1e-3:
                    for k, label in [(n, f"{n} times"), (n * n, f"{n * n} ({n} x {n}) times")]:
                        if abs(ratio / k - 1) < 1e-2:
                            raise Mismatch(
                                f"the gradients your step feeds the optimizer are {label} too large {where} (Adam's "
                                f"first moment after step 1 is {ratio:.3g} times the pmap step's). The losses "
                                "would barely show it: Adam's update divides by the gradient's own scale, so the "
                                "parameters move almost as they should. Under shard_map the gradient of a "
                                "replicated (P()) parameter comes back already summed over the devices (lesson 06, "
                                "section 3): "
                                "look at what your step does with that sum, and compare with the one-device "
                                "gradient.")
                    if ratio < 1e-6:
                        raise Mismatch(f"the optimizer state after step 1 {where} holds no gradient (Adam's first "
                                       "moment is zero): return the state that the optimizer's update gives back, "
                                       "not the one that came in.")
                    raise Mismatch(f"the gradients your step feeds the optimizer {where} differ from the pmap step's "
                                   f"(Adam's first moment after step 1 is {ratio:.3g} times the pmap step's): the "
                                   "step should use the gradient of the mean loss over the whole global batch.")
                if not np.isclose(loss, ref_loss, rtol=1e-4, atol=1e-6):
                    raise Mismatch(f"step {i + 1} {where} returned the loss {loss:.6f}; lesson 05's pmap step gives "
                                   f"{ref_loss:.6f} on the same batch. The loss should be the mean over the whole "
                                   "global batch, before the update.")
                for k in params0:
                    expect_array(new_params[k], ref_params[k], what=f"params[{k!r}] after step {i + 1} {where}",
                                 rtol=1e-4, atol=1e-5)
                for mine_leaf, ref_leaf in zip(jax.tree.leaves(new_state), jax.tree.leaves(ref_state)):
                    expect_array(mine_leaf, ref_leaf, what=f"the optimizer state after step {i + 1} {where}",
                                 rtol=1e-4, atol=1e-6)
                params, opt_state = new_params, new_state
        if hlo is not None:
            counts = _collectives(hlo)
            if counts["all-gather"]:
                raise Mismatch(f"the step's compiled program {where} has {counts['all-gather']} all-gather(s): it "
                               "gathers the batch (or the gradients) onto every device, so each device computes "
                               "on more than its own rows. Leave the batch split as it comes in.")
            if not counts["all-reduce"] and not counts["reduce-scatter"]:
                raise Mismatch(f"the step's compiled program {where} has no all-reduce: its devices never combine "
                               "their gradients, so it cannot be data parallel.")
    combined = (" and the gradients combined by an all-reduce in the compiled program" if hlo is not None else
                "; your step enters jax.set_mesh itself, so its compiled program could not be read from outside")
    return (f"the same losses, parameters and Adam state as lesson 05's pmap step for {_STEPS} steps, on "
            f"{len(jax.devices())} and on 4 devices, with the state replicated{combined}.")
