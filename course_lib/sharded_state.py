"""Sharded training state: ZeRO stages 1 and 2, FSDP (ZeRO 3), gradient accumulation, mixed precision.

Lesson 10. Plain data parallelism keeps a whole copy of the parameters and the optimizer state on every device.
The stages here keep less, and all of them compute the same training (to float tolerance):

=============  ===================  ======================  ==================  ===================================
stage          parameters           gradient accumulator    optimizer state     collectives per step (bytes sent)
=============  ===================  ======================  ==================  ===================================
"replicated"   whole, every device  whole                   whole               all-reduce (2x)
"zero1"        whole, every device  whole                   1/n slice per dev.  reduce-scatter, all-gather (2x)
"zero2"        whole, every device  1/n slice               1/n slice           reduce-scatter, all-gather (2x)
"fsdp"         1/n slice            1/n slice               1/n slice           all-gather twice, reduce-scatter (3x)
=============  ===================  ======================  ==================  ===================================

"2x" is the parameters' bytes times ``2 (n-1)/n`` per device with ring algorithms: ZeRO-1 and ZeRO-2 send what
data parallelism sends (a reduce-scatter and an all-gather are the two halves of an all-reduce); FSDP gathers the
parameters again for the backward pass (its remat policy, ``FSDP_REMAT_POLICY``, keeps only matmul outputs), 1.5x
data parallelism. Gathering the whole flat vector, as here, that second gather gives FSDP's traffic but not a lower
peak (the backward pass needs the whole vector again anyway); it saves memory when each gather is one layer, inside
a ``lax.scan`` with ``jax.checkpoint`` per layer (lesson 10, section 3). ZeRO-1 and ZeRO-2 differ only with ``accumulate > 1``: ZeRO-1 adds whole local gradients over
the micro-batches and reduce-scatters once; ZeRO-2 reduce-scatters each micro-batch's gradient and keeps only its
slice. In one step without accumulation they compile to the same program.

Layout. As DeepSpeed's ZeRO does, the parameters are raveled into one flat float32 vector of ``P`` numbers, padded
with zeros to ``P_pad``, a multiple of the device count ``n``: device ``i`` owns ``[i * P_pad // n, (i + 1) *
P_pad // n)``. So no parameter's shape has to divide by ``n``. The optimizer sees that flat vector (or its slice),
which is exact for element-wise optimizers (``optax.sgd``, ``adam``, ``adamw``, ...) but not for ones that look at
a whole leaf or the global norm (``lamb``, ``clip_by_global_norm``): use element-wise ones here.

The step is ``jax.jit`` of ``jax.shard_map`` over a 1-D mesh with the vma checker on (``check_vma=True``), and
donates the state (``donate_argnums=0``: the old state's buffers are reused for the new one, so a state passed to
a step cannot be used again). The batch's leading axis is split over the mesh. ``accumulate=K`` splits each
device's part of the batch into ``K`` micro-batches and adds their gradients in a ``lax.scan`` (see above for what
each stage keeps between them). ``compute_dtype=jnp.bfloat16`` runs forward and backward in bfloat16 (and
writes the gradients' and, for FSDP, the gathered parameters' collectives in bfloat16; XLA's CPU compiler makes
them float32), while the parameters and the optimizer
state stay float32 ("master weights").

Measuring: ``live_bytes`` (what each device holds now, from ``addressable_shards``), ``compiled_memory`` (the
compiled step's ``memory_analysis()``, with its ``peak``), ``formula_bytes`` and ``formula_sent`` (the ZeRO paper's
arithmetic for memory and traffic), and ``communication`` (the collectives in a compiled step's HLO, with their
bytes).
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import math
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from . import _checks

__all__ = ["STAGES", "AXIS", "Layout", "ShardedState", "data_mesh", "init_state", "make_train_step", "params_of",
           "live_bytes", "state_bytes", "compiled_memory", "formula_bytes", "formula_sent", "Collective", "collectives",
           "communication", "ring_bytes", "dataflow", "bench_variants", "COMPUTE_DTYPES", "FSDP_REMAT_POLICY"]

STAGES = ("replicated", "zero1", "zero2", "fsdp")
AXIS = "data"
# The dtypes the forward and backward pass may run in: float32, or bfloat16/float16 with float32 master weights.
COMPUTE_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
# FSDP's remat policy: keep the matmul outputs for the backward pass and recompute the rest, the gather included
# (the weights the backward pass multiplies by are not matmul outputs, so they are gathered again).
FSDP_REMAT_POLICY = jax.checkpoint_policies.dots_with_no_batch_dims_saveable


def _check_stage(stage, where):
    if not any(stage == s and type(stage) is str for s in STAGES):
        _fail(where, "stage", "one of " + ", ".join(repr(s) for s in STAGES), stage,
                     "'replicated' keeps everything whole; 'zero1' shards the optimizer state, 'zero2' also the "
                     "reduced gradients, 'fsdp' also the parameters.")


def _check_state(state, where, name="state"):
    if not isinstance(state, ShardedState):
        other = (" (a training.TrainState is for training.make_train_step)"
                 if type(state).__name__ == "TrainState" else "")
        raise TypeError(f"{where}: {name} must be a ShardedState, got {type(state).__name__}{other}. Make one with "
                        "sharded_state.init_state(params, optimizer, mesh, stage=...).")


_named = _checks.shown  # a value for an error message (a function by its name, no memory addresses)
_fail = _checks.fail

def _check_optimizer(optimizer, where):
    if not (callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None))):
        fix = ("Call it to build the optimizer, e.g. optax.adam(1e-3), not optax.adam." if callable(optimizer)
               else "Pass e.g. optax.adam(1e-3).")
        raise TypeError(f"{where}: optimizer must be an optax.GradientTransformation, got {_named(optimizer)}. {fix}")


def _check_step(step, where):
    if not callable(getattr(step, "compile", None)) or not hasattr(step, "stage"):
        raise TypeError(f"{where}: step must be a step from sharded_state.make_train_step, got {_named(step)}. Pass "
                        "the step function make_train_step returned.")


def _opt_summary(opt_state) -> str:
    """An optimizer state's structure in words: its state classes and their array shapes."""
    def one(x):
        if hasattr(x, "_fields"):
            inner = ", ".join(f"{f}{list(np.shape(getattr(x, f)))}" if not hasattr(getattr(x, f), "_fields")
                              and not isinstance(getattr(x, f), (tuple, list, dict)) else f"{f}=..."
                              for f in x._fields)
            return f"{type(x).__name__}({inner})"
        if isinstance(x, (tuple, list)):
            return "(" + ", ".join(one(y) for y in x) + ")"
        if isinstance(x, dict):
            return "{" + ", ".join(f"{k!r}: {one(v)}" for k, v in x.items()) + "}"
        return f"{getattr(x, 'dtype', type(x).__name__)}{list(np.shape(x))}"
    return one(opt_state)


