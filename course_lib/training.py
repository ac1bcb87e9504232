"""Data-parallel training: one step built from your loss and an optax optimizer, and a bounded ``fit`` loop.

Lesson 05. The step is the one the lesson writes by hand: every device computes the
loss and gradients on its shard of the global batch, the gradients are averaged over
the devices, and every device applies the same optimizer update to its copy of the
parameters, which therefore stay identical.

``fit`` runs any step of the form ``step(state, batch) -> (state, metrics)`` (the one
from ``make_train_step`` or one you wrote), and never lets Python run more than
``max_ahead`` steps ahead of the devices (see ``fit``).

Three things make the library's step cheaper than the one a tutorial writes (lesson 09
measures them): ``fit`` runs ``steps_per_call`` steps per dispatch, fused with ``lax.scan``
(``TrainStep.steps``); the step donates its input state, writing the new state into the old
one's buffers (``make_train_step(..., donate=True)``); and on the CPU backend everything the
devices exchange in a step travels in one flat all-reduce (``psum_bucketed``), while on GPUs and
TPUs each gradient gets its own psum, which XLA's combiner groups and its scheduler can overlap
with the backward pass (``make_train_step(..., allreduce=...)``).
"""

from __future__ import annotations

import collections
import collections.abc
import itertools
import sys
import time
from typing import Any, Callable, Iterable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from tqdm.std import tqdm

from . import _checks, sharding

__all__ = ["TrainState", "TrainStep", "TrainingDiverged", "BACKENDS", "init_state", "masked_mean", "psum_bucketed",
           "psum_per_leaf", "device_step", "make_train_step", "fit", "replicas_identical", "max_divergence",
           "ALLREDUCE", "LOSS_REDUCTIONS"]

AXIS = "devices"


class TrainState(NamedTuple):
    """Everything a step updates, replicated on the devices.

    With the ``"pmap"`` backend each leaf is stacked, ``(n_devices, ...)``; with ``"shard_map"`` and ``"jit"``
    each leaf keeps its own shape and is replicated with ``P()``.
    """

    params: Any
    opt_state: Any
    key: jax.Array
    step: jax.Array


BACKENDS = ("pmap", "shard_map", "jit")
ALLREDUCE = ("auto", "one_buffer", "per_leaf")
LOSS_REDUCTIONS = ("mean", "sum")


def _check_backend(backend, where="make_train_step"):
    if backend not in BACKENDS:
        raise ValueError(f"{where}: backend must be one of {BACKENDS}, got {backend!r}. Pass backend='pmap' "
                         "(lesson 05), 'shard_map' or 'jit' (lesson 07).")


def _check_optimizer(optimizer, where):
    if callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None)):
        return
    fix = "Pass e.g. optimizer=optax.sgd(0.1) or optax.adam(1e-3)."
    if callable(optimizer) and getattr(optimizer, "__module__", "").startswith("optax"):  # optax.sgd, not called
        fix = f"Call it to build one: optimizer=optax.{getattr(optimizer, '__name__', 'sgd')}(learning_rate)."
    raise TypeError(f"{where}: optimizer must be an optax optimizer (an optax.GradientTransformation with .init and "
                    f".update), got {type(optimizer).__name__} ({_checks.shown(optimizer)}). {fix}")


def _check_key(key, where):
    if isinstance(key, jax.Array) and (jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
                                       or (key.dtype == jnp.uint32 and key.shape == (2,))):
        return
    raise TypeError(f"{where}: key must be a JAX PRNG key, got {type(key).__name__} ({_checks.shown(key)}). "
                    "Pass key=jax.random.key(seed).")


class TrainingDiverged(FloatingPointError):
    """``fit`` read a loss or metric that is NaN or infinite. ``step``, ``name``, ``value`` and ``history`` (the
    metrics of every step read before it) say where; ``fit(..., allow_nonfinite=True)`` trains on regardless."""

    def __init__(self, message, *, step, name, value, history):
        super().__init__(message)
        self.step, self.name, self.value, self.history = step, name, value, history


def init_state(params, optimizer: optax.GradientTransformation, key: jax.Array, devices=None,
               backend: str = "pmap") -> TrainState:
    """Initialise the optimizer and put everything on the devices.

    ``backend="pmap"``: one copy per device stacked on a new axis, ``(...) -> (n, ...)`` per leaf
    (``sharding.replicate``). ``"shard_map"`` and ``"jit"``: the same shapes, replicated with
    ``NamedSharding(mesh, P())`` (``sharding.replicate_on_mesh``).
    """
    _check_backend(backend, "init_state")
    _check_optimizer(optimizer, "init_state")
    _check_key(key, "init_state")
    sharding._array_leaves(params, "init_state")
    if not jax.tree.leaves(params):
        raise ValueError("init_state: params must hold at least one array, got an empty pytree. Pass the model's "
                         "parameters, e.g. params={'w': jnp.zeros(3), 'b': jnp.float32(0.0)}.")
    devices = _checks.device_list(devices, "devices", "init_state")
    state = TrainState(params, optimizer.init(params), key, jnp.zeros((), jnp.int32))
    if backend == "pmap":
        return sharding.replicate(state, devices)
    # A copy: device_put may hand back the caller's own arrays when they are already in place, and a step with
    # donation would then delete them.
    state = jax.tree.map(lambda x: x.copy() if isinstance(x, jax.Array) else x, state)
    return sharding.replicate_on_mesh(state, sharding.device_mesh(devices))


