"""Lesson 10 exercises: bytes per device for each ZeRO stage, the ZeRO update with psum_scatter, choosing K,
writing the FSDP step, and predicting the collectives of each stage before the compiled program shows them."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from . import Mismatch, _NotStarted, call, describe, describe_tree, exercise, expect_array

AXIS = "data"

# Graded hints, one at a time: a nudge toward the idea, then the API or the lesson section, then the steps in words.
HINTS = {
    "10.1": ["Start from the replicated form: how many bytes per parameter do the parameters, the gradients and "
             "Adam's state take in float32? Then ask, stage by stage, which of the three is split over the devices.",
             "Section 1 and the table of section 3: ZeRO-1 splits one of the three, ZeRO-2 two, FSDP all three.",
             "In words: 4, 4 and 8 bytes per parameter; divide the optimizer state by the device count from zero1 "
             "on, the gradient accumulator from zero2 on, and the parameters for fsdp only."],
    "10.2": ["Each device needs only its own slice of the summed gradient, never the whole sum. Which collective "
             "hands each device just its slice?",
             "jax.lax.psum_scatter (tiled), jax.lax.axis_index with jax.lax.dynamic_slice_in_dim, and "
             "jax.lax.all_gather (tiled): section 2's step.",
             "In words: reduce-scatter the gradient and divide by the device count; cut this device's slice out of "
             "the parameters; update that slice; gather the updated slices into the whole vector."],
    "10.3": ["Activation memory grows with the micro-batch, B // K examples, and every micro-batch has the same size.",
             "Section 4: K must divide the per-device batch; try the candidates from the smallest up.",
             "In words: for K from 1 to the per-device batch, return the first K that divides it and whose "
             "micro-batch fits the budget; None when none does."],
    "10.4": ["FSDP keeps only a slice of the parameters on each device: the whole vector exists only while the loss "
             "is computed. Where must the gather happen so that jax.grad turns it into the reduce-scatter?",
             "Section 3, the hand-written FSDP step: jax.lax.all_gather (tiled) inside the function you "
             "differentiate; its transpose is jax.lax.psum_scatter, a sum, not a mean.",
             "In words: a loss of the slice that gathers the whole vector and calls loss_fn; value_and_grad of it "
             "with respect to the slice; divide the gradient by the device count; the optimizer's update of the "
             "slice; apply it; average the loss over the mesh axis."],
    "10.5": ["Ask, per stage, what each device must receive: the whole summed gradient, or only its slice? And "
             "does it hold whole parameters, or must it gather them (how many times per step)?",
             "Section 2 (ZeRO's step), section 3 (FSDP and its backward pass) and the remat policy there.",
             "In words: data parallelism sums the whole gradient everywhere; ZeRO-1 and ZeRO-2 hand each device its "
             "slice and gather the updated parameters; FSDP gathers for the forward and again for the backward "
             "and hands each device its slice of the gradient."],
}

_OPS = ("all-reduce", "reduce-scatter", "all-gather")
_SPELLINGS = {"psum": "all-reduce", "pmean": "all-reduce", "all_reduce": "all-reduce", "allreduce": "all-reduce",
              "psum_scatter": "reduce-scatter", "reduce_scatter": "reduce-scatter", "reducescatter": "reduce-scatter",
              "all_gather": "all-gather", "allgather": "all-gather"}


def _big_collectives(hlo_text, min_bytes):
    """The collectives of a compiled program whose buffers hold at least ``min_bytes`` (not the loss's scalar)."""
    from .. import sharded_state
    return [c for c in sharded_state.collectives(hlo_text) if c.payload >= min_bytes]


def _listed(found) -> str:
    return ", ".join(f"{c.op} {c.described}" for c in found) or "none"


def _float_dtype_problem(value, what) -> str | None:
    """A message naming a dtype other than float32 (a learner's cast to bfloat16/float16), or None."""
    dtype = getattr(value, "dtype", None)
    if dtype is not None and np.dtype(dtype) != np.float32:
        return (f"{what} is {np.dtype(dtype).name}, but the parameters and gradients are float32: somewhere a value "
                f"was cast to {np.dtype(dtype).name}. Keep the update in float32 (section 5 casts only for the "
                "forward and backward pass).")
    return None


def _low_precision(jaxpr) -> set:
    """Names of the half-precision float dtypes any value of ``jaxpr`` (and the jaxprs inside it) has."""
    found = set()
    for eqn in jaxpr.eqns:
        for v in list(eqn.outvars) + list(eqn.invars):
            dtype = getattr(getattr(v, "aval", None), "dtype", None)
            if dtype is not None and dtype in (jnp.bfloat16, jnp.float16):
                found.add(np.dtype(dtype).name)
        for value in eqn.params.values():
            for inner in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    found |= _low_precision(inner)
    return found


def _expect_close(got, want, what, traced, *args):
    """``expect_array``, and when the values differ, name a half-precision dtype the answer computed in."""
    try:
        expect_array(got, want, what=what, rtol=1e-4, atol=1e-5)
    except Mismatch as e:
        try:
            low = _low_precision(jax.make_jaxpr(traced)(*args).jaxpr)
        except Exception:
            low = set()
        if low:
            raise Mismatch(f"{e} Your code computes in {' and '.join(sorted(low))}: with 8 bits of mantissa "
                           "(bfloat16) or 11 (float16) the result is no longer float32's. Keep this exercise in "
                           "float32.") from None
        raise


def _vma_hints():
    return {
        "unbound axis name": f"The mesh axis is named {AXIS!r}: use that name in every collective.",
        "must be divisible": "A tiled psum_scatter splits the vector into n equal slices.",
        "out_specs": "An output declared the same on every device (P()) differs between devices: average it "
                     "over the mesh axis (the loss), or gather it (the parameters).",
        "vma": "The vma checker (check_vma=True) found a value that differs between devices where one that is the "
               "same on every device is needed (or the reverse): lesson 06 and section 2 of this lesson.",
    }


# ----------------------------------------------------------------------------------------------
# 10.1 Bytes per device for each stage


def solution_zero_bytes(n_params, n_devices, stage):
    params, grads, opt_state = 4 * n_params, 4 * n_params, 2 * 4 * n_params    # float32, Adam's two moments
    # grads: the gradient accumulator a device keeps across the micro-batches of a step
    if stage in ("zero1", "zero2", "fsdp"):
        opt_state /= n_devices
    if stage in ("zero2", "fsdp"):
        grads /= n_devices
    if stage == "fsdp":
        params /= n_devices
    return {"params": params, "grads": grads, "opt_state": opt_state}


@exercise("10.1", "Bytes per device for each ZeRO stage, from the formula", solution=solution_zero_bytes)
def check_zero_bytes(zero_bytes):
    sharded_by = {"replicated": set(), "zero1": {"opt_state"}, "zero2": {"opt_state", "grads"},
                  "fsdp": {"opt_state", "grads", "params"}}
    for n_params, n in [(1_000_000_000, 8), (19_210, 4)]:
        full = {"params": 4 * n_params, "grads": 4 * n_params, "opt_state": 8 * n_params}
        for stage, split in sharded_by.items():
            got = call(zero_bytes, n_params, n, stage, name="zero_bytes")
            if not isinstance(got, dict) or set(got) != set(full):
                raise Mismatch(f"zero_bytes({n_params:_}, {n}, {stage!r}) should return a dict with the keys "
                               f"'params', 'grads', 'opt_state'; got {got!r:.200}.")
            for part, whole in full.items():
                want = whole / n if part in split else whole
                if isinstance(got[part], (str, bytes, bool)) or not np.isscalar(got[part]) and np.ndim(got[part]):
                    raise Mismatch(f"zero_bytes(...)[{part!r}] should be a number of bytes (an int or a float), "
                                   f"got {describe(got[part])}.")
                try:
                    value = float(got[part])
                except (TypeError, ValueError):
                    raise Mismatch(f"zero_bytes(...)[{part!r}] should be a number of bytes, got "
                                   f"{type(got[part]).__name__}.") from None
                if np.isclose(value, want, rtol=1e-9):
                    continue
                if part == "opt_state" and np.isclose(value * 2, want, rtol=1e-9):
                    raise Mismatch(f"{stage}: the optimizer state is half what it should be. Adam keeps two float32 "
                                   "numbers per parameter (its first and second moments): 8 bytes, not 4.")
                if np.isclose(value, whole / n, rtol=1e-9):
                    why = (" ZeRO-1 reduce-scatters too, but with gradient accumulation it adds whole local "
                           "gradients over the micro-batches and reduce-scatters once: its accumulator is whole "
                           "(section 4)." if stage == "zero1" and part == "grads" else "")
                    raise Mismatch(f"{stage} on {n} devices: {part} comes back divided by {n}, but this stage keeps "
                                   f"the whole {part} on every device. It shards only "
                                   f"{', '.join(sorted(split)) or 'nothing'}.{why}")
                if np.isclose(value, whole, rtol=1e-9):
                    raise Mismatch(f"{stage} on {n} devices: {part} is the whole {part}, but this stage splits it "
                                   "over the devices.")
                raise Mismatch(f"zero_bytes({n_params:_}, {n}, {stage!r})[{part!r}] is {value:,.0f} bytes: neither "
                               f"the whole {part} nor 1/{n} of it. Count the bytes per parameter of each part "
                               "(section 1).")
    return ("replicated 16 bytes per parameter per device; zero1 cuts Adam's 8, zero2 also the gradient "
            "accumulator's 4, fsdp also the parameters' 4: 16 / n in the end. Section 3 compares it with the "
            "compiled programs.")


# ----------------------------------------------------------------------------------------------
# 10.2 The ZeRO update (stages 1 and 2 in one step), written with psum_scatter


def solution_zero2_sgd(params, grads, lr):
    n = jax.lax.axis_size("data")
    size = params.shape[0] // n
    mine = jax.lax.psum_scatter(grads, "data", tiled=True) / n                    # mean gradient of my slice
    start = jax.lax.axis_index("data") * size
    my_params = jax.lax.dynamic_slice_in_dim(params, start, size)                  # my slice of the parameters
    return jax.lax.all_gather(my_params - lr * mine, "data", tiled=True)          # everyone gets every slice


class _NoResult(Exception):
    """The learner's function returned None inside the mapped program."""


@exercise("10.2", "The ZeRO update: psum_scatter, update your slice, all_gather", solution=solution_zero2_sgd,
          returns="the whole updated parameter vector, float32 (P,), on every device")
def check_zero2_sgd(zero2_sgd):
    rng = np.random.default_rng(10)
    for n, size, lr in [(len(jax.devices()), 3, 0.1), (4, 5, 0.5)]:
        mesh = Mesh(np.array(jax.devices()[:n]), (AXIS,))
        params = rng.normal(size=n * size).astype(np.float32)
        local = rng.normal(size=(n, n * size)).astype(np.float32)       # device i's own gradient: local[i]
        grads = jax.device_put(local.reshape(-1), NamedSharding(mesh, P(AXIS)))
        whole = jax.device_put(params, NamedSharding(mesh, P()))

        def body(p, g):
            out = zero2_sgd(p, g, lr)
            if out is None:
                raise _NoResult
            return jnp.asarray(out)[None]

        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P(AXIS)), out_specs=P(AXIS), check_vma=True))
        what = f"zero2_sgd on {n} devices, {n * size} parameters"
        try:
            jax.eval_shape(f, whole, grads)
        except _NoResult:
            raise _NotStarted("zero2_sgd(params, grads, lr) returned None: write the function's body, and `return` "
                              "its result.") from None
        except Exception:
            pass                  # reported with the inputs by call() below
        try:
            out = call(f, whole, grads, name="zero2_sgd", hints=_vma_hints())
        except Mismatch as e:
            raise Mismatch(f"On {n} devices, {n * size} parameters: {e}") from None
        problem = _float_dtype_problem(out, f"{what}: the result")
        if problem:
            raise Mismatch(problem)
        out = np.asarray(out)
        expected = params - lr * local.mean(axis=0)
        if out.ndim == 3 and out.shape[1:] == (n, size):
            raise Mismatch(f"{what}: each device returned shape {out.shape[1:]}, the {n} slices stacked on a new "
                           f"axis; expected the whole vector, ({n * size},). An all_gather that is not tiled stacks "
                           "what it gathers; a tiled one joins the slices end to end (lesson 04, section 2).")
        if out.ndim != 2 or out.shape[0] != n:
            raise Mismatch(f"{what}: each device returned shape {out.shape[1:]}; expected the whole vector, "
                           f"({n * size},), one per device.")
        if out.shape[1] == size:
            raise Mismatch(f"{what}: every device returned only its slice, shape ({size},). The forward pass of the "
                           "next step needs all the parameters: gather the updated slices.")
        if out.shape[1] != n * size:
            raise Mismatch(f"{what}: each device returned shape {out.shape[1:]}; expected the whole vector, "
                           f"({n * size},).")
        if np.allclose(out[0], params - lr * local.sum(axis=0), rtol=1e-4, atol=1e-5):
            raise Mismatch(f"{what}: the step is {n} times too large. psum_scatter adds the devices' gradients; "
                           "the update needs their mean.")
        if np.allclose(out[0], params - lr * local[0], rtol=1e-4, atol=1e-5):
            raise Mismatch(f"{what}: device 0 applied only its own gradient: the devices' gradients were never "
                           "summed.")
        if (np.allclose(out[0][:size], expected[:size], rtol=1e-4, atol=1e-5)
                and not np.allclose(out[0], expected, rtol=1e-4, atol=1e-5)
                and np.allclose(out[0].reshape(n, size), np.tile(params[:size], (n, 1)) - lr
                                * local.mean(axis=0).reshape(n, size), rtol=1e-4, atol=1e-5)):
            raise Mismatch(f"{what}: only the first slice is right: every device updated the parameters "
                           f"[0, {size}) with its own slice of the gradient. Device i owns the numbers from "
                           f"i * {size}: cut its slice of the parameters where its index says (section 2).")
        for i in range(n):
            _expect_close(out[i], expected, f"{what}: the parameters on device {i}", f, whole, grads)
        # The mechanism, read from the compiled program: XLA removes a collective whose result is unused, so a
        # psum_scatter whose result was thrown away (the update made from a pmean) leaves no reduce-scatter.
        found = _big_collectives(f.lower(whole, grads).compile().as_text(), 4 * n * size)
        ops = [c.op for c in found]
        if "reduce-scatter" not in ops:
            raise Mismatch(f"{what}: the values are right, but the compiled program has no reduce-scatter of the "
                           f"gradient (its gradient-sized collectives: {_listed(found)}). Each device received the "
                           "whole reduced gradient (an all-reduce: pmean or psum) and kept a slice, or computed a "
                           "psum_scatter and then did not use its result. ZeRO sends each device only the slice it "
                           "owns: the update must be made from the scattered slice (section 2).")
        if "all-reduce" in ops:
            raise Mismatch(f"{what}: the values are right, but the compiled program still all-reduces a "
                           f"gradient-sized buffer ({_listed(found)}) besides the reduce-scatter: twice the "
                           "traffic. Use only the slice the reduce-scatter gives.")
        if "all-gather" not in ops:
            raise Mismatch(f"{what}: the values are right, but the compiled program has no all-gather "
                           f"({_listed(found)}): rebuild the whole vector from the updated slices, not from the "
                           "whole gradient.")
    return ("each device receives 1/n of the reduced gradient (reduce-scatter), updates only its slice, and an "
            "all-gather hands every device every slice: the same traffic as data parallelism's all-reduce.")