def _check_same_optimizer(optimizer, state) -> None:
    """Refuse a step whose optimizer keeps another state than the one ``state`` holds (before anything runs)."""
    layout = state.layout
    want = jax.eval_shape(optimizer.init, jax.ShapeDtypeStruct((layout.padded,), jnp.float32))
    got_leaves, got_def = jax.tree.flatten(state.opt_state)
    want_leaves, want_def = jax.tree.flatten(want)
    same = got_def == want_def and all(np.shape(a) == np.shape(b) and jnp.result_type(a) == jnp.result_type(b)
                                       for a, b in zip(got_leaves, want_leaves))
    if not same:
        raise ValueError(
            f"step: the state's optimizer state is {_opt_summary(state.opt_state)}, but this step's optimizer keeps "
            f"{_opt_summary(want)}: the step was built for another optimizer than the one given to init_state. "
            "Pass the same optimizer to init_state and make_train_step (one variable, e.g. optimizer = "
            "optax.adam(1e-3)).")


def data_mesh(devices=None, axis: str = AXIS) -> Mesh:
    """A 1-D mesh over ``devices`` (default: all of them), axis ``axis``, with Auto axes (lesson 06)."""
    devices = _checks.device_list(devices, "devices", "data_mesh")
    if not isinstance(axis, str) or not axis:
        _fail("data_mesh", "axis", "a non-empty string, the mesh axis's name", axis, f"Pass axis={AXIS!r}.",
                     TypeError)
    devices = jax.devices() if devices is None else devices
    return Mesh(np.array(devices), (axis,))


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a state's numbers live: static, hashable and compared by value (it keys the compiled step's cache, so
    two states of the same model and stage share one compiled program).

    ``n_params`` real parameters ``P`` raveled into a flat vector padded to ``padded`` ``P_pad`` (a multiple of
    ``mesh.size``); ``shapes``/``treedef`` rebuild the pytree.
    """

    stage: str
    mesh: Mesh
    axis: str
    n_params: int
    padded: int
    treedef: Any
    shapes: tuple
    dtypes: tuple

    @property
    def n_devices(self) -> int:
        return self.mesh.size

    @property
    def shard_size(self) -> int:
        """``P_pad // n``: how many of the flat parameters each device owns."""
        return self.padded // self.mesh.size

    def ravel(self, tree, dtype=jnp.float32):
        """pytree -> flat ``(P_pad,)`` in ``dtype``, zero-padded."""
        flat = jnp.concatenate([jnp.ravel(x).astype(dtype) for x in jax.tree.leaves(tree)])
        return jnp.pad(flat, (0, self.padded - self.n_params))

    def unravel(self, flat):
        """flat ``(P_pad,)`` (or ``(P,)``) -> the pytree, each leaf in ``flat``'s dtype (no cast back)."""
        leaves, start = [], 0
        for shape in self.shapes:
            size = math.prod(shape)
            leaves.append(flat[start:start + size].reshape(shape))
            start += size
        return jax.tree.unflatten(self.treedef, leaves)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ShardedState:
    """The training state of one stage.

    * ``params``: the flat float32 parameters ``(P_pad,)``; ``P()`` (whole on every device), or for ``"fsdp"``
      ``P(axis)`` (a ``(P_pad // n,)`` slice per device). ``params_of(state)`` gives the pytree back.
    * ``opt_state``: the optimizer's state for that flat vector; every ``(P_pad,)`` leaf is ``P()`` for
      ``"replicated"`` and ``P(axis)`` for the other stages; scalars (Adam's step count) are ``P()``.
    * ``step``: ``()`` int32, ``P()``.
    * ``layout``: static; see ``Layout``.
    """

    params: jax.Array
    opt_state: Any
    step: jax.Array
    layout: Layout = dataclasses.field(metadata=dict(static=True))


def _opt_specs(opt_state, layout):
    sharded = layout.stage != "replicated"
    return jax.tree.map(lambda x: P(layout.axis) if sharded and np.ndim(x) >= 1 and np.shape(x)[0] == layout.padded
                        else P(), opt_state)


def _state_specs(state: ShardedState):
    layout = state.layout
    return ShardedState(P(layout.axis) if layout.stage == "fsdp" else P(), _opt_specs(state.opt_state, layout),
                        P(), layout)


def init_state(params, optimizer: optax.GradientTransformation, mesh: Mesh | None = None,
               stage: str = "replicated") -> ShardedState:
    """Ravel ``params``, initialise ``optimizer`` on the flat vector, and place everything for ``stage``.

    Args:
      params: a pytree of float arrays (any shapes; nothing has to divide by the device count).
      optimizer: an element-wise optax optimizer (see the module docstring).
      mesh: a 1-D mesh (default ``data_mesh()``, all devices, axis ``"data"``).
      stage: one of ``STAGES``.

    Returns:
      a ``ShardedState``; its ``params`` and the optimizer's vectors are ``(P_pad,)`` with ``P_pad`` the parameter
      count rounded up to a multiple of ``mesh.size``, placed ``P()`` or ``P(axis)`` as the stage says.
    """
    _check_stage(stage, "init_state")
    _check_optimizer(optimizer, "init_state")
    mesh = data_mesh() if mesh is None else mesh
    if not isinstance(mesh, Mesh):
        _fail("init_state", "mesh", "a jax.sharding.Mesh", mesh,
                     "Build one with sharded_state.data_mesh(devices).", TypeError)
    if len(mesh.axis_names) != 1:
        _fail("init_state", "mesh", "1-D (one data axis)", mesh,
                     "Build one with sharded_state.data_mesh(devices).")
    leaves, treedef = jax.tree.flatten(params)
    if isinstance(params, ShardedState):
        raise TypeError("init_state: params must be a pytree of float arrays, got a ShardedState. Pass the model's "
                        "parameters (sharded_state.params_of(state) gives them back).")
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        try:
            dtype = jnp.result_type(x)
        except TypeError:
            dtype = None
        if dtype is None or isinstance(x, (str, bytes)):
            _fail("init_state", f"params leaf {jax.tree_util.keystr(path) or '(the root)'}", "an array",
                         x, "Every leaf of params must be a float array, e.g. jnp.zeros((3,)).", TypeError)
    if not leaves or not all(jnp.issubdtype(jnp.result_type(x), jnp.floating) for x in leaves):
        raise ValueError("init_state: params must be a non-empty pytree of float arrays, got leaves of dtypes "
                         f"{[str(jnp.result_type(x)) for x in leaves]}. Cast them, e.g. "
                         "jax.tree.map(lambda x: x.astype(jnp.float32), params).")
    n_params = sum(int(np.size(x)) for x in leaves)
    n = mesh.size
    layout = Layout(stage, mesh, mesh.axis_names[0], n_params, -(-n_params // n) * n, treedef,
                    tuple(np.shape(x) for x in leaves), tuple(str(jnp.result_type(x)) for x in leaves))
    flat = layout.ravel(params)
    opt_state = optimizer.init(flat)
    state = ShardedState(flat, opt_state, jnp.zeros((), jnp.int32), layout)
    specs = _state_specs(state)
    return jax.device_put(state, jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                                              is_leaf=lambda s: isinstance(s, P)))