def masked_mean(values, mask=None):
    """Mean of ``values`` ``(b, ...)`` over the rows where ``mask`` ``(b,)`` is true; 0 if there are none.

    Use it for a per-device loss so that padding rows (``data.batches(remainder="pad")``) count for nothing.
    """
    if mask is None:
        return jnp.mean(values)
    if np.ndim(values) == 0 or np.shape(mask) != np.shape(values)[:np.ndim(mask)]:
        raise ValueError(f"masked_mean: mask must have the leading shape of values, (b,) for values (b, ...), got "
                         f"mask {np.shape(mask)} for values {np.shape(values)}. Pass the batch's mask (batch['mask']) "
                         "with values of one row per example.")
    mask = mask.reshape(mask.shape + (1,) * (values.ndim - mask.ndim)).astype(values.dtype)
    per_row = values.size // max(values.shape[0], 1)
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask) * per_row, 1.0)


def _count(batch, rows_without_mask=False):
    """A shard's weight in the average: its number of real examples (``batch["mask"]``); without a mask, 1 (every
    shard weighs the same), or with ``rows_without_mask`` the number of rows of its first leaf."""
    if isinstance(batch, dict) and "mask" in batch:
        return jnp.sum(batch["mask"].astype(jnp.float32))
    if rows_without_mask:
        return jnp.float32(jax.tree.leaves(batch)[0].shape[0])
    return jnp.float32(1.0)


def _step_key(state, device_index):
    return jax.random.fold_in(jax.random.fold_in(state.key, state.step), device_index)


def psum_bucketed(tree, axis_name=AXIS):
    """``psum`` of every leaf of ``tree`` over ``axis_name`` in a single all-reduce.

    The leaves are raveled into one vector (promoted to a common dtype), summed across the devices, and cut back
    into the tree: the same values as ``jax.tree.map(lambda v: lax.psum(v, axis_name), tree)``, with one
    collective instead of one per leaf. Each all-reduce has a fixed cost (every device must arrive before any can
    leave), and on XLA's CPU backend, which runs simulated devices, one flat buffer measured several times cheaper
    than the tuple all-reduce that XLA's combiner makes of per-leaf psums (lesson 09, section 3). One buffer at the
    end of the step gives up overlap: on hardware whose runtime runs collectives beside computation, several
    buckets started during the backward pass can hide behind it. Use it inside a mapped function
    (``pmap``/``shard_map``) where ``axis_name`` is bound.
    """
    flat, unravel = ravel_pytree(tree)
    return unravel(jax.lax.psum(flat, axis_name))


def psum_per_leaf(tree, axis_name=AXIS):
    """``psum`` of each leaf of ``tree`` on its own: one all-reduce per leaf in the program you write.

    XLA's all-reduce combiner merges independent ones into one instruction carrying a tuple of buffers, up to a
    size threshold (``--xla_gpu_all_reduce_combine_threshold_bytes`` on GPU, about 30 MiB by default); a merged
    one waits for all its buffers. On GPUs each remaining all-reduce is asynchronous (a start/done pair) and can
    start as soon as its buffers are ready, during the backward pass (the latency-hiding scheduler, opt-in there,
    orders the program for that overlap). On the CPU backend a tuple all-reduce measured two to four times one flat
    buffer (lesson 09), so ``make_train_step`` uses ``psum_bucketed`` there. XLA's GPU compiler does not send the
    tuple: it concatenates the combined gradients into one flat buffer itself (lesson 10's MLP: one
    ``all-reduce-start`` of ``f32[19211]``, measured on one NVIDIA H200, JAX 0.11.2 (2026-11)).
    """
    return jax.tree.map(lambda v: jax.lax.psum(v, axis_name), tree)


def _allreduce_for(allreduce, devices, where="make_train_step"):
    """The ``reduce`` function for ``allreduce`` ("auto", "one_buffer" or "per_leaf") on these devices."""
    if allreduce not in ALLREDUCE:
        raise ValueError(f"{where}: allreduce must be one of {ALLREDUCE}, got {_checks.shown(allreduce)}. Leave it "
                         "out (\"auto\": one buffer on the CPU backend, one psum per gradient elsewhere).")
    if allreduce == "auto":
        platform = (devices[0] if devices else jax.local_devices()[0]).platform
        allreduce = "one_buffer" if platform == "cpu" else "per_leaf"
    return psum_bucketed if allreduce == "one_buffer" else psum_per_leaf