# ----------------------------------------------------------------------------------------------
# 10.3 Choosing K for a memory budget


def solution_choose_k(per_device_batch, bytes_per_example, budget):
    for k in range(1, per_device_batch + 1):
        if per_device_batch % k == 0 and (per_device_batch // k) * bytes_per_example <= budget:
            return k
    return None


@exercise("10.3", "Choose the number of micro-batches for a memory budget", solution=solution_choose_k)
def check_choose_k(choose_k):
    cases = [(64, 1_000, 64_000, 1), (64, 1_000, 20_000, 4), (48, 3_000, 40_000, 4), (60, 1_000, 25_000, 3),
             (12, 1_000, 5_000, 3), (56, 1_000, 11_000, 7), (7, 10_000, 9_999, None), (64, 2**20, 9 * 2**20, 8)]
    for b, per_example, budget, want in cases:
        got = call(choose_k, b, per_example, budget, name="choose_k") if want is not None else None
        if want is None:
            try:
                got = choose_k(b, per_example, budget)
            except Exception as e:
                raise Mismatch(f"choose_k({b}, {per_example}, {budget}) raised {type(e).__name__}: even one "
                               "example per micro-batch does not fit; return None instead.") from None
        shown = f"choose_k(per_device_batch={b}, bytes_per_example={per_example:_}, budget={budget:_})"
        whole = isinstance(got, (int, np.integer)) and not isinstance(got, bool)
        if (got is None or whole) and got == want:
            continue
        if want is None:
            raise Mismatch(f"{shown} returned {describe(got) if hasattr(got, 'shape') else repr(got)}: not even "
                           f"one example per micro-batch fits ({per_example:_} > {budget:_} bytes); return None.")
        if not whole:
            raise Mismatch(f"{shown} returned {describe(got) if hasattr(got, 'shape') else repr(got)}; expected a "
                           "whole number of micro-batches, a Python int.")
        if got < 1:
            raise Mismatch(f"{shown} returned {got}: K counts micro-batches, a whole number >= 1 (K = 1 is the whole "
                           f"per-device batch at once). The smallest K that divides {b} and fits is {want}.")
        if b % got:
            raise Mismatch(f"{shown} returned {got}, which does not divide the batch of {b}: the micro-batches "
                           "must all have the same size (B // K).")
        if (b // got) * per_example > budget:
            raise Mismatch(f"{shown} returned {got}: micro-batches of {b // got} examples need "
                           f"{(b // got) * per_example:_} bytes, over the budget.")
        raise Mismatch(f"{shown} returned {got}; a smaller K that divides the batch fits too. Every extra "
                       "micro-batch is one more trip through the model with less work in it: take the smallest K "
                       "that fits.")
    return "the smallest K that divides the batch and fits: as few passes as the memory allows."


# ----------------------------------------------------------------------------------------------
# 10.4 Write the FSDP step


def solution_fsdp_step(loss_fn, optimizer):
    def step(my_params, opt_state, batch):
        n = jax.lax.axis_size("data")

        def sliced_loss(p):
            return loss_fn(jax.lax.all_gather(p, "data", tiled=True), batch)    # the whole vector, for the loss

        loss, grads = jax.value_and_grad(sliced_loss)(my_params)             # grads: my slice, summed
        updates, opt_state = optimizer.update(grads / n, opt_state, my_params)
        return optax.apply_updates(my_params, updates), opt_state, jax.lax.pmean(loss, "data")

    return step


def _toy_problem(n_params, seed):
    """A linear softmax model on a flat parameter vector ``(n_params,)``: ``loss_fn(flat, batch)``."""
    d_in, d_out = 6, 3
    used = d_in * d_out + d_out                     # 21 numbers used; the rest is padding, as in the lesson

    def loss_fn(flat, batch):
        w = flat[:d_in * d_out].reshape(d_in, d_out)
        b = flat[d_in * d_out:used]
        logits = batch["x"] @ w + b
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(batch["y"], d_out), axis=-1))

    rng = np.random.default_rng(seed)
    flat = np.zeros(n_params, np.float32)
    flat[:used] = rng.normal(size=used) * 0.5
    data = [{"x": rng.normal(size=(32, d_in)).astype(np.float32), "y": rng.integers(0, d_out, 32).astype(np.int32)}
            for _ in range(3)]
    return loss_fn, flat, data