def params_of(state: ShardedState):
    """The parameters as the pytree ``init_state`` got, float32 (gathered if they were sharded)."""
    _check_state(state, "params_of")
    layout = state.layout
    flat = state.params[:layout.n_params]
    return jax.tree.map(lambda x, d: x.astype(d), layout.unravel(flat),
                        jax.tree.unflatten(layout.treedef, list(layout.dtypes)))


def make_train_step(loss_fn: Callable, optimizer: optax.GradientTransformation, *, stage: str = "replicated",
                    accumulate: int = 1, compute_dtype=jnp.float32):
    """A data-parallel step for a ``ShardedState`` of ``stage``: ``step(state, batch) -> (state, {"loss": ...})``.

    Args:
      loss_fn: ``loss_fn(params, batch) -> loss``, the mean loss over the examples of ``batch`` (a micro-batch of
        one device's part), for ``params`` the pytree ``init_state`` got, in ``compute_dtype``.
      optimizer: the optax optimizer given to ``init_state``.
      stage: one of ``STAGES``; must be the state's.
      accumulate: ``K``, micro-batches per device per step, in a ``lax.scan``: ``"replicated"`` and ``"zero1"``
        add whole local gradients and communicate once after the loop; ``"zero2"`` and ``"fsdp"`` reduce-scatter
        every micro-batch's gradient and add their slices (``K`` times the gradient traffic). The result is one
        step on the whole batch.
      compute_dtype: the dtype of the forward and backward pass and of the communicated gradients (and, for
        ``"fsdp"``, of the gathered parameters) as the program is written; XLA's CPU compiler turns bfloat16
        collectives into float32 ones, so read ``step.compile(...).as_text()`` for what a backend sends.
        Parameters and optimizer state stay float32.

    The step takes a global ``batch``, leaves ``(B, ...)`` with ``B`` a multiple of ``n * K``, splits it over the
    mesh, ``(B // n, ...)`` per device, and returns the loss averaged over the whole batch, ``()``. Each batch shape
    compiles once; ``step.compile(state, batch)`` gives that compiled program (its HLO, its memory analysis),
    ``step.lower(state, batch)`` the program before the backend compiler and ``step.trace(state, batch)`` its
    jaxpr. The step donates ``state``: use the state it returns, not the one passed in.
    """
    _check_stage(stage, "make_train_step")
    if not callable(loss_fn):
        _fail("make_train_step", "loss_fn", "a function loss_fn(params, batch) -> loss", loss_fn,
                     "Pass the function itself, not the result of calling it.", TypeError)
    _check_optimizer(optimizer, "make_train_step")
    accumulate = _checks.whole(accumulate, "accumulate", "make_train_step",
                               fix="It is the number of micro-batches per step, e.g. accumulate=4.")
    try:
        dtype = jnp.dtype(compute_dtype)
    except TypeError:
        dtype = None
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        _fail("make_train_step", "compute_dtype", "a float dtype", compute_dtype if dtype is None else dtype,
                     "Pass jnp.float32 or jnp.bfloat16.")
    compute_dtype = dtype
    if compute_dtype not in COMPUTE_DTYPES:
        _fail("make_train_step", "compute_dtype", "one of " + ", ".join(d.name for d in COMPUTE_DTYPES),
              compute_dtype.name, "Pass jnp.float32, or jnp.bfloat16 for mixed precision (float32 master weights). "
              "float8 types need scaling recipes this step does not do; float64 needs jax_enable_x64.")
    compiled = {}
    checked_optimizer = {}

    def device_step(state: ShardedState, batch):
        """One device's part of the step, under shard_map with the vma checker on (check_vma=True)."""
        layout = state.layout
        axis, n, s = layout.axis, layout.n_devices, layout.shard_size
        mine = jax.lax.axis_index(axis) * s

        def micro(flat, mb):
            return loss_fn(layout.unravel(flat[:layout.n_params]), mb).astype(jnp.float32)

        if stage == "fsdp":
            # Gather inside the differentiated function: the transpose of a tiled all_gather is a psum_scatter,
            # so the gradient of the slice arrives summed and scattered. The remat policy keeps only the matmul
            # outputs for the backward pass, not the gathered vector: the backward gathers it again (FSDP's
            # third collective). For one whole-vector gather that is FSDP's traffic, not a lower peak.
            def gathered_loss(my_slice, mb):
                return micro(jax.lax.all_gather(my_slice, axis, tiled=True), mb)

            grad_fn = jax.value_and_grad(jax.checkpoint(gathered_loss, policy=FSDP_REMAT_POLICY))
            wrt = state.params.astype(compute_dtype)                       # (P_pad // n,), this device's slice
        else:
            # pcast to "varying": differentiate this device's own copy, so that jax.grad inserts no psum and the
            # step chooses its collective itself (psum for "replicated", psum_scatter for the ZeRO stages).
            grad_fn = jax.value_and_grad(micro)
            wrt = jax.lax.pcast(state.params.astype(compute_dtype), axis, to="varying")

        def reduce(g):
            """This device's local gradient -> what the stage keeps of the sum, float32."""
            if stage == "replicated":
                return jax.lax.psum(g.astype(compute_dtype), axis).astype(jnp.float32)          # all-reduce
            if stage == "fsdp":
                return g.astype(jnp.float32)                     # already reduce-scattered by the transpose
            return jax.lax.psum_scatter(g.astype(compute_dtype), axis, tiled=True).astype(jnp.float32)

        if accumulate == 1:
            loss, g = grad_fn(wrt, batch)
            grads = reduce(g)
        else:
            micro_batches = jax.tree.map(lambda x: x.reshape((accumulate, -1) + x.shape[1:]), batch)
            # What each stage keeps between micro-batches: "replicated" and "zero1" a whole local accumulator,
            # reduced once after the loop; "zero2" and "fsdp" reduce-scatter every micro-batch and keep only
            # their slice.
            per_micro = stage in ("zero2", "fsdp")

            def add(acc, mb):
                loss, g = grad_fn(wrt, mb)
                g = reduce(g) if per_micro else g.astype(jnp.float32)
                return (acc[0] + loss, acc[1] + g), None

            size = s if per_micro else layout.padded
            zeros = jax.lax.pcast((jnp.zeros((), jnp.float32), jnp.zeros((size,), jnp.float32)), axis,
                                  to="varying")
            (loss, grads), _ = jax.lax.scan(add, zeros, micro_batches)
            loss, grads = loss / accumulate, (grads if per_micro else reduce(grads)) / accumulate
        loss = jax.lax.pmean(loss, axis)
        grads = grads / n                                                      # the mean over the devices
        if stage in ("replicated", "fsdp"):
            p = state.params                                   # whole ("replicated") or already my slice
        else:
            p = jax.lax.dynamic_slice_in_dim(state.params, mine, s)
        updates, opt_state = optimizer.update(grads, state.opt_state, p)
        p = optax.apply_updates(p, updates)
        if stage in ("zero1", "zero2"):
            # every device gets the whole updated vector back; "invarying": the same on every device, so P()
            p = jax.lax.all_gather(p, axis, tiled=True, to="invarying")
        return ShardedState(p, opt_state, state.step + 1, layout), {"loss": loss}

    def program(state):
        _check_state(state, "step")
        if state.layout.stage != stage:
            raise ValueError(f"step: the state was made for stage {state.layout.stage!r} but this step is for {stage!r}: "
                             f"their parameters and optimizer state are placed differently. Use "
                             f"init_state(..., stage={stage!r}) or make_train_step(..., stage="
                             f"{state.layout.stage!r}).")
        layout = state.layout
        if layout not in checked_optimizer:
            _check_same_optimizer(optimizer, state)
            checked_optimizer[layout] = True
        if layout not in compiled:
            specs = _state_specs(state)
            compiled[layout] = jax.jit(jax.shard_map(device_step, mesh=layout.mesh, in_specs=(specs, P(layout.axis)),
                                                     out_specs=(specs, P()), check_vma=True), donate_argnums=0)
        return compiled[layout]

    executables = {}

    def compile(state, batch):
        """The compiled step for this state and batch shape (compiled once, then reused by ``step``):
        ``.as_text()`` for the HLO, ``.memory_analysis()`` for its memory."""
        return _compiled(state, _place_batch(batch, state.layout, accumulate))

    def _compiled(state, batch):
        run = program(state)
        key = (state.layout, jax.tree.structure(batch),
               tuple((x.shape, str(x.dtype)) for x in jax.tree.leaves(batch)))
        if key not in executables:
            executables[key] = run.lower(state, batch).compile()
        return executables[key]

    def step(state, batch):
        program(state)                      # checks the state before anything is placed
        batch = _place_batch(batch, state.layout, accumulate)
        return _compiled(state, batch)(state, batch)

    def lower(state, batch):
        """The program before the backend compiler (``.as_text(dialect="hlo")``), as ``jax.jit(...).lower``."""
        return program(state).lower(state, _place_batch(batch, state.layout, accumulate))

    def trace(state, batch):
        """The traced program (``.jaxpr``), as ``jax.jit(...).trace``: the shard_map and its check_vma setting."""
        return program(state).trace(state, _place_batch(batch, state.layout, accumulate))

    step.lower, step.compile, step.trace = lower, compile, trace
    step.stage, step.accumulate, step.compute_dtype = stage, accumulate, compute_dtype
    return step