def device_step(loss_fn, optimizer, has_aux=False, axis_name=AXIS, in_shard_map=False, reduce=None,
                loss_reduction="mean"):
    """One device's view of a step: local gradients, a weighted average over ``axis_name``, the update.

    ``step(state, shard) -> (state, metrics)``, unmapped: what ``make_train_step`` gives to ``jax.pmap``
    (or, with ``in_shard_map=True``, to ``jax.shard_map``). Use it to build your own mapped step, e.g. one
    that fuses several steps per dispatch with ``jax.lax.scan`` (lesson 09).

    ``reduce(tree, axis_name) -> tree`` is how the step's weighted sums cross the devices: by default
    ``psum_bucketed``, one all-reduce. Another one changes only the communication, e.g.
    ``lambda t, a: jax.tree.map(lambda v: jax.lax.psum(v, a), t)`` (one psum per leaf); ``course_lib.bench`` passes
    one that keeps each device's own sums, a wrong step, to time the step without its all-reduce.
    ``make_train_step`` passes ``psum_bucketed`` on the CPU backend and ``psum_per_leaf`` on GPUs and TPUs
    (its ``allreduce`` argument). One flat buffer cannot start before the whole backward pass has finished, so it
    cannot overlap it; separate psums can.

    ``loss_reduction="sum"``: ``loss_fn`` returns the sum of its per-example losses over the real rows, not
    their mean, and the step divides the summed gradients, loss and metrics by the number of real rows of the
    global batch (``batch["mask"]``, or every row) after the exchange. Same result as a mean loss.
    """
    _check_loss_reduction(loss_reduction, "device_step")
    summed = loss_reduction == "sum"
    if reduce is None:
        reduce = psum_bucketed
    elif not callable(reduce):
        raise TypeError(f"device_step: reduce must be a function reduce(tree, axis_name) -> tree, got "
                        f"{_checks.shown(reduce)}. Leave it out for psum_bucketed, one all-reduce per step.")

    def step(state: TrainState, batch):
        key = _step_key(state, jax.lax.axis_index(axis_name))
        params = state.params
        if in_shard_map:
            # Under shard_map the replicated params are known to be the same on every device, so the gradient
            # with respect to them would come back already summed over devices (the transpose of a broadcast
            # is a psum). Marking them as varying keeps this device's own gradient, as under pmap; the
            # average below is then the only communication.
            params = jax.tree.map(lambda p: jax.lax.pcast(p, axis_name, to="varying"), params)
        out, grads = jax.value_and_grad(loss_fn, has_aux=has_aux)(params, batch, key)
        loss, aux = out if has_aux else (out, {})
        # Each device's weight is its number of real examples; without a mask all weigh the same (a pmean).
        # The weighted sums of the gradients, the loss and the metrics, and the total weight, cross the devices
        # together: one all-reduce per step instead of one per leaf.
        # With a summed loss the sums are already weighted: the count only divides at the end.
        count = _count(batch, rows_without_mask=summed)
        weighted = ((grads, loss, aux) if summed else
                    (jax.tree.map(lambda g: g * count, grads), loss * count, jax.tree.map(lambda a: a * count, aux)))
        (grads, loss, aux), total = reduce((weighted, count), axis_name)
        if summed:
            total = jnp.maximum(total, 1.0)
        grads, loss, aux = jax.tree.map(lambda v: v / total, (grads, loss, aux))
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": loss, **aux}
        return TrainState(params, opt_state, state.key, state.step + 1), metrics

    return step


def _check_loss_reduction(loss_reduction, where):
    if loss_reduction not in LOSS_REDUCTIONS:
        raise ValueError(f"{where}: loss_reduction must be 'mean' (loss_fn returns the mean over its rows) or 'sum' "
                         f"(their sum over the real rows), got {_checks.shown(loss_reduction)}. Leave it out for "
                         "'mean'.")


def _global_step(loss_fn, optimizer, has_aux, loss_reduction="mean"):
    """The single-device step on the whole global batch; the compiler splits it over the devices.

    ``step(state, batch) -> (state, metrics)`` with ``batch`` leaves ``(n, B // n, ...)``: they are merged into the
    global batch ``(B, ...)`` (a reshape; each device keeps its rows, nothing moves) and ``loss_fn`` sees all ``B``
    rows at once, with one key per step. There is no per-device code and no collective here: the batch's sharding
    makes the compiler split the work and insert the all-reduces. A loss that is a (masked) mean over the rows gives
    the same average as the other backends' count-weighted one: the sum over the real rows of all devices divided by
    their number. That mean's denominator, the count of real rows over all devices, is itself a sum across the
    devices, needed before any gradient can be formed: a second all-reduce, ahead of the gradients'. With
    ``loss_reduction="sum"`` the loss is the sum over the real rows; the count does not enter the gradient, the
    compiler sends it with the gradients (one all-reduce), and the step divides afterwards.
    """
    summed = loss_reduction == "sum"

    def step(state: TrainState, batch):
        whole = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), batch)   # (n, B // n, ...) -> (B, ...)
        key = jax.random.fold_in(state.key, state.step)
        out, grads = jax.value_and_grad(loss_fn, has_aux=has_aux)(state.params, whole, key)
        loss, aux = out if has_aux else (out, {})
        if summed:
            count = jnp.maximum(_count(whole, rows_without_mask=True), 1.0)
            grads, loss, aux = jax.tree.map(lambda v: v / count, (grads, loss, aux))
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return TrainState(params, opt_state, state.key, state.step + 1), {"loss": loss, **aux}

    return step


class TrainStep:
    """A data-parallel training step, from ``make_train_step``.

    ``step(state, batch) -> (state, metrics)`` runs one step: ``batch`` leaves ``(n, B // n, ...)``.
    ``step.steps(state, batches) -> (state, metrics)`` runs ``K = len(batches)`` steps in one dispatch, fused
    with ``lax.scan`` inside one compiled program: ``batches`` is a list of ``K`` batches like the one ``step``
    takes, and every metric comes back with one value per step, ``(K,)`` (``(n, K)`` with the pmap backend, one
    row per device). Each new ``K`` compiles once. ``fit`` uses ``steps`` on its own.

    With ``donate`` (the default of ``make_train_step``) both give the buffers of the ``state`` they are passed to
    the new state: the old state is deleted, and reading it afterwards raises. Keep the returned state.
    """

    def __init__(self, one, many, backend, place, donate=False, devices=None):
        self._one, self._many, self._place = one, many, place
        self.backend, self.donate = backend, donate
        self.devices = devices  # the devices it runs on, in order (fit checks the state against them)

    def __call__(self, state, batch):
        return self._one(state, self._place(batch))

    def steps(self, state, batches):
        return self._many(state, self._place(list(batches)))

    def place(self, batch):
        """``batch`` (or a list of batches) on the step's devices, split as the step takes it: leaves
        ``(n, B // n, ...)``. Arrays already in place are returned as they are; the others travel in one
        ``jax.device_put`` call. ``fit(..., prefetch=k)`` calls it ``k`` dispatches ahead of the step that needs them.
        """
        return self._place(batch)

    def lower(self, state, batch):
        """The compiler's view of one step (``.compile().as_text()`` for the HLO), as ``jax.jit(...).lower``."""
        return self._one.lower(state, self._place(batch))

    def __repr__(self):
        return f"TrainStep(backend={self.backend!r})"


