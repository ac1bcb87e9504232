"""Data-parallel training: one step built from your loss and an optax optimizer, and a bounded ``fit`` loop.

Lesson 05. The step is the one the lesson writes by hand: every device computes the
loss and gradients on its shard of the global batch, the gradients are averaged over
the devices, and every device applies the same optimizer update to its copy of the
parameters, which therefore stay identical.

``fit`` runs any step of the form ``step(state, batch) -> (state, metrics)`` (the one
from ``make_train_step`` or one you wrote), and never lets Python run more than
``max_ahead`` steps ahead of the devices (see ``fit``).

Three things make the library's step cheaper than the one a tutorial writes (lesson 09
measures them): everything the devices exchange in a step travels in one all-reduce
(``psum_bucketed``), ``fit`` runs ``steps_per_call`` steps per dispatch, fused with
``lax.scan`` (``TrainStep.steps``), and the step donates its input state, writing the new
state into the old one's buffers (``make_train_step(..., donate=True)``).
"""

from __future__ import annotations

import collections
import itertools
from typing import Any, Callable, Iterable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from tqdm.auto import tqdm

from . import sharding

__all__ = ["TrainState", "TrainStep", "BACKENDS", "init_state", "masked_mean", "psum_bucketed", "device_step",
           "make_train_step", "fit", "replicas_identical", "max_divergence"]

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


def _check_backend(backend):
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}.")


def init_state(params, optimizer: optax.GradientTransformation, key: jax.Array, devices=None,
               backend: str = "pmap") -> TrainState:
    """Initialise the optimizer and put everything on the devices.

    ``backend="pmap"``: one copy per device stacked on a new axis, ``(...) -> (n, ...)`` per leaf
    (``sharding.replicate``). ``"shard_map"`` and ``"jit"``: the same shapes, replicated with
    ``NamedSharding(mesh, P())`` (``sharding.replicate_on_mesh``).
    """
    _check_backend(backend)
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
    mask = mask.reshape(mask.shape + (1,) * (values.ndim - mask.ndim)).astype(values.dtype)
    per_row = values.size // max(values.shape[0], 1)
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask) * per_row, 1.0)


def _count(batch):
    """A shard's weight in the average: its number of real examples, or 1 without a mask."""
    if isinstance(batch, dict) and "mask" in batch:
        return jnp.sum(batch["mask"]).astype(jnp.float32)
    return jnp.float32(1.0)


def _step_key(state, device_index):
    return jax.random.fold_in(jax.random.fold_in(state.key, state.step), device_index)


def psum_bucketed(tree, axis_name=AXIS):
    """``psum`` of every leaf of ``tree`` over ``axis_name`` in a single all-reduce.

    The leaves are raveled into one vector (promoted to a common dtype), summed across the devices, and cut back
    into the tree: the same values as ``jax.tree.map(lambda v: lax.psum(v, axis_name), tree)``, with one
    collective instead of one per leaf. This is "gradient bucketing": each all-reduce has a fixed cost (every
    device must arrive before any can leave), so few large ones beat many small ones. Use it inside a mapped
    function (``pmap``/``shard_map``) where ``axis_name`` is bound.
    """
    flat, unravel = ravel_pytree(tree)
    return unravel(jax.lax.psum(flat, axis_name))


def device_step(loss_fn, optimizer, has_aux=False, axis_name=AXIS, in_shard_map=False):
    """One device's view of a step: local gradients, a weighted average over ``axis_name``, the update.

    ``step(state, shard) -> (state, metrics)``, unmapped: what ``make_train_step`` gives to ``jax.pmap``
    (or, with ``in_shard_map=True``, to ``jax.shard_map``). Use it to build your own mapped step, e.g. one
    that fuses several steps per dispatch with ``jax.lax.scan`` (lesson 08).
    """

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
        count = _count(batch)
        weighted = (jax.tree.map(lambda g: g * count, grads), loss * count, jax.tree.map(lambda a: a * count, aux))
        (grads, loss, aux), total = psum_bucketed((weighted, count), axis_name)
        grads, loss, aux = jax.tree.map(lambda v: v / total, (grads, loss, aux))
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": loss, **aux}
        return TrainState(params, opt_state, state.key, state.step + 1), metrics

    return step