def _place_batch(batch, layout: Layout, accumulate: int):
    _check_batch(batch, layout, accumulate, "step")
    split = NamedSharding(layout.mesh, P(layout.axis))
    return jax.tree.map(lambda x: x if isinstance(x, jax.Array) and x.sharding.is_equivalent_to(split, x.ndim)
                        else jax.device_put(x, split), batch)


def _check_batch(batch, layout: Layout, accumulate: int, where: str) -> None:
    n = layout.n_devices
    leaves = jax.tree_util.tree_flatten_with_path(batch)[0]
    if not leaves:
        _fail(where, "batch", "a pytree of arrays with a batch axis", batch,
                     "Pass e.g. {'x': x, 'y': y} with x (B, ...) and y (B,).", TypeError)
    sizes = {}
    for path, leaf in leaves:
        if isinstance(leaf, (str, bytes)) or not hasattr(leaf, "shape") and not isinstance(leaf, (int, float)):
            _fail(where, f"batch leaf {jax.tree_util.keystr(path) or '(the root)'}", "an array", leaf,
                         "Convert it with np.asarray.", TypeError)
        shape = np.shape(leaf)
        if shape:
            sizes.setdefault(shape[0], jax.tree_util.keystr(path) or "batch")
    if len(sizes) > 1:
        (a, name_a), (b, name_b) = list(sizes.items())[:2]
        raise ValueError(f"{where}: the leaves of batch must share one batch size, got {a} rows in {name_a} and {b} in "
                         f"{name_b}. Cut or pad them to the same number of rows.")
    for path, leaf in leaves:
        shape = np.shape(leaf)
        if shape and shape[0] == 0:
            raise ValueError(f"{where}: batch leaf {jax.tree_util.keystr(path) or '(the root)'} has shape {shape}: "
                             "an empty batch (0 rows) has no mean loss and would still advance the step. Pass at "
                             f"least {n * accumulate} rows (a multiple of {n} devices x {accumulate} micro-batches), "
                             "or skip the empty batch.")
        if len(shape) == 0 or shape[0] % (n * accumulate):
            b = shape[0] if shape else None
            raise ValueError(
                f"{where}: batch leaf {jax.tree_util.keystr(path) or '(the root)'} has shape {shape}: its leading (batch) axis "
                f"must divide into {n} devices x {accumulate} micro-batches, a multiple of {n * accumulate}. "
                + (f"Use a global batch of {(b // (n * accumulate)) * n * accumulate or n * accumulate}, or change "
                   "accumulate." if b is not None else "Give every leaf a batch axis."))


# ------------------------------------------------------------------------------------------------------------------
# Memory, per device


def live_bytes(tree) -> dict[int, int]:
    """``{device id: bytes}``: what each device holds of ``tree``'s arrays now (its ``addressable_shards``).

    Leaves that are not ``jax.Array`` (NumPy arrays, numbers) live on no device and count nothing."""
    out: dict[int, int] = {}
    for leaf in jax.tree.leaves(tree):
        if not isinstance(leaf, jax.Array):
            continue
        for s in leaf.addressable_shards:
            out[s.device.id] = out.get(s.device.id, 0) + s.data.nbytes
    return dict(sorted(out.items()))