def make_train_step(loss_fn: Callable, optimizer: optax.GradientTransformation, *, has_aux: bool = False,
                    axis_name: str = AXIS, devices=None, backend: str = "pmap", donate: bool = True,
                    allreduce: str = "auto", loss_reduction: str = "mean") -> TrainStep:
    """A data-parallel training step, with one of three backends that compute the same thing.

    Args:
      loss_fn: ``loss_fn(params, batch, key) -> loss`` (or ``(loss, metrics)`` with ``has_aux``): the mean
        loss over one device's shard of the batch. ``batch`` is what the data iterator yields, one device's
        part (``(B // n, ...)`` per leaf); ``key`` is a PRNG key different on every device and every step
        (``fold_in`` of the step and the device's index), for dropout or noise.
      optimizer: an optax optimizer.
      has_aux: ``loss_fn`` returns ``(loss, metrics dict)``.
      backend: how the step is spread over the devices (lesson 07):

        * ``"pmap"``: ``jax.pmap`` of the per-device step, state replicated as ``(n, ...)``;
        * ``"shard_map"``: ``jax.jit(jax.shard_map(...))`` of the same per-device step, state replicated
          with ``P()``, batch split with ``P(axis_name)``;
        * ``"jit"``: plain ``jax.jit`` of the single-device step on the whole global batch (lesson 07):
          ``loss_fn`` sees all ``B`` rows (``(B, ...)`` per leaf) and one key per step; the inputs'
          shardings tell the compiler to split it, and it inserts the all-reduces itself. With a (masked)
          mean loss the result is the same as the other backends'; random draws (dropout) differ, since
          the key is not split per device.
      donate: hand the input state's buffers to the output state (``donate_argnums``), so a step updates the
        parameters and optimizer state in place instead of allocating a fresh copy. The state passed in is
        deleted: write ``state, metrics = step(state, batch)``.
      allreduce: how the ``"pmap"`` and ``"shard_map"`` steps send their gradients across the devices.
        ``"one_buffer"``: everything in one flat all-reduce at the end of the step (``psum_bucketed``), the
        cheapest on the CPU backend, where each collective is a rendezvous of threads and a tuple all-reduce
        costs a multiple of one buffer; it cannot overlap the backward pass. ``"per_leaf"``: one psum per gradient
        (``psum_per_leaf``), which XLA's combiner groups and, on GPUs, its scheduler can run during the backward
        pass (in libtpu 0.0.50.1's programs for these steps the all-reduces are synchronous). ``"auto"`` (default): ``"one_buffer"`` on CPU devices, ``"per_leaf"`` elsewhere. The
        ``"jit"`` backend has no per-device code: its compiler places the all-reduces itself, as ``"per_leaf"``.
      loss_reduction: ``"mean"`` (default): ``loss_fn`` returns the mean loss over its rows (e.g.
        ``masked_mean``). ``"sum"``: it returns the sum over the real rows, and the step divides by their number
        after the exchange: with the ``"jit"`` backend this sends the count with the gradients in one all-reduce,
        where a mean over the global batch needs the count in an all-reduce of its own first. Same result.

    Returns:
      a ``TrainStep``: ``step(state, batch) -> (state, metrics)`` for a state from
      ``init_state(..., backend=backend)`` and a sharded batch ``(n, B // n, ...)`` as ``data.batches`` yields,
      and ``step.steps(state, [batch, ...])`` for several steps in one dispatch. Gradients, loss and metrics are averaged
      over the devices, weighted by each device's number of real examples (``batch["mask"]``, if present),
      so padding counts for nothing.
    """
    _check_backend(backend, "make_train_step")
    if not callable(loss_fn):
        raise TypeError(f"make_train_step: loss_fn must be a function loss_fn(params, batch, key) -> loss, got "
                        f"{type(loss_fn).__name__} ({_checks.shown(loss_fn)}). Pass the function itself.")
    _check_optimizer(optimizer, "make_train_step")
    devices = _checks.device_list(devices, "devices", "make_train_step")
    if not isinstance(donate, bool):
        raise TypeError(f"make_train_step: donate must be True or False, got {_checks.shown(donate)}. Pass "
                        "donate=False to keep the state you pass in readable after the step.")
    _check_loss_reduction(loss_reduction, "make_train_step")
    if backend == "jit" and allreduce != "auto":
        raise ValueError(f"make_train_step: allreduce={_checks.shown(allreduce)} applies to the 'pmap' and "
                         "'shard_map' backends; with backend='jit' the compiler places the all-reduces. Leave "
                         "allreduce out, or use backend='shard_map' to choose.")
    donated = (0,) if donate else ()
    mesh = sharding.device_mesh(devices)
    reduce = _allreduce_for(allreduce, list(mesh.devices.flat))
    if mesh.axis_names != (axis_name,):
        mesh = jax.sharding.Mesh(mesh.devices, (axis_name,))
    P = jax.sharding.PartitionSpec
    replicated = jax.sharding.NamedSharding(mesh, P())
    split = jax.sharding.NamedSharding(mesh, P(axis_name))

    def placer(in_place):
        def place(batches):  # every leaf that is not in place, in one device_put call (one per leaf costs more)
            leaves, tree = jax.tree.flatten(batches)
            todo = [i for i, x in enumerate(leaves) if not in_place(x)]
            for i, x in zip(todo, jax.device_put([leaves[i] for i in todo], split)):
                leaves[i] = x
            return jax.tree.unflatten(tree, leaves)
        return place

    if backend == "pmap":
        per_device = device_step(loss_fn, optimizer, has_aux, axis_name, reduce=reduce, loss_reduction=loss_reduction)
        one, many = (jax.pmap(f, axis_name=axis_name, devices=devices, donate_argnums=donated)
                     for f in (per_device, _scanned(per_device)))
        # pmap takes device arrays as they are; host arrays are split over its devices, as pmap itself would.
        return TrainStep(one, many, backend, placer(lambda x: isinstance(x, jax.Array)), donate,
                         devices=devices)  # None: pmap picks the first n local devices
    if backend == "shard_map":
        per_device = device_step(loss_fn, optimizer, has_aux, axis_name, in_shard_map=True, reduce=reduce,
                                 loss_reduction=loss_reduction)

        def squeezed(f):  # shard_map keeps rank: this device's block is (1, B // n, ...)
            return lambda state, batches: f(state, jax.tree.map(lambda x: x[0], batches))

        one, many = (jax.jit(jax.shard_map(squeezed(f), mesh=mesh, in_specs=(P(), P(axis_name)),
                                           out_specs=(P(), P())), donate_argnums=donated)
                     for f in (per_device, _scanned(per_device)))
    else:
        global_step = _global_step(loss_fn, optimizer, has_aux, loss_reduction)
        one, many = (jax.jit(f, out_shardings=(replicated, replicated), donate_argnums=donated)
                     for f in (global_step, _scanned(global_step)))
    # Host arrays are split over the mesh; global arrays built by each process from its own part of the batch
    # (jax.make_array_from_process_local_data, lesson 08) are already in place.
    return TrainStep(one, many, backend, placer(
        lambda x: isinstance(x, jax.Array) and x.sharding.is_equivalent_to(split, x.ndim)), donate,
        devices=list(mesh.devices.flat))


