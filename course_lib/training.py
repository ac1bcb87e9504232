"""Data-parallel training: one step built from your loss and an optax optimizer, and a bounded ``fit`` loop.

Lesson 05. The step is the one the lesson writes by hand: every device computes the
loss and gradients on its shard of the global batch, the gradients are averaged over
the devices, and every device applies the same optimizer update to its copy of the
parameters, which therefore stay identical.

``fit`` runs any step of the form ``step(state, batch) -> (state, metrics)`` (the one
from ``make_train_step`` or one you wrote), and never lets Python run more than
``sync_every`` steps ahead of the devices (see ``fit``).
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from . import sharding

__all__ = ["TrainState", "init_state", "masked_mean", "make_train_step", "fit", "replicas_identical",
           "max_divergence"]

AXIS = "devices"


class TrainState(NamedTuple):
    """Everything a step updates, replicated on the devices: each leaf is ``(n_devices, ...)``."""

    params: Any
    opt_state: Any
    key: jax.Array
    step: jax.Array


def init_state(params, optimizer: optax.GradientTransformation, key: jax.Array, devices=None) -> TrainState:
    """Initialise the optimizer and replicate everything on the devices (``(...) -> (n, ...)`` per leaf)."""
    state = TrainState(params, optimizer.init(params), key, jnp.zeros((), jnp.int32))
    return sharding.replicate(state, devices)


def masked_mean(values, mask=None):
    """Mean of ``values`` ``(b, ...)`` over the rows where ``mask`` ``(b,)`` is true; 0 if there are none.

    Use it for a per-device loss so that padding rows (``data.batches(remainder="pad")``) count for nothing.
    """
    if mask is None:
        return jnp.mean(values)
    mask = mask.reshape(mask.shape + (1,) * (values.ndim - mask.ndim)).astype(values.dtype)
    per_row = values.size // max(values.shape[0], 1)
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask) * per_row, 1.0)


def make_train_step(loss_fn: Callable, optimizer: optax.GradientTransformation, *, has_aux: bool = False,
                    axis_name: str = AXIS, devices=None) -> Callable:
    """A pmapped data-parallel training step.

    Args:
      loss_fn: ``loss_fn(params, batch, key) -> loss`` (or ``(loss, metrics)`` with ``has_aux``): the mean
        loss over one device's shard of the batch. ``batch`` is what the data iterator yields, one device's
        part (``(B // n, ...)`` per leaf); ``key`` is a PRNG key different on every device and every step
        (``fold_in`` of the step and ``axis_index``), for dropout or noise.
      optimizer: an optax optimizer.
      has_aux: ``loss_fn`` returns ``(loss, metrics dict)``.

    Returns:
      ``step(state, batch) -> (state, metrics)`` over replicated ``TrainState`` and a sharded batch
      ``(n, B // n, ...)``. Gradients, loss and metrics are averaged over the devices, weighted by each
      device's number of real examples (``batch["mask"]``, if present), so padding counts for nothing.
    """

    def step(state: TrainState, batch):
        key = jax.random.fold_in(jax.random.fold_in(state.key, state.step), jax.lax.axis_index(axis_name))
        grad_fn = jax.value_and_grad(loss_fn, has_aux=has_aux)
        out, grads = grad_fn(state.params, batch, key)
        loss, aux = out if has_aux else (out, {})
        # Each device's weight is its number of real examples; without a mask all weigh the same (a pmean).
        count = jnp.sum(batch["mask"]).astype(jnp.float32) if isinstance(batch, dict) and "mask" in batch \
            else jnp.float32(1.0)
        total = jax.lax.psum(count, axis_name)

        def average(v):
            return jax.lax.psum(v * count, axis_name) / total

        grads = jax.tree.map(average, grads)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": average(loss), **jax.tree.map(average, aux)}
        return TrainState(params, opt_state, state.key, state.step + 1), metrics

    return jax.pmap(step, axis_name=axis_name, devices=devices)


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


def fit(step: Callable, state: TrainState, batches: Iterable, *, num_steps: int | None = None,
        eval_fn: Callable | None = None, eval_every: int | None = None, sync_every: int = 10,
        progress: bool = True, desc: str = "training"):
    """Run ``step`` over ``batches``; return the final state and a history of metrics.

    Never more than ``sync_every`` steps ahead of the devices. JAX dispatches work
    asynchronously, so a loop that never reads a result would queue steps as fast as
    Python can issue them: memory for their inputs piles up, errors surface far from
    their cause, and on some JAX versions (0.9 to 0.10 on a 2-core CPU) a long queue of
    collectives aborted in a rendezvous. Every ``sync_every`` steps ``fit`` fetches the
    queued metrics, which waits for those steps to finish; between syncs nothing is read,
    so the devices are not stalled by a host read every step (lesson 08 measures that).

    Args:
      step: ``step(state, batch) -> (state, metrics)``, e.g. from ``make_train_step``.
      state: the replicated ``TrainState`` (or any pytree your step takes).
      batches: an iterable of sharded batches, e.g. ``data.batches(...)``.
      num_steps: stop after this many steps (default: when ``batches`` ends).
      eval_fn: ``eval_fn(state) -> dict`` of numbers, called every ``eval_every`` steps and at the end.
      sync_every: the most steps dispatched ahead of the devices.
      progress: show a tqdm progress bar.

    Returns:
      ``(state, history)``; ``history["train"]`` is a list of ``{"step", "loss", ...}`` for every step,
      ``history["eval"]`` a list of ``{"step", ...}`` from ``eval_fn``.

    Raises:
      ValueError: bad ``num_steps``/``sync_every``/``eval_every``, a batch not sharded for the state's
        devices, or no batches at all.
    """
    if num_steps is not None and (not isinstance(num_steps, int) or num_steps < 1):
        raise ValueError(f"num_steps must be a whole number >= 1 (or None for every batch), got {num_steps!r}.")
    if not isinstance(sync_every, int) or sync_every < 1:
        raise ValueError(f"sync_every must be a whole number >= 1, got {sync_every!r}.")
    if eval_every is not None and (eval_fn is None or not isinstance(eval_every, int) or eval_every < 1):
        raise ValueError("eval_every needs an eval_fn and a whole number >= 1.")
    try:
        iterator = iter(batches)
    except TypeError:
        raise TypeError(f"batches must be an iterable of sharded batches (e.g. course_lib.data.batches(...)), "
                        f"got {type(batches).__name__}.") from None
    if num_steps is not None:
        iterator = itertools.islice(iterator, num_steps)
    n = jax.tree.leaves(state)[0].shape[0]
    history = {"train": [], "eval": []}
    pending = []
    bar = tqdm(total=num_steps, desc=desc, disable=not progress, mininterval=1.0)

    def sync():
        values = jax.device_get([m for _, m in pending])  # waits for these steps: the bound on running ahead
        for (i, _), m in zip(pending, values):
            history["train"].append({"step": i, **{k: float(np.asarray(v).reshape(-1)[0]) for k, v in m.items()}})
        bar.update(len(pending))
        if history["train"]:
            bar.set_postfix(loss=f"{history['train'][-1]['loss']:.4f}")
        pending.clear()

    def evaluate(i):
        history["eval"].append({"step": i, **{k: float(v) for k, v in eval_fn(state).items()}})

    i = 0
    try:
        for i, batch in enumerate(iterator, start=1):
            if i == 1:
                _check_batch(batch, n)
            state, metrics = step(state, batch)
            pending.append((i, metrics))
            if len(pending) >= sync_every:
                sync()
            if eval_every and i % eval_every == 0:
                sync()
                evaluate(i)
        sync()
    finally:
        bar.close()
    if i == 0:
        raise ValueError("fit got no batches: the iterable was empty (an empty dataset, or a finished iterator?).")
    if eval_fn is not None and (not history["eval"] or history["eval"][-1]["step"] != i):
        evaluate(i)
    return state, history


def max_divergence(tree) -> float:
    """The largest absolute difference between any device's copy of a replicated pytree and the first device's.

    Reads each device's block in place (``addressable_shards``); ``0.0`` means the copies agree.
    """
    worst = 0.0
    for leaf in jax.tree.leaves(tree):
        blocks = [np.asarray(s.data) for s in sorted(leaf.addressable_shards, key=lambda s: s.device.id)]
        for b in blocks[1:]:
            worst = max(worst, float(np.max(np.abs(b.astype(np.float64) - blocks[0]))) if b.size else 0.0)
    return worst


def replicas_identical(tree) -> bool:
    """Whether every device's copy of a replicated pytree is bit-for-bit the same as the first device's."""
    for leaf in jax.tree.leaves(tree):
        blocks = [np.asarray(s.data) for s in leaf.addressable_shards]
        if any(b.tobytes() != blocks[0].tobytes() for b in blocks[1:]):
            return False
    return True
