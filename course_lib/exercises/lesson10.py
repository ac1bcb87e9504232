"""Lesson 10 exercises: bytes per device for each ZeRO stage, the ZeRO-2 update with psum_scatter, choosing K."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from . import Mismatch, call, describe, exercise, expect_array

AXIS = "data"

# Graded hints, from a nudge to the key API, for a framework that shows them one at a time.
HINTS = {
    "10.1": ["Start from the replicated form: parameters 4 bytes, gradients 4 bytes, Adam 2 x 4 bytes per parameter. "
             "Then ask, stage by stage, which of the three is split over the devices.",
             "zero1 divides only the optimizer state by n_devices; zero2 the optimizer state and the gradients; fsdp "
             "all three."],
    "10.2": ["Three collectives in order: the reduced gradient slice this device owns, the update of that slice, and "
             "the whole vector back on every device.",
             "jax.lax.psum_scatter(grads, 'data', tiled=True) / n gives the mean gradient of your slice; "
             "jax.lax.dynamic_slice_in_dim(params, jax.lax.axis_index('data') * size, size) your parameters; "
             "jax.lax.all_gather(new_slice, 'data', tiled=True) the whole vector."],
    "10.3": ["Activation memory grows with the micro-batch, B // K examples; K must divide the per-device batch B.",
             "Try K = 1, 2, 3, ... and return the first that divides B with (B // K) * bytes_per_example <= budget; "
             "None if even K = B does not fit."],
}


# ----------------------------------------------------------------------------------------------
# 10.1 Bytes per device for each stage


def solution_zero_bytes(n_params, n_devices, stage):
    params, grads, opt_state = 4 * n_params, 4 * n_params, 2 * 4 * n_params    # float32, Adam's two moments
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
                    raise Mismatch(f"{stage} on {n} devices: {part} comes back divided by {n}, but this stage keeps "
                                   f"the whole {part} on every device ({whole:,.0f} bytes). It shards only "
                                   f"{', '.join(sorted(split)) or 'nothing'}.")
                if np.isclose(value, whole, rtol=1e-9):
                    raise Mismatch(f"{stage} on {n} devices: {part} is the whole {whole:,.0f} bytes, but this stage "
                                   f"splits it over the devices: {whole / n:,.0f} bytes each.")
                raise Mismatch(f"zero_bytes({n_params:_}, {n}, {stage!r})[{part!r}] is {value:,.0f}; expected "
                               f"{want:,.0f} bytes.")
    return ("replicated 16 bytes per parameter per device; zero1 cuts Adam's 8, zero2 also the gradients' 4, fsdp "
            "also the parameters' 4: 16 / n in the end.")


# ----------------------------------------------------------------------------------------------
# 10.2 The ZeRO-2 update, written with psum_scatter


def solution_zero2_sgd(params, grads, lr):
    n = jax.lax.axis_size("data")
    size = params.shape[0] // n
    mine = jax.lax.psum_scatter(grads, "data", tiled=True) / n                    # mean gradient of my slice
    start = jax.lax.axis_index("data") * size
    my_params = jax.lax.dynamic_slice_in_dim(params, start, size)                  # my slice of the parameters
    return jax.lax.all_gather(my_params - lr * mine, "data", tiled=True)          # everyone gets every slice


def _primitives(jaxpr) -> set:
    found = set()
    for eqn in jaxpr.eqns:
        found.add(eqn.primitive.name)
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                found |= _primitives(inner)
    return found


class _NoResult(Exception):
    """The learner's function returned None inside the mapped program."""


@exercise("10.2", "The ZeRO-2 update: psum_scatter, update your slice, all_gather", solution=solution_zero2_sgd)
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

        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P(AXIS)), out_specs=P(AXIS), check_vma=False))
        what = f"zero2_sgd on {n} devices, {n * size} parameters"
        try:
            jax.eval_shape(f, whole, grads)
        except _NoResult:
            raise Mismatch("zero2_sgd(params, grads, lr) returned None: write the function's body, and `return` its "
                           "result.") from None
        except Exception:
            pass                  # reported with the inputs by call() below
        out = call(f, whole, grads, name="zero2_sgd", hints={
            "unbound axis name": f"The mesh axis is named {AXIS!r}: use that name in every collective.",
            "must be divisible": "psum_scatter(..., tiled=True) splits the vector into n equal slices.",
        })
        out = np.asarray(out)
        expected = params - lr * local.mean(axis=0)
        if out.ndim != 2 or out.shape[0] != n:
            raise Mismatch(f"{what}: expected one vector per device.")
        if out.shape[1] == size:
            raise Mismatch(f"{what}: every device returned only its slice, shape ({size},). The forward pass of the "
                           "next step needs all the parameters: all_gather the updated slices (tiled=True).")
        if out.shape[1] != n * size:
            raise Mismatch(f"{what}: each device returned shape {out.shape[1:]}; expected the whole vector, "
                           f"({n * size},).")
        if np.allclose(out[0], params - lr * local.sum(axis=0), rtol=1e-4, atol=1e-5):
            raise Mismatch(f"{what}: the step is {n} times too large. psum_scatter adds the devices' gradients; "
                           f"divide by the device count ({n}) for their mean.")
        for i in range(n):
            expect_array(out[i], expected, what=f"{what}: the parameters on device {i}", rtol=1e-4, atol=1e-5)
        jaxpr = jax.make_jaxpr(f)(whole, grads).jaxpr
        used = _primitives(jaxpr)
        if "reduce_scatter" not in used:
            raise Mismatch(f"{what}: the values are right, but there is no psum_scatter in the program: each device "
                           "received the whole reduced gradient (an all-reduce, pmean or psum) and then kept a slice. "
                           "ZeRO-2 sends each device only the slice it owns: jax.lax.psum_scatter(grads, 'data', "
                           "tiled=True).")
        if "all_gather" not in used:
            raise Mismatch(f"{what}: the values are right, but there is no all_gather: rebuild the whole vector from "
                           "the updated slices with jax.lax.all_gather(..., tiled=True).")
    return ("each device receives 1/n of the reduced gradient (reduce-scatter), updates only its slice, and an "
            "all-gather hands every device every slice: ZeRO-2's step.")


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
                           f"whole number of micro-batches (a Python int), {want}.")
        if got < 1:
            raise Mismatch(f"{shown} returned {got}: K counts micro-batches, a whole number >= 1 (K = 1 is the whole "
                           f"per-device batch at once). The smallest K that divides {b} and fits is {want}.")
        if b % got:
            raise Mismatch(f"{shown} returned {got}, which does not divide the batch of {b}: the micro-batches "
                           f"must all have the same size (B // K). The smallest K that divides {b} and fits is "
                           f"{want}.")
        if (b // got) * per_example > budget:
            raise Mismatch(f"{shown} returned {got}: micro-batches of {b // got} examples need "
                           f"{(b // got) * per_example:_} bytes, over the budget.")
        raise Mismatch(f"{shown} returned {got}; {want} fits too and is smaller. Every extra micro-batch is one more "
                       "trip through the model with less work in it: take the smallest K that fits.")
    return "the smallest K that divides the batch and fits: as few passes as the memory allows."