def _scanned(step):
    """``step(state, batch)`` -> ``steps(state, [batch_1, ..., batch_K])``: the K steps as one ``lax.scan``.

    The K batches are stacked inside the compiled program, each leaf with a new leading axis ``K`` to scan over;
    every metric comes back with one value per step.
    """
    def steps(state, batches):
        return jax.lax.scan(step, state, jax.tree.map(lambda *leaves: jnp.stack(leaves), *batches))
    return steps


def _check_batch(batch, n: int) -> None:
    leaves = jax.tree_util.tree_flatten_with_path(batch)[0]
    if not leaves:
        raise ValueError("a batch has no arrays in it.")
    for path, leaf in leaves:
        shape = np.shape(leaf)
        if len(shape) < 2 or shape[0] != n:
            raise ValueError(
                f"batch leaf {jax.tree_util.keystr(path)} has shape {shape}, but the state is replicated on {n} "
                f"devices, so every leaf must be sharded as (n_devices={n}, B // {n}, ...). Shard the global batch "
                f"(course_lib.sharding.shard, or data.batches), with B a multiple of {n}.")
    sizes = {np.shape(leaf)[:2] for _, leaf in leaves}
    if len(sizes) > 1:
        raise ValueError(f"the leaves of a batch disagree on (n_devices, per-device batch): "
                         f"{ {jax.tree_util.keystr(p): np.shape(x) for p, x in leaves} }; inputs and labels must "
                         "have the same number of examples.")


def _check_state(step, state) -> int:
    """That ``state`` lives on the devices, as ``step`` expects; returns how many devices it spans."""
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    backend = step.backend if isinstance(step, TrainStep) else None
    make = (f"Make it with training.init_state(params, optimizer, key, backend={backend!r}"
            + (", devices=...)" if backend and step.devices is not None else ")") if backend else
            "Put it on the devices first: training.init_state(...), or sharding.replicate(state)")
    if not leaves:
        raise ValueError(f"fit: state must hold the arrays the step updates, got {_checks.shown(state)}. {make}.")
    for path, x in leaves:
        if not isinstance(x, jax.Array):
            raise TypeError(f"fit: state must live on the devices, but its leaf {jax.tree_util.keystr(path)} is a "
                            f"{type(x).__name__} of shape {np.shape(x)}, a host value. {make}.")
    placed = {frozenset(x.devices()) for _, x in leaves}
    if len(placed) > 1:
        raise ValueError(f"fit: state's leaves must all live on the same devices, but they are spread over "
                         f"{sorted(len(p) for p in placed)} devices. {make}.")
    devices = placed.pop()
    n = len(devices)
    if backend is None:
        return n
    if step.devices is not None and devices != set(step.devices):
        raise ValueError(f"fit: state must live on the step's {len(step.devices)} devices, but it lives on {n} "
                         f"device(s){' (it was not replicated)' if n == 1 else ''}. {make}.")
    for path, x in leaves:
        name = jax.tree_util.keystr(path)
        stacked = x.ndim >= 1 and x.shape[0] == n and x.addressable_shards[0].data.shape[:1] == (1,)
        if backend == "pmap" and n > 1 and not (stacked and not x.sharding.is_fully_replicated):
            origin = ("it comes from backend 'shard_map' or 'jit' (replicated with P(), no device axis)"
                      if x.sharding.is_fully_replicated else "it is not replicated one copy per device")
            raise ValueError(f"fit: state leaf {name} has shape {x.shape}; the 'pmap' step needs a copy per device, "
                             f"shape ({n}, ...), and {origin}. {make}.")
        if backend == "pmap" and n == 1 and not stacked:
            raise ValueError(f"fit: state leaf {name} has shape {x.shape}; the 'pmap' step needs a copy per device, "
                             f"shape (1, ...), and it is not replicated. {make}.")
        if backend != "pmap" and not x.sharding.is_fully_replicated:
            origin = ("it comes from backend 'pmap' (one stacked copy per device)" if stacked
                      else "it is split over the devices, not replicated")
            raise ValueError(f"fit: state leaf {name} of shape {x.shape} must be replicated on every device with "
                             f"P() for the {backend!r} step, but {origin}. {make}.")
    return n