def _global_step(loss_fn, optimizer, has_aux, n):
    """The same step written for the whole global batch ``(n, B // n, ...)``; the compiler splits it."""

    def step(state: TrainState, batch):
        keys = jax.vmap(lambda i: _step_key(state, i))(jnp.arange(n))

        def weighted_loss(params):
            out = jax.vmap(loss_fn, in_axes=(None, 0, 0))(params, batch, keys)   # one loss per shard
            losses, aux = out if has_aux else (out, {})
            counts = jax.vmap(_count)(batch) if isinstance(batch, dict) and "mask" in batch else jnp.ones(n)
            weights = counts / jnp.sum(counts)
            return jnp.sum(losses * weights), jax.tree.map(lambda a: jnp.sum(a * weights), aux)

        (loss, aux), grads = jax.value_and_grad(weighted_loss, has_aux=True)(state.params)
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

    def __init__(self, one, many, backend, place, donate=False):
        self._one, self._many, self._place = one, many, place
        self.backend, self.donate = backend, donate

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
                    axis_name: str = AXIS, devices=None, backend: str = "pmap", donate: bool = True) -> TrainStep:
    """A data-parallel training step, with one of three backends that compute the same thing.

    Args:
      loss_fn: ``loss_fn(params, batch, key) -> loss`` (or ``(loss, metrics)`` with ``has_aux``): the mean
        loss over one device's shard of the batch. ``batch`` is what the data iterator yields, one device's
        part (``(B // n, ...)`` per leaf); ``key`` is a PRNG key different on every device and every step
        (``fold_in`` of the step and the device's index), for dropout or noise.
      optimizer: an optax optimizer.
      has_aux: ``loss_fn`` returns ``(loss, metrics dict)``.
      backend: how the step is spread over the devices (lesson 06):

        * ``"pmap"``: ``jax.pmap`` of the per-device step, state replicated as ``(n, ...)``;
        * ``"shard_map"``: ``jax.jit(jax.shard_map(...))`` of the same per-device step, state replicated
          with ``P()``, batch split with ``P(axis_name)``;
        * ``"jit"``: plain ``jax.jit`` of the step written for the whole global batch; the inputs'
          shardings tell the compiler to split it, and it inserts the gradient all-reduce itself.
      donate: hand the input state's buffers to the output state (``donate_argnums``), so a step updates the
        parameters and optimizer state in place instead of allocating a fresh copy. The state passed in is
        deleted: write ``state, metrics = step(state, batch)``.

    Returns:
      a ``TrainStep``: ``step(state, batch) -> (state, metrics)`` for a state from
      ``init_state(..., backend=backend)`` and a sharded batch ``(n, B // n, ...)`` as ``data.batches`` yields,
      and ``step.steps(state, [batch, ...])`` for several steps in one dispatch. Gradients, loss and metrics are averaged
      over the devices, weighted by each device's number of real examples (``batch["mask"]``, if present),
      so padding counts for nothing.
    """
    _check_backend(backend)
    donated = (0,) if donate else ()
    mesh = sharding.device_mesh(devices)
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
        per_device = device_step(loss_fn, optimizer, has_aux, axis_name)
        one, many = (jax.pmap(f, axis_name=axis_name, devices=devices, donate_argnums=donated)
                     for f in (per_device, _scanned(per_device)))
        # pmap takes device arrays as they are; host arrays are split over its devices, as pmap itself would.
        return TrainStep(one, many, backend, placer(lambda x: isinstance(x, jax.Array)), donate)
    if backend == "shard_map":
        per_device = device_step(loss_fn, optimizer, has_aux, axis_name, in_shard_map=True)

        def squeezed(f):  # shard_map keeps rank: this device's block is (1, B // n, ...)
            return lambda state, batches: f(state, jax.tree.map(lambda x: x[0], batches))

        one, many = (jax.jit(jax.shard_map(squeezed(f), mesh=mesh, in_specs=(P(), P(axis_name)),
                                           out_specs=(P(), P())), donate_argnums=donated)
                     for f in (per_device, _scanned(per_device)))
    else:
        global_step = _global_step(loss_fn, optimizer, has_aux, mesh.size)
        one, many = (jax.jit(f, out_shardings=(replicated, replicated), donate_argnums=donated)
                     for f in (global_step, _scanned(global_step)))
    # Host arrays are split over the mesh; global arrays built by each process from its own part of the batch
    # (jax.make_array_from_process_local_data, lesson 08) are already in place.
    return TrainStep(one, many, backend, placer(
        lambda x: isinstance(x, jax.Array) and x.sharding.is_equivalent_to(split, x.ndim)), donate)


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
        max_ahead: int = 20, prefetch: int = 0, progress: bool = True, desc: str = "training"):
    """Run ``step`` over ``batches``; return the final state and a history of metrics.

    Two rules make the loop fast and safe (lesson 08 measures both):

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
        faster (lesson 09).
      progress: show a tqdm progress bar.

    Returns:
      ``(state, history)``; ``history["train"]`` is a list of ``{"step", "loss", ...}`` for every step,
      ``history["eval"]`` a list of ``{"step", ...}`` from ``eval_fn``.

    Raises:
      ValueError: bad ``num_steps``/``steps_per_call``/``max_ahead``/``eval_every``, a batch not sharded for the
        state's devices, or no batches at all.
    """
    def whole(v):
        return isinstance(v, int) and not isinstance(v, bool) and v >= 1

    if num_steps is not None and not whole(num_steps):
        raise ValueError(f"num_steps must be a whole number >= 1 (or None for every batch), got {num_steps!r}.")
    if not whole(steps_per_call):
        raise ValueError(f"steps_per_call must be a whole number >= 1, got {steps_per_call!r}.")
    fused = steps_per_call if steps_per_call > 1 and callable(getattr(step, "steps", None)) else 1
    if not whole(max_ahead) or max_ahead < fused:
        raise ValueError(f"max_ahead must be a whole number >= steps_per_call ({fused}), got {max_ahead!r}; "
                         f"use max_ahead={2 * fused} to keep the devices busy while Python reads results.")
    if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0:
        raise ValueError(f"prefetch must be a whole number >= 0 (dispatches placed ahead), got {prefetch!r}.")
    if eval_every is not None and (eval_fn is None or not whole(eval_every)):
        raise ValueError("eval_every needs an eval_fn and a whole number >= 1.")
    try:
        iterator = iter(batches)
    except TypeError:
        raise TypeError(f"batches must be an iterable of sharded batches (e.g. course_lib.data.batches(...)), "
                        f"got {type(batches).__name__}.") from None
    if num_steps is not None:
        iterator = itertools.islice(iterator, num_steps)
    n = len(jax.tree.leaves(state)[0].devices())  # the devices the state lives on, whatever the backend
    if prefetch and callable(getattr(step, "place", None)):
        iterator = _placed_ahead(iterator, step.place, fused, prefetch, n)
    history = {"train": [], "eval": []}
    in_flight = collections.deque()  # (first step, number of steps, metrics), oldest first
    bar = tqdm(total=num_steps, desc=desc, disable=not progress, mininterval=1.0)

    def read_oldest():
        first, k, metrics = in_flight.popleft()
        # Waits for these steps to finish: the bound on running ahead. The metrics are the same on every device
        # (averaged over all of them), so one device's copy is read, not a gather from all of them.
        values = jax.device_get({name: _first_copy(v) for name, v in metrics.items()})
        values = {name: np.asarray(v).reshape(-1, k)[0] for name, v in values.items()}
        for j in range(k):
            history["train"].append({"step": first + j, **{name: float(v[j]) for name, v in values.items()}})
        bar.update(k)
        bar.set_postfix(loss=f"{history['train'][-1]['loss']:.4f}")

    def dispatch(first, group):
        nonlocal state
        while in_flight and sum(k for _, k, _ in in_flight) + len(group) > max_ahead:
            read_oldest()
        if len(group) > 1:
            state, metrics = step.steps(state, group)
        else:
            state, metrics = step(state, group[0])
        in_flight.append((first, len(group), metrics))

    def run(last, group):  # a full group in one dispatch; a short one a step at a time (no new compile)
        if len(group) == fused:
            dispatch(last - len(group) + 1, group)
        else:
            for j, batch in enumerate(group):
                dispatch(last - len(group) + 1 + j, [batch])

    def evaluate(i):
        history["eval"].append({"step": i, **{k: float(v) for k, v in eval_fn(state).items()}})

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