def _reference(loss_fn, optimizer, flat, data):
    params, opt_state, losses = jnp.asarray(flat), optimizer.init(jnp.asarray(flat)), []
    for batch in data:
        loss, g = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(g, opt_state, params)
        params = optax.apply_updates(params, updates)
        losses.append(float(loss))
    return np.asarray(params), losses


_NEEDS_WHOLE = ("loss_fn needs the whole parameter vector; each device holds only its slice. Gather it inside the "
                "function you differentiate.")


def _gradient_all_reduces(found, slice_bytes):
    """The all-reduces of ``found`` that carry more than a scalar and a slice: a reduced gradient, whole or most of it
    (XLA may drop the padding the loss never reads, so this is not required to be parameter-sized)."""
    def non_scalar_bytes(c):
        from .. import sharded_state
        return sum(sharded_state._BYTES.get(dt, 4) * int(np.prod(shape)) for dt, shape in
                   (c.operands or ((c.dtype, c.shape),)) if shape)
    return [c for c in found if c.op == "all-reduce" and non_scalar_bytes(c) > slice_bytes]


@exercise("10.4", "Write the FSDP step: gather for the loss, reduce-scatter the gradient, update your slice",
          solution=solution_fsdp_step,
          returns="a function step(my_params, opt_state, batch) -> (new my_params, new opt_state, mean loss)")