def _diverged(name, value, step, history):
    return TrainingDiverged(
        f"fit: the {name} of step {step} is {value} (not finite), so training stopped there. Likely causes: the "
        "learning rate is too high (try one 10x smaller); NaN or inf in the data (check np.isfinite(x).all() on "
        "inputs and labels); a zero denominator, e.g. a mean over a mask with no real rows (training.masked_mean "
        "guards it). To train on regardless, pass fit(..., allow_nonfinite=True).",
        step=step, name=name, value=value, history=history)


def _placed_ahead(batches, place, group, depth, n):
    """Yield ``batches`` already on the devices: ``group`` at a time in one ``place`` call, ``depth`` groups
    placed before the first of them is yielded."""
    queue = collections.deque()
    batches = iter(batches)
    first = True
    while chunk := list(itertools.islice(batches, group)):
        if first:
            _check_batch(chunk[0], n)  # before any transfer, so a badly shaped batch gets fit's own message
            first = False
        queue.append(place(chunk))
        if len(queue) > depth:
            yield from queue.popleft()
    for chunk in queue:
        yield from chunk


def _first_copy(value):
    """One device's block of a metric: ``(1, ...)`` of a pmap output ``(n, ...)``, all of a replicated one."""
    return value.addressable_shards[0].data if isinstance(value, jax.Array) else value