def state_bytes(state: ShardedState) -> dict[str, int]:
    """Bytes on the fullest device, by category: ``{"params", "opt_state", "total"}`` (from live buffers)."""
    _check_state(state, "state_bytes")
    out = {name: max(live_bytes(getattr(state, name)).values(), default=0) for name in ("params", "opt_state")}
    out["total"] = max(live_bytes((state.params, state.opt_state, state.step)).values())
    return out


def compiled_memory(step, state, batch) -> dict[str, int]:
    """Per-device bytes of the compiled step (``step.compile``), from ``compiled.memory_analysis()``:
    ``{"arguments", "outputs", "temporaries", "aliased", "peak"}`` (arguments: state and batch; temporaries:
    gradients, activations and whatever else the step needs while it runs; aliased: output bytes written into
    donated arguments' buffers). ``peak = arguments + outputs - aliased + temporaries``: what the step needs at
    once, the figure to compare between stages."""
    _check_step(step, "compiled_memory")
    _check_state(state, "compiled_memory")
    _check_batch(batch, state.layout, step.accumulate, "compiled_memory")
    m = step.compile(state, batch).memory_analysis()
    out = {"arguments": int(m.argument_size_in_bytes), "outputs": int(m.output_size_in_bytes),
           "temporaries": int(m.temp_size_in_bytes), "aliased": int(m.alias_size_in_bytes)}
    out["peak"] = out["arguments"] + out["outputs"] - out["aliased"] + out["temporaries"]
    return out


def _formula_args(stage, n_params, n_devices, param_bytes, grad_bytes, where):
    """The arguments ``formula_bytes`` and ``formula_sent`` share, checked: (n_params, n_devices, param_bytes,
    grad_bytes) as whole numbers."""
    _check_stage(stage, where)
    return (_checks.whole(n_params, "n_params", where, minimum=0,
                          fix="It is the number of parameters, e.g. sum(p.size for p in jax.tree.leaves(params))."),
            _checks.whole(n_devices, "n_devices", where),
            _checks.whole(param_bytes, "param_bytes", where, fix="float32: 4, bfloat16: 2."),
            _checks.whole(grad_bytes, "grad_bytes", where, fix="float32: 4, bfloat16: 2."))


def formula_bytes(n_params: int, n_devices: int, stage: str, *, param_bytes: int = 4, grad_bytes: int = 4,
                  optimizer_copies: int = 2, optimizer_bytes: int = 4) -> dict[str, float]:
    """Bytes per device of parameters, gradients and optimizer state, by the ZeRO paper's arithmetic.

    ``optimizer_copies`` numbers of ``optimizer_bytes`` each per parameter (Adam: 2, its two moments). The stage
    divides by ``n_devices``: ``"zero1"`` the optimizer state, ``"zero2"`` also the gradients, ``"fsdp"`` also
    the parameters. ``"grads"`` is the gradient a device keeps across the micro-batches of a step (the
    accumulator): with one micro-batch per step, every stage still computes its whole local gradient before the
    reduce-scatter, so there ZeRO-1 and ZeRO-2 need the same (see ``compiled_memory``). Activations are not
    included: they depend on the batch, not on the stage.
    """
    n_params, n_devices, param_bytes, grad_bytes = _formula_args(stage, n_params, n_devices, param_bytes,
                                                                 grad_bytes, "formula_bytes")
    optimizer_copies = _checks.whole(optimizer_copies, "optimizer_copies", "formula_bytes", minimum=0,
                                     fix="Adam: 2 (its two moments), SGD with momentum: 1, plain SGD: 0.")
    optimizer_bytes = _checks.whole(optimizer_bytes, "optimizer_bytes", "formula_bytes", fix="float32: 4.")
    split = {"replicated": (1, 1, 1), "zero1": (1, 1, n_devices), "zero2": (1, n_devices, n_devices),
             "fsdp": (n_devices, n_devices, n_devices)}[stage]
    out = {"params": n_params * param_bytes / split[0], "grads": n_params * grad_bytes / split[1],
           "opt_state": n_params * optimizer_copies * optimizer_bytes / split[2]}
    out["total"] = sum(out.values())
    return out


def formula_sent(n_params: int, n_devices: int, stage: str, *, param_bytes: int = 4,
                 grad_bytes: int = 4) -> float:
    """Bytes each device sends per step for ``stage`` with ring algorithms (gradients in ``grad_bytes``, gathered
    parameters in ``param_bytes``), the loss's few bytes left out. With ``f = (n-1)/n`` and ``N = n_params``:
    "replicated" one all-reduce, ``2 f N grad_bytes``; "zero1"/"zero2" a reduce-scatter and an all-gather,
    ``f N (grad_bytes + param_bytes)``; "fsdp" an all-gather for the forward, one again for the backward and a
    reduce-scatter, ``f N (2 param_bytes + grad_bytes)``. This is one micro-batch per step: with ``accumulate=K``,
    "zero2" and "fsdp" reduce-scatter every micro-batch (``K`` times the gradient term) to keep a ``1/n``
    accumulator, and "fsdp" also gathers for every micro-batch's backward pass (``K + 1`` all-gathers where XLA
    moves the forward pass's gather out of the loop, as on the CPU), while "replicated" and "zero1" still
    communicate once: count the collectives of ``step.compile(...)``, those with ``in_loop`` ``K`` times."""
    n_params, n_devices, param_bytes, grad_bytes = _formula_args(stage, n_params, n_devices, param_bytes,
                                                                 grad_bytes, "formula_sent")
    f = (n_devices - 1) / n_devices
    per_param = {"replicated": 2 * grad_bytes, "zero1": grad_bytes + param_bytes, "zero2": grad_bytes + param_bytes,
                 "fsdp": 2 * param_bytes + grad_bytes}[stage]
    return f * n_params * per_param