def check_fsdp_step(make_fsdp_step):
    n_params = 24                                                      # divides by 8 and by 4
    for n, (opt_name, optimizer) in [(len(jax.devices()), ("optax.sgd(0.5)", optax.sgd(0.5))),
                                     (len(jax.devices()), ("optax.adam(0.05)", optax.adam(0.05))),
                                     (4, ("optax.sgd(0.5)", optax.sgd(0.5)))]:
        loss_fn, flat, data = _toy_problem(n_params, seed=n)
        want_params, want_losses = _reference(loss_fn, optimizer, flat, data)
        step = call(make_fsdp_step, loss_fn, optimizer, name="make_fsdp_step")
        if not callable(step):
            raise Mismatch(f"make_fsdp_step(loss_fn, optimizer) returned {describe_tree(step)}; expected the step "
                           "function, step(my_params, opt_state, batch), that runs on each device.")
        mesh = Mesh(np.array(jax.devices()[:n]), (AXIS,))
        opt_state = optimizer.init(jnp.asarray(flat))
        opt_specs = jax.tree.map(lambda a: P(AXIS) if np.ndim(a) else P(), opt_state)
        put = lambda tree, specs: jax.device_put(tree, jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                                                                    is_leaf=lambda s: isinstance(s, P)))
        my_params, opt_state = put(jnp.asarray(flat), P(AXIS)), put(opt_state, opt_specs)
        what = f"your FSDP step on {n} devices with {opt_name}, {n_params} parameters ({n_params // n} per device)"

        def body(p, o, b):
            out = step(p, o, b)
            if out is None:
                raise _NoResult
            if not isinstance(out, (tuple, list)) or len(out) != 3:
                raise Mismatch(f"{what}: step returned {describe_tree(out)}; expected three things: the new slice "
                               "of the parameters, the new optimizer state and the loss.")
            return tuple(out)

        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(AXIS), opt_specs, P(AXIS)),
                                  out_specs=(P(AXIS), opt_specs, P()), check_vma=True))
        batch = put(data[0], P(AXIS))
        try:
            shapes = jax.eval_shape(f, my_params, opt_state, batch)
        except _NoResult:
            raise _NotStarted("step(my_params, opt_state, batch) returned None: write the function's body, and "
                              "`return` the new slice, the new optimizer state and the loss.") from None
        except Mismatch:
            raise
        except Exception:
            shapes = None         # reported with the inputs by call() below
        if shapes is not None and shapes[0].shape != (n_params,):
            raise Mismatch(f"{what}: each device returned parameters of shape "
                           f"{(shapes[0].shape[0] // n,)}; FSDP keeps only this device's slice, "
                           f"({n_params // n},), between steps: return the updated slice, not the gathered vector.")
        losses, got = [], None
        p, o = my_params, opt_state
        for b in data:
            try:
                p, o, loss = call(f, p, o, put(b, P(AXIS)), name="step", hints={
                    **_vma_hints(), "dot_general requires contracting dimensions": _NEEDS_WHOLE,
                    "cannot reshape array": _NEEDS_WHOLE})
            except Mismatch as e:
                raise Mismatch(f"On {n} devices with {opt_name}: {e}") from None
            losses.append(float(np.asarray(loss)))
        problem = _float_dtype_problem(p, f"{what}: the new parameters")
        if problem:
            raise Mismatch(problem)
        got = np.asarray(p)
        every = _big_collectives(f.lower(my_params, opt_state, batch).compile().as_text(), 1)
        reduced = _gradient_all_reduces(every, 4 * n_params // n) + [c for c in every if c.op == "reduce-scatter"]
        if not reduced and not np.allclose(got, want_params, rtol=1e-4, atol=1e-5):
            raise Mismatch(f"{what}: the parameters differ from data parallelism's, and the compiled program sums no "
                           f"gradient over the devices ({_listed(every)}): each device updated its slice with the "
                           "gradient of its own examples only. The gradient of the slice must be summed over the "
                           "devices, which the transpose of a gather inside the differentiated loss does (section 3).")
        if opt_name.startswith("optax.sgd"):
            summed, _ = _reference(loss_fn, optax.sgd(0.5 * n), flat, data)
            if np.allclose(got, summed, rtol=1e-4, atol=1e-5):
                raise Mismatch(f"{what}: the steps are {n} times too large. The gradient of the slice arrives summed "
                               "over the devices (the transpose of a gather is a reduce-scatter, a sum): the update "
                               "needs the mean. With Adam this bug hardly shows, which is why the checker uses SGD "
                               "too.")
        if not np.allclose(losses, want_losses, rtol=1e-5, atol=1e-6):
            _expect_close(np.asarray(losses), np.asarray(want_losses), f"{what}: the losses", f, my_params,
                          opt_state, batch)
            raise Mismatch(f"{what}: the losses {np.round(losses, 5).tolist()} differ from data parallelism's "
                           f"{np.round(want_losses, 5).tolist()}. The loss must be the mean over every device's "
                           "examples.")
        _expect_close(got, want_params, f"{what}: the parameters after 3 steps, gathered", f, my_params,
                      opt_state, batch)
        found = _big_collectives(f.lower(my_params, opt_state, batch).compile().as_text(), 4 * n_params)
        ops = [c.op for c in found]
        if "all-gather" not in ops:
            raise Mismatch(f"{what}: the values are right, but the compiled program gathers no parameters "
                           f"({_listed(found)}).")
        all_reduces = _gradient_all_reduces(every, 4 * n_params // n)
        if all_reduces:
            raise Mismatch(f"{what}: the values are right, but the compiled program all-reduces the gradient "
                           f"({_listed(all_reduces)}): each device received the whole summed gradient and threw "
                           "most of it away. FSDP hands each device only its slice of the sum: let jax.grad "
                           "transpose the gather, or scatter the sum yourself (section 3). A gather whose result is "
                           "declared the same on every device (invarying) does this too: jax.grad then sums its "
                           "gradient everywhere before each device keeps its slice.")
        if not any(c.op == "reduce-scatter" for c in _big_collectives(
                f.lower(my_params, opt_state, batch).compile().as_text(), 4 * n_params // n)):
            raise Mismatch(f"{what}: the values are right, but the compiled program has no reduce-scatter of the "
                           f"gradient ({_listed(found)}).")
    return ("the parameters stay sharded between steps; the gather inside the loss makes jax.grad return the "
            "reduce-scattered (summed) slice, divided by n for the mean; the same training as data parallelism.")


# ----------------------------------------------------------------------------------------------
# 10.5 Predict the collectives of each stage, then read them from the compiled program


def solution_predict_collectives(stage):
    # collectives on parameter-sized buffers in one step, no accumulation (the loss's scalar left out)
    return {"replicated": {"all-reduce": 1},
            "zero1": {"reduce-scatter": 1, "all-gather": 1},
            "zero2": {"reduce-scatter": 1, "all-gather": 1},
            "fsdp": {"all-gather": 2, "reduce-scatter": 1}}[stage]


_COMPILED_COUNTS: dict = {}


def _compiled_counts():
    """``{stage: ({op: count}, [Collective])}`` for sharded_state's steps of a small MLP on every device."""
    if not _COMPILED_COUNTS:
        from .. import sharded_state
        k1, k2 = jax.random.split(jax.random.key(0))
        params = [{"w": jax.random.normal(k1, (12, 24)), "b": jnp.zeros(24)},
                  {"w": jax.random.normal(k2, (24, 5)), "b": jnp.zeros(5)}]

        def loss_fn(p, batch):
            h = jnp.tanh(batch["x"] @ p[0]["w"] + p[0]["b"])
            logits = h @ p[1]["w"] + p[1]["b"]
            return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(batch["y"], 5), axis=-1))

        n = len(jax.devices())
        batch = {"x": np.zeros((8 * n, 12), np.float32), "y": np.zeros(8 * n, np.int32)}
        optimizer = optax.adam(1e-3)
        for stage in sharded_state.STAGES:
            state = sharded_state.init_state(params, optimizer, stage=stage)
            step = sharded_state.make_train_step(loss_fn, optimizer, stage=stage)
            found = [c for c in sharded_state.collectives(step.compile(state, batch).as_text()) if c.shape]
            counts = {}
            for c in found:
                counts[c.op] = counts.get(c.op, 0) + 1
            _COMPILED_COUNTS[stage] = (counts, found)
    return _COMPILED_COUNTS


@exercise("10.5", "Predict each stage's collectives before the compiled program shows them",
          solution=solution_predict_collectives,
          returns='a dict {collective: count}, e.g. {"all-reduce": 1}, for each stage')
def check_predict_collectives(predict):
    compiled = _compiled_counts()
    for stage in ("replicated", "zero1", "zero2", "fsdp"):
        got = call(predict, stage, name="predict")
        if not isinstance(got, dict):
            raise Mismatch(f"predict({stage!r}) returned {describe_tree(got)}; expected a dict from a collective's "
                           'name to how many of it one step runs, e.g. {"all-gather": 1}.')
        counts = {}
        for op, count in got.items():
            if not isinstance(op, str):
                raise Mismatch(f"predict({stage!r}) has the key {op!r}; the keys are the collectives' names, "
                               f"strings: {', '.join(repr(o) for o in _OPS)}.")
            name = _SPELLINGS.get(op.strip().lower().replace(" ", ""), op.strip().lower())
            if name not in _OPS:
                raise Mismatch(f"predict({stage!r}) names {op!r}; use the compiled program's names: "
                               f"{', '.join(repr(o) for o in _OPS)} (psum is an all-reduce, psum_scatter a "
                               "reduce-scatter).")
            if isinstance(count, bool) or not isinstance(count, (int, np.integer)):
                raise Mismatch(f"predict({stage!r})[{op!r}] is {describe(count) if hasattr(count, 'shape') else repr(count)}; "
                               "expected a whole number of collectives per step, a Python int.")
            if count:
                counts[name] = counts.get(name, 0) + int(count)
        want, found = compiled[stage]
        if counts != want:
            shown = ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())) or "no collective"
            why = {
                "replicated": "Data parallelism: every device needs the whole summed gradient.",
                "zero1": "ZeRO-1 updates only its slice of the optimizer state: does it need the whole summed "
                         "gradient, or only its slice? Section 2.",
                "zero2": "In one step without accumulation, how does ZeRO-2's program differ from ZeRO-1's? "
                         "Section 4 says where they part.",
                "fsdp": "FSDP holds only a slice of the parameters: count what the forward pass needs, what the "
                        "backward pass needs after the remat policy dropped the gathered copy, and what the "
                        "gradient needs. Section 3.",
            }[stage]
            if set(counts) == set(want) and all(counts[k] >= want[k] for k in want):
                why += (" You counted more than one step runs: sharded_state ravels all the parameters into one "
                        "flat vector (section 2), so each collective runs once per step for the whole vector, not "
                        "once per layer or per array; the loss's scalar does not count.")
            raise Mismatch(f"{stage}: you predicted {shown}; the compiled program of sharded_state's {stage!r} step "
                           f"runs {_listed(found)}. {why}")
    return ("the compiled programs agree: data parallelism one all-reduce; ZeRO-1 and ZeRO-2 a reduce-scatter and "
            "an all-gather (the same bytes as the all-reduce); FSDP a third collective, the backward pass's gather.")