def fit(step: Callable, state: TrainState, batches: Iterable, *, num_steps: int | None = None,
        eval_fn: Callable | None = None, eval_every: int | None = None, steps_per_call: int = 10,
        max_ahead: int = 20, prefetch: int = 0, progress: bool = True, desc: str = "training",
        allow_nonfinite: bool = False):
    """Run ``step`` over ``batches``; return the final state and a history of metrics.

    Two rules make the loop fast and safe (lesson 09 measures both):

    * Several steps per dispatch. When ``step`` can fuse steps (a ``TrainStep`` from ``make_train_step``),
      ``fit`` hands ``steps_per_call`` consecutive batches to ``step.steps``, which runs them as one compiled
      program (a ``lax.scan``), paying Python's dispatch once for all of them. The result is the
      same as one step at a time. Steps left over before an evaluation or at the end run one at a time, and so
      does a step you wrote yourself.
    * Bounded, never blocking every step. JAX dispatches asynchronously: a loop that never reads a result
      queues steps as fast as Python issues them (memory for their inputs piles up, errors surface far from their
      cause, and on JAX 0.9 to 0.10 on a 2-core CPU a long queue of collectives aborted in a rendezvous), while a
      loop that reads the loss every step stalls the devices every step. ``fit`` reads the metrics of the
      oldest dispatch only when more than ``max_ahead`` steps would otherwise be in flight, so the devices always
      have the next dispatch queued while Python waits.

    Args:
      step: ``step(state, batch) -> (state, metrics)``, e.g. from ``make_train_step``.
      state: the replicated ``TrainState`` (or any pytree your step takes).
      batches: an iterable of sharded batches, leaves ``(n, B // n, ...)``, e.g. ``data.batches(...)``.
      num_steps: stop after this many steps (default: when ``batches`` ends).
      eval_fn: ``eval_fn(state) -> dict`` of numbers, called every ``eval_every`` steps and at the end.
      steps_per_call: steps fused into one dispatch (1: one dispatch per step).
      max_ahead: the most steps dispatched and not yet read back; at least ``steps_per_call`` when ``step`` can
        fuse steps (twice it keeps the devices busy while Python reads).
      prefetch: when ``step`` can place batches (``TrainStep.place``), send each group of ``steps_per_call``
        batches to the devices this many dispatches before the one that uses it (1: double buffering), so that
        host-to-device copies can overlap the steps before. 0 (the default) sends a group with its own dispatch:
        on simulated CPU devices the copies run on the same cores as the steps, and placing ahead measured no
        faster (.github/CONTRIBUTING.md, *Benchmark*).
      progress: show a progress bar: in a notebook a line of text updated in place (it is stored as text, so it
        reads the same in a trusted or untrusted notebook, on GitHub and in an HTML export), in a terminal tqdm's.
      allow_nonfinite: by default the first NaN or infinite loss or metric read back raises
        ``TrainingDiverged``, naming the step; ``True`` records it in the history and trains on.

    Returns:
      ``(state, history)``; ``history["train"]`` is a list of ``{"step", "loss", ...}`` for every step,
      ``history["eval"]`` a list of ``{"step", ...}`` from ``eval_fn``.

    An interrupt (the kernel's stop button, Ctrl-C) ends the bar with the step it stopped at, prints which steps
    ran and what became of the state passed in, and raises ``KeyboardInterrupt`` as usual.

    Raises:
      ValueError: bad ``num_steps``/``steps_per_call``/``max_ahead``/``eval_every``, a batch not sharded for the
        state's devices, a state not replicated for the step's backend, or no batches at all.
      TypeError: a host (NumPy) state, a ``step`` or ``eval_fn`` that is not a function, a count that is not a
        whole number.
      TrainingDiverged: a loss or metric is NaN or infinite (unless ``allow_nonfinite``).
    """
    if not callable(step):
        raise TypeError(f"fit: step must be a function step(state, batch) -> (state, metrics), got "
                        f"{type(step).__name__}. Pass e.g. training.make_train_step(loss_fn, optimizer).")
    if eval_fn is not None and not callable(eval_fn):
        raise TypeError(f"fit: eval_fn must be a function eval_fn(state) -> dict, got {type(eval_fn).__name__}.")
    num_steps = _checks.optional_whole(num_steps, "num_steps", "fit",
                                       fix="Pass num_steps=1 or more, or None to use every batch.")
    steps_per_call = _checks.whole(steps_per_call, "steps_per_call", "fit",
                                   fix="Pass steps_per_call=1 for one dispatch per step.")
    fused = steps_per_call if steps_per_call > 1 and callable(getattr(step, "steps", None)) else 1
    fix = f"Use max_ahead={2 * fused} to keep the devices busy while Python reads results."
    max_ahead = _checks.whole(max_ahead, "max_ahead", "fit", fix=fix)
    if max_ahead < fused:
        raise ValueError(f"fit: max_ahead must be a whole number >= steps_per_call ({fused}), got {max_ahead!r}. "
                         + fix)
    eval_every = _checks.optional_whole(eval_every, "eval_every", "fit")
    if eval_every is not None and eval_fn is None:
        raise ValueError(f"fit: eval_every needs an eval_fn to call (got eval_every={eval_every}); pass "
                         "eval_fn=..., or leave eval_every out.")
    prefetch = _checks.whole(prefetch, "prefetch", "fit", minimum=0,
                             fix="Pass prefetch=0 to send each group with its own dispatch, 1 for double buffering.")
    n = _check_state(step, state)
    try:
        iterator = iter(batches)
    except TypeError:
        raise TypeError(f"batches must be an iterable of sharded batches (e.g. course_lib.data.batches(...)), "
                        f"got {type(batches).__name__}.") from None
    if num_steps is not None:
        iterator = itertools.islice(iterator, num_steps)
    if prefetch and callable(getattr(step, "place", None)):
        iterator = _placed_ahead(iterator, step.place, fused, prefetch, n)
    history = {"train": [], "eval": []}
    in_flight = collections.deque()  # (first step, number of steps, metrics), oldest first
    bar = _ProgressBar(num_steps, desc, progress)

    def read_oldest():
        first, k, metrics = in_flight.popleft()
        # Waits for these steps to finish: the bound on running ahead. The metrics are the same on every device
        # (averaged over all of them), so one device's copy is read, not a gather from all of them.
        values = jax.device_get({name: _first_copy(v) for name, v in metrics.items()})
        values = {name: np.asarray(v).reshape(-1, k)[0] for name, v in values.items()}
        for j in range(k):
            row = {name: float(v[j]) for name, v in values.items()}
            history["train"].append({"step": first + j, **row})
            if not allow_nonfinite:
                for name, value in row.items():
                    if not np.isfinite(value):
                        raise _diverged(name, value, first + j, history)
        bar.update(k, loss=history["train"][-1]["loss"])

    def dispatch(first, group):
        nonlocal state
        while in_flight and sum(k for _, k, _ in in_flight) + len(group) > max_ahead:
            read_oldest()
        out = step.steps(state, group) if len(group) > 1 else step(state, group[0])
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], collections.abc.Mapping)
                and "loss" in out[1]):
            raise TypeError(f"fit: step must return (state, metrics) with metrics a dict holding 'loss', got "
                            f"{_checks.shown(out)}. Return e.g. (new_state, {{'loss': loss}}), as "
                            "make_train_step's step does.")
        state, metrics = out
        in_flight.append((first, len(group), metrics))

    def run(last, group):  # a full group in one dispatch; a short one a step at a time (no new compile)
        if len(group) == fused:
            dispatch(last - len(group) + 1, group)
        else:
            for j, batch in enumerate(group):
                dispatch(last - len(group) + 1 + j, [batch])

    def evaluate(i):
        result = eval_fn(state)
        if not isinstance(result, collections.abc.Mapping):
            raise TypeError(f"fit: eval_fn must return a dict of numbers, got {type(result).__name__} "
                            f"({_checks.shown(result)}). Return e.g. {{'accuracy': acc}}.")
        history["eval"].append({"step": i, **{k: float(v) for k, v in result.items()}})

    i, group = 0, []
    try:
        for i, batch in enumerate(iterator, start=1):
            if i == 1:
                _check_batch(batch, n)
            group.append(batch)
            at_eval = bool(eval_every) and i % eval_every == 0
            if len(group) == fused or at_eval:
                run(i, group)
                group = []
            if at_eval:
                while in_flight:
                    read_oldest()
                evaluate(i)
        run(i, group)
        while in_flight:
            read_oldest()
    except KeyboardInterrupt:
        bar.close(interrupted_at=i)
        donated = getattr(step, "donate", False) and bool(in_flight or history["train"])  # a step has run
        print(_interrupted_message(i, num_steps, history, donated), file=sys.stderr)
        raise
    finally:
        bar.close()
    if i == 0:
        raise ValueError("fit got no batches: the iterable was empty (an empty dataset, or a finished iterator?).")
    if eval_fn is not None and (not history["eval"] or history["eval"][-1]["step"] != i):
        evaluate(i)
    return state, history