# ------------------------------------------------------------------------------------------------------------------
# Communication, from the compiled program


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective instruction of an HLO: ``op``, the dtype and shape of its (first) result array, the devices
    per group, ``payload`` bytes (the whole buffers being reduced or gathered, every result array counted; for a
    reduce-scatter, ``group`` times its results), and ``in_loop``: whether it sits in the body of a ``while`` loop
    (a ``lax.scan``), so that it runs once per iteration rather than once per step. ``operands``: every
    ``(dtype, shape)`` the instruction delivers (its result), more than one for a combined collective (XLA's
    combiner merges several into one instruction); ``described`` prints them all."""

    op: str
    dtype: str
    shape: tuple
    group: int
    payload: int
    in_loop: bool = False
    operands: tuple = ()

    @property
    def described(self) -> str:
        """Every operand, e.g. ``"f32[256]"`` or, for a tuple all-reduce, ``"(f32[256], f32[64,256], f32[])"``."""
        parts = [f"{dt}[{','.join(str(d) for d in shape)}]" for dt, shape in (self.operands or
                                                                             ((self.dtype, self.shape),))]
        return parts[0] if len(parts) == 1 else "(" + ", ".join(parts) + ")"

    @property
    def sent_per_device(self) -> float:
        """Bytes each device sends with a ring algorithm: ``2 (g-1)/g`` of the payload for an all-reduce,
        ``(g-1)/g`` for a reduce-scatter or an all-gather."""
        return ring_bytes(self.op, self.payload, self.group)


# Bits per element of each HLO element type (XLA's primitive types); sub-byte arrays are packed.
_BITS = {"pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "s32": 32,
         "u32": 32, "s64": 64, "u64": 64, "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128,
         "f4e2m1fn": 4, "f8e8m0fnu": 8, "f8e4m3": 8, "f8e4m3fn": 8, "f8e4m3b11fnuz": 8, "f8e4m3fnuz": 8,
         "f8e5m2": 8, "f8e5m2fnuz": 8, "f8e3m4": 8}
_OPS = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "collective-permute", "ragged-all-to-all")
# An instruction: "[ROOT] %name = TYPE opcode(...)". The type is read by _split_type (it may be a nested tuple).
_HEAD = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*")
_OPCODE = re.compile(r"\s+([a-z][\w\-]*)\(")
# A collective's opcode anywhere outside quoted strings (metadata), to refuse a line the reader cannot parse.
_ANY_COLLECTIVE = re.compile(r"(?<![%\w.\-])(" + "|".join(_OPS) + r")(-start)?\(")
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[((?:(?:<=)?\d+)(?:,(?:<=)?\d+)*)?\]$")
_TOKEN = re.compile(r"\(|\)|,|[a-z][a-z0-9]*\[[^\]]*\](?:\{[^}]*\})?|[^\s(),]+")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*\S.*\s[a-z][\w\-]*\(", re.M)
_HEADER = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*(?:\(.*\)\s*->\s*.*)?\{\s*$")
_CALLS = re.compile(r"(?:to_apply|calls|body|condition|branch_computations)=\{?%?([\w.\-]+)")
_BODY = re.compile(r"\bbody=%?([\w.\-]+)")


class _Unparsed(ValueError):
    """A collective's type that the reader cannot turn into bytes."""


def _dtype_bits(dtype: str) -> int:
    """Bits per element of an HLO element type (f32 -> 32, bf16 -> 16, c64 -> 64, s4 -> 4, pred -> 8)."""
    if dtype not in _BITS:
        raise _Unparsed(f"unknown element type {dtype!r}")
    return _BITS[dtype]


def _dtype_bytes(dtype: str) -> float:
    """Bytes per element of an HLO element type (f32 -> 4, c64 -> 8, s4 -> 0.5); an unknown type raises."""
    return _dtype_bits(dtype) / 8


def _array_bytes(dtype: str, shape) -> int:
    """Bytes of one array: ``ceil(elements * bits / 8)`` (4-bit types are packed two to a byte)."""
    return math.ceil(math.prod(int(d) for d in shape) * _dtype_bits(dtype) / 8)