def _interrupted_message(taken: int, num_steps: int | None, history: dict, donated: bool) -> str:
    """What ``fit`` says when it is interrupted: where it stopped, and what became of the state passed in."""
    read = history["train"][-1]["step"] if history["train"] else 0
    of = f" of {num_steps}" if num_steps else ""
    lines = [f"fit was interrupted at step {taken}{of}; "
             + (f"the losses of steps 1 to {read} had been read back." if read else "no step had finished yet.")]
    lines.append("fit returns nothing when interrupted, so the variables on the left of `state, history = "
                 "fit(...)` still hold what they held before.")
    if donated:
        lines.append("The state passed in was donated to the first step (make_train_step(..., donate=True)), "
                     "so its buffers are gone: build a new state (training.init_state) before calling fit again, "
                     "or restore a checkpoint (lesson 11).")
    return "\n".join(lines)


class _ProgressBar:
    """``fit``'s progress bar: tqdm's text, shown as plain text in a notebook (updated in place), tqdm elsewhere.

    A notebook's tqdm is a widget: its stored output is a widget view that shows broken-link icons, or nothing, where
    the widget's code is missing (an HTML export, GitHub), and stays at its last drawn state after an interrupt.
    Plain text updated through a display handle is stored as its last state and reads the same everywhere.
    """

    def __init__(self, total: int | None, desc: str, enabled: bool):
        self.total, self.desc, self.n, self.loss = total, desc, 0, None
        self.start = time.perf_counter()
        self.shown_at, self.closed, self.handle, self.terminal = -1.0, False, None, None
        if not enabled:
            self.closed = True
        elif _in_notebook():
            from IPython.display import Pretty, display
            self.handle = display(Pretty(self.text()), display_id=True)
        else:
            self.terminal = tqdm(total=total, desc=desc, mininterval=1.0)

    def text(self, interrupted_at: int | None = None) -> str:
        postfix = None if self.loss is None else f"loss={self.loss:.4f}"
        line = tqdm.format_meter(self.n, self.total, time.perf_counter() - self.start, prefix=self.desc,
                                 postfix=postfix)
        return line + ("" if interrupted_at is None else f"  [interrupted at step {interrupted_at}]")

    def update(self, k: int, loss: float) -> None:
        if self.closed:
            return
        self.n, self.loss = self.n + k, loss
        if self.terminal is not None:
            self.terminal.update(k)
            self.terminal.set_postfix(loss=f"{loss:.4f}")
        elif time.perf_counter() - self.shown_at >= 0.5:       # at most two redraws a second
            self.show()

    def show(self, interrupted_at: int | None = None) -> None:
        from IPython.display import Pretty
        self.handle.update(Pretty(self.text(interrupted_at)))
        self.shown_at = time.perf_counter()

    def close(self, interrupted_at: int | None = None) -> None:
        if self.closed:
            return
        self.closed = True
        if self.terminal is not None:
            if interrupted_at is not None:
                self.terminal.set_description(f"{self.desc} (interrupted at step {interrupted_at})")
            self.terminal.close()
        else:
            self.show(interrupted_at)


def _in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (where output is a notebook's, not a terminal's)."""
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    return getattr(shell, "kernel", None) is not None


def _blocks(tree, where):
    """Each leaf's per-device blocks as NumPy arrays, in device order; typed PRNG keys as their raw key data."""
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not isinstance(leaf, jax.Array):
            raise TypeError(f"{where}: tree must hold arrays on the devices, but leaf {jax.tree_util.keystr(path)} "
                            f"is a {type(leaf).__name__}. Pass the replicated state (e.g. from fit), not a host copy.")
        shards = sorted(leaf.addressable_shards, key=lambda s: s.device.id)
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            out.append([np.asarray(jax.random.key_data(s.data)) for s in shards])
        else:
            out.append([np.asarray(s.data) for s in shards])
    return out


def max_divergence(tree) -> float:
    """The largest absolute difference between any device's copy of a replicated pytree and the first device's.

    Reads each device's block in place (``addressable_shards``); ``0.0`` means the copies agree. NaN if a copy
    holds a NaN (a NaN is never "no difference"), inf if one holds an inf where another does not. Typed PRNG
    keys are compared by their key data.
    """
    worst = 0.0
    for blocks in _blocks(tree, "max_divergence"):
        first = blocks[0].astype(np.float64)
        for b in blocks[1:]:
            if not b.size:
                continue
            d = float(np.max(np.abs(b.astype(np.float64) - first)))
            if np.isnan(d):
                return float("nan")
            worst = max(worst, d)
        if blocks[0].size and np.isnan(first).any():
            return float("nan")  # a single copy, or NaN in the same place on every copy
    return worst


def replicas_identical(tree) -> bool:
    """Whether every device's copy of a replicated pytree is bit-for-bit the same as the first device's."""
    for blocks in _blocks(tree, "replicas_identical"):
        if any(b.tobytes() != blocks[0].tobytes() for b in blocks[1:]):
            return False
    return True