def _split_type(rest: str):
    """``rest`` is the text after ``=``: return (type_text, opcode), or (None, None) when no ``opcode(`` follows.
    The type ends at the first space outside brackets (a tuple's parentheses, a layout's braces)."""
    depth, i = 0, 0
    while i < len(rest):
        ch = rest[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch.isspace() and depth == 0:
            break
        i += 1
    m = _OPCODE.match(rest, i)
    return (rest[:i], m.group(1)) if m else (None, None)


def _parse_type(text: str):
    """An HLO type as nested lists: ``"(f32[2]{0}, (s32[], bf16[3,4]))"`` -> ``[("f32", "2"), [("s32", ""),
    ("bf16", "3,4")]]``; a single array type -> ``("f32", "2")``. Layouts and ``/*index=N*/`` comments are dropped."""
    tokens = _TOKEN.findall(re.sub(r"/\*.*?\*/", "", text))
    stack = [[]]
    for tok in tokens:
        if tok == "(":
            stack.append([])
        elif tok == ")":
            if len(stack) > 1:
                inner = stack.pop()
                stack[-1].append(inner)
        elif tok != ",":
            arr = _ARRAY.match(re.sub(r"\{.*\}$", "", tok))
            if not arr:
                raise _Unparsed(f"its type {tok!r} is not an array type such as f32[8,16]")
            dtype, dims = arr.groups()
            if dtype != "token":
                _dtype_bits(dtype)
            # A dynamic dimension "<=8" counts at its bound (the largest the buffer can be).
            stack[-1].append((dtype, (dims or "").replace("<=", "")))
    top = stack[0]
    return top[0] if len(top) == 1 else top


def _flat(t) -> list:
    return [t] if isinstance(t, tuple) else [a for x in t for a in _flat(x)]


def _result_arrays(type_text: str, op: str, is_start: bool) -> list:
    """The arrays an instruction delivers, from its HLO type.

    A synchronous collective's type is its result: one array, or a tuple when XLA's combiner merged several
    (every array counts). An asynchronous ``-start`` (XLA's GPU programs) is typed ``((operands...), results...)``,
    e.g. ``((f32[8]{0}, f32[8,192]{1,0}), (f32[64]{0}, f32[64,192]{1,0})) all-gather-start(...)``: only the
    result half, the second element, is what arrives (any later elements are the runtime's context scalars).
    The older dedicated forms ``all-gather-start``/``collective-permute-start`` are typed ``(operand, result, ...)``,
    and ``all-reduce-start``'s type may be its result alone."""
    t = _parse_type(type_text)
    if not is_start or isinstance(t, tuple):
        return _flat(t)
    if t and isinstance(t[0], list) and len(t) >= 2:            # ((operands...), results..., context...)
        return _flat(t[1])
    if op != "all-reduce" and len(t) >= 2:                      # (operand, result, context...)
        return _flat(t[1])
    return _flat(t)


def _check_hlo_text(hlo_text, where: str) -> None:
    if not isinstance(hlo_text, str):
        raise TypeError(f"{where}: hlo_text must be the compiled program's text, a str, got "
                        f"{type(hlo_text).__name__}. Pass step.compile(state, batch).as_text(), not the compiled "
                        "object.")
    if "stablehlo." in hlo_text or re.search(r"^\s*module\s+@", hlo_text, re.M):
        raise ValueError(f"{where}: hlo_text is StableHLO (MLIR) text, which names collectives differently "
                         "(stablehlo.all_reduce). Pass compiled.as_text() (XLA's HLO after compilation) or "
                         "lowered.as_text(dialect='hlo').")
    if "HloModule" not in hlo_text and not _INSTRUCTION.search(hlo_text):
        raise ValueError(f"{where}: hlo_text does not look like an HLO program (no 'HloModule' line and no "
                         f"'%name = type op(...)' instruction); it starts {hlo_text[:60]!r}. Pass "
                         "compiled.as_text() or lowered.as_text(dialect='hlo').")


def ring_bytes(op: str, payload: float, group: int) -> float:
    """Bytes each device sends for one collective over ``group`` devices with a ring algorithm."""
    _checks.one_of(op, "op", "ring_bytes", _OPS)
    if isinstance(payload, bool) or not isinstance(payload, (int, float, np.integer, np.floating)) or payload < 0:
        _fail("ring_bytes", "payload", "a number of bytes >= 0", payload, "Pass e.g. payload=4 * n_params.",
                     TypeError if not isinstance(payload, (int, float, np.integer, np.floating)) else ValueError)
    group = _checks.whole(group, "group", "ring_bytes", fix="It is the number of devices in the collective.")
    if group == 1:
        return 0.0
    factor = {"all-reduce": 2.0}.get(op, 1.0)
    return factor * (group - 1) / group * payload


def _group_size(line: str, default: int) -> int:
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
    if m:
        sizes = dict((k.strip().strip("'"), int(v)) for k, v in (kv.split("=") for kv in m.group(1).split(",")))
        names = [a.strip().strip("'") for a in m.group(2).split(",") if a.strip()]
        return math.prod(sizes[a] for a in names) if names else default
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", line)
    if m:
        return int(m.group(2))
    m = re.search(r"replica_groups=\{\{([\d,]+)\}", line)
    if m:
        return len(m.group(1).split(","))
    return default


def collectives(hlo_text: str, n_devices: int | None = None) -> list[Collective]:
    """Every collective instruction in a program's HLO text (``compiled.as_text()``, or
    ``lowered.as_text(dialect="hlo")``), in order.

    Each instruction counts once, with every array it delivers:
    - a synchronous collective (the CPU backend's form): its result type, one array or a tuple (XLA's combiner
      merges several collectives into one instruction, e.g. ``(f32[256], f32[64,256], f32[])``);
    - an asynchronous ``-start`` (``all-reduce-start``, ``all-gather-start``, ``reduce-scatter-start``,
      ``collective-permute-start``; XLA's GPU form): the RESULT half of its type ``((operands...), results...)``,
      every array of it (a combined all-gather of 6 arrays counts 6), never the operands; its ``-done`` is not
      counted again;
    - an ``async-start`` whose ``calls=`` computation holds the collective: counted once, from that computation's
      own (synchronous) instruction.

    Bytes are ``ceil(elements * bits / 8)`` per array (``s4``/``u4`` are half a byte, ``c64`` 8 bytes); a dynamic
    dimension ``<=8`` counts at its bound. A ``ragged-all-to-all`` counts its whole output buffer, an upper bound on
    what it sends. A collective whose type or element type the reader cannot read raises ``ValueError`` naming the
    line; an opcode inside ``metadata={op_name="..."}`` is not an instruction and is not counted.

    ``n_devices`` is the group size to assume where the instruction does not say (default: ``jax.device_count()``).
    Returns ``[]`` when the program has no collective (e.g. compiled for one device). Raises ``ValueError`` for text
    that is not HLO (StableHLO from ``lowered.as_text()`` included) and ``TypeError`` for a non-string.
    """
    n_devices = _checks.optional_whole(n_devices, "n_devices", "collectives")
    _check_hlo_text(hlo_text, "collectives")
    default = jax.device_count() if n_devices is None else n_devices
    found, calls, current = [], {}, None
    for line in hlo_text.splitlines():
        header = _HEADER.match(line)
        if header and " = " not in line:
            current = header.group(1)
            continue
        calls.setdefault(current, set()).update(_CALLS.findall(line))
        head = _HEAD.match(line)
        type_text, opcode = _split_type(line[head.end():]) if head else (None, None)
        base = opcode[:-len("-start")] if opcode and opcode.endswith("-start") else opcode
        if base not in _OPS:
            # No collective opcode right after the type; one elsewhere (outside quoted metadata) is unreadable.
            if _ANY_COLLECTIVE.search(re.sub(r'"(?:[^"\\]|\\.)*"', '""', line)):
                raise ValueError(f"collectives: cannot read this collective instruction of hlo_text (expected "
                                 f"'%name = TYPE op(...)'): {line.strip()[:160]!r}. Pass compiled.as_text() or "
                                 "lowered.as_text(dialect='hlo') unchanged.")
            continue
        op, is_start = base, opcode != base
        try:
            arrays = [(dt, ds) for dt, ds in _result_arrays(type_text, op, is_start) if dt != "token"]
            nbytes = sum(_array_bytes(dt, [d for d in ds.split(",") if d]) for dt, ds in arrays)
        except _Unparsed as e:
            raise ValueError(f"collectives: cannot read this {op} instruction of hlo_text ({e}): "
                             f"{line.strip()[:160]!r}. "
                             "The reader knows XLA's element types (pred, s2-s64, u2-u64, f16, bf16, f32, f64, "
                             "c64, c128, f8 and f4 variants); pass compiled.as_text() unchanged.") from None
        if not arrays:
            continue
        group = _group_size(line, default)
        dtype = arrays[0][0]
        payload = nbytes * group if op == "reduce-scatter" else nbytes
        operands = tuple((dt, tuple(int(d) for d in ds.split(",") if d)) for dt, ds in arrays)
        found.append((current, Collective(op, dtype, operands[0][1], group, payload, operands=operands)))
    # Computations reachable from a while loop's body run once per iteration.
    looped, todo = set(), [b for line in hlo_text.splitlines() for b in _BODY.findall(line)]
    while todo:
        name = todo.pop()
        if name not in looped:
            looped.add(name)
            todo.extend(calls.get(name, ()))
    return [dataclasses.replace(c, in_loop=where in looped) for where, c in found]


def communication(hlo_text: str, n_devices: int | None = None) -> dict[str, dict]:
    """``{op: {"count", "in_loop", "payload", "sent_per_device"}}`` over the collectives of a compiled program
    (see ``collectives``): instructions, how many of them sit in a loop body, and their bytes, each counted once.
    ``{}`` when the program has no collective; text that is not HLO raises, as in ``collectives``."""
    out: dict[str, dict] = {}
    for c in collectives(hlo_text, n_devices):
        entry = out.setdefault(c.op, {"count": 0, "in_loop": 0, "payload": 0, "sent_per_device": 0.0})
        entry["count"] += 1
        entry["in_loop"] += int(c.in_loop)
        entry["payload"] += c.payload
        entry["sent_per_device"] += c.sent_per_device
    return out


# ------------------------------------------------------------------------------------------------------------------
# A picture of the step, from the real state and the compiled program


def dataflow(step, state: ShardedState, batch, *, show_devices: int = 2):
    """Draw one step of ``state``'s stage: what each device holds, and the collectives between, with real shapes.

    The shapes come from the state's arrays (``addressable_shards``) and the collectives, in program order, from the
    compiled step's HLO (``collectives``; the loss's scalar all-reduce is left out). The first ``show_devices``
    devices and the last are drawn, and the drawing is scaled to at most ``diagrams.MAX_WIDTH_IN`` inches
    (``diagrams.MAX_WIDTH_PX``, 768 px) wide so that it fits a notebook: with ``show_devices=1`` (the first device
    and the last) its text stays readable at that width. Returns a ``diagrams.Diagram`` (graphviz; DOT source where ``dot`` is missing).
    """
    from . import diagrams

    _check_step(step, "dataflow")
    _check_state(state, "dataflow")
    _check_batch(batch, state.layout, step.accumulate, "dataflow")
    show_devices = _checks.whole(show_devices, "show_devices", "dataflow")
    layout = state.layout
    n = layout.n_devices
    shown = list(range(min(show_devices, n - 1))) + [n - 1]
    found = [c for c in collectives(step.compile(state, batch).as_text(), n) if c.shape]
    param_shape = state.params.addressable_shards[0].data.shape
    opt_shapes = sorted({s.data.shape for leaf in jax.tree.leaves(state.opt_state) if np.ndim(leaf)
                         for s in leaf.addressable_shards[:1]})
    devs = sorted(state.params.devices(), key=lambda d: d.id)
    g = diagrams.Diagram("sharded_step")
    g.attr(label=f"one '{layout.stage}' step on {n} devices: {layout.n_params:,} parameters, padded to "
                 f"{layout.padded:,} = {n} x {layout.shard_size:,}", labelloc="t", ranksep="0.4",
          size=f"{diagrams.MAX_WIDTH_IN:g},30")

    def row(name, label_of, colour):
        with g.subgraph(name=name) as s:
            s.attr(rank="same")
            for i in shown:
                s.node(f"{name}{i}", label_of(i), fillcolor=colour)
            s.node(f"{name}_more", "...", shape="plaintext", style="")
            order = [f"{name}{i}" for i in shown[:-1]] + [f"{name}_more", f"{name}{shown[-1]}"]
            for a, b in zip(order, order[1:]):
                s.edge(a, b, style="invis")

    row("hold", lambda i: f"{devs[i].platform.upper()} {devs[i].id} holds\\nparams {list(param_shape)}\\n"
                          f"optimizer {', '.join(str(list(s)) for s in opt_shapes)}\\n"
                          f"computes its own gradients [{layout.padded}]", "#dbe9f6")
    previous = "hold"
    for k, c in enumerate(found):
        op_node = f"op{k}"
        g.node(op_node, f"{c.op}\\n{c.dtype}{list(c.shape)}, {c.payload:,} bytes", shape="box",
               style="rounded,filled,bold", fillcolor="#fde0c5")
        for i in shown:
            g.edge(f"{previous}{i}", op_node)
        previous = f"after{k}"
        then = {"reduce-scatter": "its slice of the summed gradients\\nthen the update of its slice",
                "all-reduce": "the summed gradients, whole", "all-gather": "every slice: the whole vector"}
        row(previous, lambda i, c=c: f"{then.get(c.op, c.op)}\\n{c.dtype}{list(c.shape)}", "#e5f5e0")
        for i in shown:
            g.edge(op_node, f"{previous}{i}")
    g.collectives = found
    return g


# ------------------------------------------------------------------------------------------------------------------
# For the course benchmark


def bench_variants(params, loss_fn, optimizer, host_batches, *, accumulate: int = 4) -> dict:
    """The benchmark's variants from this module: ``{name: (start, run)}`` as ``course_lib.bench`` times them.

    * ``"fsdp"``: the ``"fsdp"`` stage, one dispatch per step;
    * ``"accumulate"``: the ``"replicated"`` stage with ``accumulate`` micro-batches per device (fewer if the
      per-device batch does not divide by it), the same global batch per step;
    * ``"replicated"``: the ``"replicated"`` stage, one dispatch per step, no accumulation: the like-for-like
      reference for the two above (same machinery, one dispatch per step, no fusion of several steps), so that
      their ratio to it shows what sharding or accumulation costs, not what a fused multi-step reference saves.

    ``loss_fn(params, batch, key)`` as ``training.make_train_step`` takes it (called with ``key=None``);
    ``host_batches``: pmap-sharded batches, leaves ``(n, B // n, ...)``, placed here on a ``data_mesh`` as global
    ``(B, ...)`` arrays before any timing. ``start()`` makes the initial state on the devices; ``run(state)`` trains
    over every batch and returns the final loss, read on the host. Like ``training.fit`` it waits for the oldest
    step when more than ``max_ahead`` (``fit``'s default, 20) would be in flight: on JAX 0.11 a longer queue of
    8 simulated devices' steps can deadlock XLA's CPU runtime (seen with 100 steps).
    """
    accumulate = _checks.whole(accumulate, "accumulate", "bench_variants")
    host_batches = list(host_batches)
    if not host_batches:
        _fail("bench_variants", "host_batches", "a non-empty list of batches", host_batches,
                     "Pass at least one pmap-sharded batch, leaves (n, B // n, ...).")
    _check_optimizer(optimizer, "bench_variants")
    mesh = data_mesh(jax.local_devices())
    split = NamedSharding(mesh, P(AXIS))
    batches = [jax.device_put(jax.tree.map(lambda a: np.reshape(a, (-1,) + np.shape(a)[2:]), b), split)
               for b in host_batches]
    per_device = np.shape(jax.tree.leaves(host_batches[0])[0])[1]
    k = max(d for d in range(1, accumulate + 1) if per_device % d == 0)
    from . import training
    ahead = inspect.signature(training.fit).parameters["max_ahead"].default

    def loss(p, batch):
        return loss_fn(p, batch, None)

    def variant(stage, micro):
        step = make_train_step(loss, optimizer, stage=stage, accumulate=micro)

        def run(state):
            in_flight = collections.deque()
            for b in batches:
                state, metrics = step(state, b)
                in_flight.append(metrics["loss"])
                if len(in_flight) > ahead:  # as training.fit: never more than `ahead` steps queued (see above)
                    jax.block_until_ready(in_flight.popleft())
            return float(metrics["loss"])

        return (lambda: jax.block_until_ready(init_state(params, optimizer, mesh, stage=stage))), run

    return {"fsdp": variant("fsdp", 1), "accumulate": variant("replicated", k), "replicated": variant("replicated", 1)}
