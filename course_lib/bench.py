"""What data parallelism costs, measured: one training step per global batch, ten ways, two workloads.

Lesson 09 uses its workloads (``workloads``); the instructors' notes (.github/CONTRIBUTING.md, *Benchmark*) give its full results.
``python -m course_lib.bench`` prints tables, writes JSON, and names the machine, the device kind and the JAX
version. It runs on whatever devices exist (simulated CPU devices, one GPU, a TPU slice); with ``--devices N`` on a
CPU-only machine it simulates N devices.

Variants, all from the same initial parameters over the same global batches (``VARIANTS``; a new one is a
function decorated with ``@variant("name")`` that returns ``(start, run)``, usually ``setup.default_path(...)``).
They come in two groups, and each is reported against the reference of its own group (``REFERENCE_OF``), so that
a ratio compares like with like:

One dispatch per step, against ``single_jit``:

* ``single_jit``: one device, a plain jitted step on the whole global batch;
* ``naive_pmap``: the tutorial loop: course_lib's pmap step and a host read of the loss after every step;
* ``pmap_step``: the same step in ``training.fit`` with ``steps_per_call=1``: no per-step host read;
* ``fsdp`` and ``accumulate`` (lesson 10): ``sharded_state``'s FSDP step, and its replicated step with 4
  micro-batches per device (``sharded_state.bench_variants``), at most ``fit``'s ``max_ahead`` (20) in flight.

``steps_per_call`` (10) steps fused per dispatch with ``lax.scan``, against ``single_scan``:

* ``single_scan``: the default path (below) given a one-device list: the same code and fusion on one device;
* ``pmap_scan``: course_lib's default path, ``training.make_train_step`` + ``training.fit`` with no settings:
  10 steps fused per dispatch, the oldest dispatch read back only when ``max_ahead`` (20) steps would otherwise
  be in flight, the state donated to each dispatch;
* ``shard_map``: the same with the ``"shard_map"`` backend;
* ``shard_map_per_leaf``: the same with ``allreduce="per_leaf"``: one psum per gradient, which XLA's combiner
  merges into one tuple all-reduce, as the compiler does for sharded ``jit``;
* ``jit_sharded``: the same with the ``"jit"`` backend (plain ``jit`` of the global step, sharded inputs), its
  loss written as a sum over the real rows (``loss_reduction="sum"``), so that the count of real rows travels
  with the gradients: one all-reduce per step, like the others.

On the CPU backend the pmap and shard_map variants send one flat all-reduce per step (``training.psum_bucketed``);
``shard_map_per_leaf`` and ``jit_sharded`` one tuple all-reduce of one buffer per gradient.

Besides the variants, ``run`` measures the overhead per workload, global batch and device count: the default path
on the first ``k`` devices over the same path on one, for ``k`` = 1, 2, 4, ... up to the device count
(``measure``). On simulated devices, which share the host's cores, the limit is 1.0x. Fusion's gain is reported
apart: ``single_jit`` / ``single_scan``. And it measures what one all-reduce costs on its own on ``k`` devices, for
one number and for each workload's gradient buffer (``allreduce_ms``).

Every figure is the median over ``--repeats`` timed runs of ``--steps`` steps, after a warm-up run
that compiles, each run ended by ``block_until_ready`` (or a host read of the loss, which waits the same way).
The variants and device counts of a workload take turns, one run each per round, so that a slow spell of a shared
machine hits them all alike. The batches are on the devices before timing starts, and so is each run's initial
state.

``goals(report)`` checks the course's performance targets for the default path on 8 devices (.github/CONTRIBUTING.md): on
the MLP an overhead of at most 1.25x at global batch 512 and 1.5x at 256, and on the linear regression at least 3x
faster than ``naive_pmap``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import sys
import time


WORKLOADS = ("regression", "mlp")


def workloads(name, global_batch, seed=0, loss_reduction="mean"):
    """``(params, loss_fn(params, batch, key), x, y, optimizer)`` for 'regression' or 'mlp'.

    ``loss_reduction="mean"``: the loss is the masked mean over the batch's real rows (``training.masked_mean``);
    ``"sum"``: their sum, for ``make_train_step(..., loss_reduction="sum")``, which divides by the count after
    the exchange."""
    import jax
    import jax.numpy as jnp
    import optax

    from course_lib import _checks, data, training

    _checks.one_of(loss_reduction, "loss_reduction", "bench.workloads", training.LOSS_REDUCTIONS)

    def reduce(values, mask):
        if loss_reduction == "sum":
            return jnp.sum(jnp.where(mask, values, 0.0))
        return training.masked_mean(values, mask)

    if name == "regression":
        x, y, _ = data.regression_data(n=max(4096, global_batch * 4), seed=seed)
        params = {"w": jnp.zeros(x.shape[1]), "b": jnp.float32(0.0)}

        def loss_fn(p, batch, key):
            return reduce((batch["x"] @ p["w"] + p["b"] - batch["y"]) ** 2, batch["mask"])

        return params, loss_fn, x, y, optax.sgd(0.1)
    if name == "mlp":
        x, y, _, _ = data.digits()
        keys = jax.random.split(jax.random.key(seed))
        params = [{"w": jax.random.normal(keys[0], (64, 256)) * 0.1, "b": jnp.zeros(256)},
                  {"w": jax.random.normal(keys[1], (256, 10)) * 0.1, "b": jnp.zeros(10)}]

        def loss_fn(p, batch, key):
            h = jax.nn.relu(batch["x"] @ p[0]["w"] + p[0]["b"])
            logits = h @ p[1]["w"] + p[1]["b"]
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])
            return reduce(ce, batch["mask"])

        return params, loss_fn, x, y, optax.adam(1e-3)
    raise ValueError(f"unknown workload {name!r}: 'regression' or 'mlp'")


def _median(values):
    values = sorted(values)
    return values[len(values) // 2]


def _fit_default(name):
    from course_lib import training
    return inspect.signature(training.fit).parameters[name].default


class Setup:
    """What every variant of one workload shares: the model, the optimizer, and ``steps`` global batches.

    ``batches(k)`` are the same global batches split over ``k`` devices, ``(k, B // k, ...)``, already on the
    first ``k`` local devices; ``default_path(k)`` is course_lib's default path on those devices.
    """

    def __init__(self, name, global_batch, steps, scan_steps):
        import jax

        from course_lib import data

        self.name, self.global_batch, self.steps, self.scan_steps = name, global_batch, steps, scan_steps
        self.params, self.loss_fn, x, y, self.opt = workloads(name, global_batch)
        self.devices = jax.local_devices()
        n = len(self.devices)
        self.host_batches = [b for b, _ in zip(data.batches(x, y, global_batch, n_devices=n, epochs=None),
                                               range(steps))]
        # fit's own settings on the default path; others for another scan_steps (then it is not the default).
        default_k = _fit_default("steps_per_call")
        self.fused = {} if scan_steps == default_k else {"steps_per_call": scan_steps, "max_ahead": 2 * scan_steps}
        self._placed = {}

    def batches(self, k=None):
        """The global batches ``(k, B // k, ...)`` on the first ``k`` devices (default: all of them)."""
        import jax

        from course_lib import sharding

        k = len(self.devices) if k is None else k
        if k not in self._placed:
            split = jax.sharding.NamedSharding(sharding.device_mesh(self.devices[:k]),
                                               jax.sharding.PartitionSpec("devices"))
            self._placed[k] = [jax.device_put(jax.tree.map(lambda a: a.reshape((k, -1) + a.shape[2:]), b), split)
                               for b in self.host_batches]
        return self._placed[k]

    def start(self, k=None, backend="pmap"):
        """``start()``: a fresh initial state on the first ``k`` devices (not timed)."""
        import jax

        from course_lib import training

        devices = self.devices[:k or len(self.devices)]
        return lambda: jax.block_until_ready(
            training.init_state(self.params, self.opt, jax.random.key(0), devices=devices, backend=backend))

    def fit_run(self, step, k=None, **settings):
        """``run(state)``: ``training.fit`` over every batch; returns the final loss."""
        from course_lib import training

        batches = self.batches(k)

        def run(state):
            _, history = training.fit(step, state, batches, progress=False, **settings)
            return history["train"][-1]["loss"]
        return run

    def default_path(self, k=None, backend="pmap", step_options=None, **settings):
        """``(start, run)`` for ``make_train_step`` + ``fit`` with their defaults on the first ``k`` devices.

        ``step_options`` go to ``make_train_step`` (e.g. ``{"allreduce": "per_leaf"}``); with
        ``loss_reduction="sum"`` the workload's loss is its sum over the real rows. ``settings`` go to ``fit``."""
        from course_lib import training

        step_options = dict(step_options or {})
        loss_fn = self.loss_fn
        if step_options.get("loss_reduction", "mean") == "sum":
            loss_fn = workloads(self.name, self.global_batch, loss_reduction="sum")[1]
        devices = self.devices[:k or len(self.devices)]
        step = training.make_train_step(loss_fn, self.opt, devices=devices, backend=backend, **step_options)
        return self.start(k, backend), self.fit_run(step, k, **{**self.fused, **settings})

    def without_allreduce(self, k=None):
        """``(start, run)`` for the default pmap path on the first ``k`` devices with its all-reduce taken out: each
        device applies its own gradient. A wrong step (the replicas drift apart, and so does the loss), timed only
        to see what the rest of the step costs; everything else is the default path's."""
        import jax

        from course_lib import training

        devices = self.devices[:k or len(self.devices)]
        per_device = training.device_step(self.loss_fn, self.opt, reduce=lambda tree, axis_name: tree)
        one, many = (jax.pmap(f, axis_name=training.AXIS, devices=devices, donate_argnums=(0,))
                     for f in (per_device, training._scanned(per_device)))
        step = training.TrainStep(one, many, "pmap", lambda batches: batches, donate=True, devices=devices)
        return self.start(k), self.fit_run(step, k, **self.fused)


# The variants, in the order they are reported: name -> build(setup) -> (start, run). start() makes the initial
# state on the devices (not timed); run(state) trains over every batch and returns the final loss, read on the
# host (which waits for the devices). A new variant is a function decorated with @variant("name").
VARIANTS: dict = {}


def variant(name):
    def register(build):
        VARIANTS[name] = build
        return build
    return register


@variant("single_jit")
def _single_jit(s: Setup):
    """One device, the whole global batch, a plain jitted step: one dispatch per step."""
    import jax
    import optax

    dev0 = s.devices[0]
    whole = [jax.device_put(jax.tree.map(lambda a: a.reshape((-1,) + a.shape[2:]), b), dev0) for b in s.host_batches]

    @jax.jit
    def step(p, o, batch):
        loss, grads = jax.value_and_grad(lambda p: s.loss_fn(p, batch, None))(p)
        updates, o = s.opt.update(grads, o, p)
        return optax.apply_updates(p, updates), o, loss

    def run(state):
        p, o = state
        for b in whole:
            p, o, loss = step(p, o, b)
        return float(jax.block_until_ready(loss))

    return lambda: jax.block_until_ready(jax.device_put((s.params, s.opt.init(s.params)), dev0)), run


@variant("naive_pmap")
def _naive_pmap(s: Setup):
    """The tutorial loop: course_lib's pmap step, one dispatch and one host read of the loss per step."""
    from course_lib import training

    step = training.make_train_step(s.loss_fn, s.opt)
    batches = s.batches()

    def run(state):
        for b in batches:
            state, metrics = step(state, b)
            loss = float(metrics["loss"][0])               # a host read every step
        return loss

    return s.start(), run


@variant("pmap_step")
def _pmap_step(s: Setup):
    """The default pmap step in ``fit`` with ``steps_per_call=1``: one dispatch per step, no per-step host read."""
    return s.default_path(steps_per_call=1)


@variant("fsdp")
def _fsdp(s: Setup):
    """Lesson 10: sharded_state's FSDP stage (parameters and optimizer state split over the devices)."""
    from course_lib import sharded_state
    return sharded_state.bench_variants(s.params, s.loss_fn, s.opt, s.host_batches)["fsdp"]


@variant("accumulate")
def _accumulate(s: Setup):
    """Lesson 10: the replicated stage with 4 micro-batches per device and one gradient exchange per step."""
    from course_lib import sharded_state
    return sharded_state.bench_variants(s.params, s.loss_fn, s.opt, s.host_batches)["accumulate"]


@variant("single_scan")
def _single_scan(s: Setup):
    """The default path on one device with the whole global batch: the fair reference for the overhead."""
    return s.default_path(1)


@variant("pmap_scan")
def _pmap_scan(s: Setup):
    return s.default_path()


@variant("shard_map")
def _shard_map(s: Setup):
    return s.default_path(backend="shard_map")


@variant("shard_map_per_leaf")
def _shard_map_per_leaf(s: Setup):
    """The shard_map path with one psum per gradient (``allreduce="per_leaf"``): the communication sharded jit has."""
    return s.default_path(backend="shard_map", step_options={"allreduce": "per_leaf"})


@variant("jit_sharded")
def _jit_sharded(s: Setup):
    """Sharded jit of the global step, fused like the others; the loss is a sum over the real rows, so the count of
    real rows travels with the gradients in one all-reduce (``loss_reduction="sum"``)."""
    return s.default_path(backend="jit", step_options={"loss_reduction": "sum"})


DEFAULT_VARIANT = "pmap_scan"   # what make_train_step + fit do with their defaults
REFERENCE = "single_scan"       # the same path on one device: the fair reference for the fused variants
UNFUSED_REFERENCE = "single_jit"
UNFUSED = ("single_jit", "naive_pmap", "pmap_step", "fsdp", "accumulate")   # one dispatch per step
# Each variant's reference: unfused variants against the unfused one-device step, fused ones against single_scan.
REFERENCE_OF = {v: (UNFUSED_REFERENCE if v in UNFUSED else REFERENCE) for v in VARIANTS}


def reference_of(variant: str) -> str:
    """The variant a ``variant``'s time is compared with: ``single_jit`` for one dispatch per step, else
    ``single_scan`` (a variant added with ``@variant`` counts as fused)."""
    return REFERENCE_OF.get(variant, REFERENCE)


def device_counts_for(n: int) -> list:
    """The device counts ``run`` measures the overhead on by default: 1, 2, 4, ... up to ``n``, and ``n``."""
    return sorted({2 ** i for i in range(n.bit_length()) if 2 ** i <= n} | {n})


def _lcm(counts) -> int:
    import math
    out = 1
    for k in counts:
        out = out * k // math.gcd(out, k)
    return out


def measure(name, *, global_batch=512, steps=100, repeats=7, scan_steps=None, variants=None,
            device_counts=(), without_allreduce=()) -> dict:
    """Time ``variants`` on one workload, and the default path on each of ``device_counts`` devices.

    Returns ``{"variants": {variant: {"step_ms", "final_loss"}}, "devices": {k: {"step_ms", "final_loss"}},
    "without_allreduce": {k: {"step_ms", "final_loss"}}}``.
    The default path on ``k`` devices runs on the first ``k`` local devices, the same global batch split
    ``(k, global_batch // k, ...)``; on 1 device it is ``single_scan``, on all of them ``pmap_scan``, and those
    are timed once for both tables. For each ``k`` in ``without_allreduce`` the same path runs with its all-reduce
    taken out (``Setup.without_allreduce``; its loss is not the others'). Everything is timed in the same rounds
    (``_measure``).
    """
    import jax

    variants = list(VARIANTS) if variants is None else variants
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise ValueError(f"unknown variants {sorted(unknown)}; choose from {list(VARIANTS)}.")
    n = jax.local_device_count()
    default_k = _fit_default("steps_per_call")
    scan_steps = default_k if scan_steps is None else scan_steps
    if steps % scan_steps:
        raise ValueError(f"steps ({steps}) must be a multiple of scan_steps ({scan_steps}).")
    counts = list(device_counts) + [k for k in without_allreduce if k not in device_counts]
    bad = [k for k in counts if not isinstance(k, int) or not 1 <= k <= n or global_batch % k]
    if global_batch % n or bad:
        ok = [k for k in counts if isinstance(k, int) and 1 <= k <= n]
        raise ValueError(f"global_batch ({global_batch}) must divide over the {n} devices (and every device count "
                         f"in {counts} must be between 1 and {n} and divide it); use a multiple of "
                         f"{_lcm(ok + [n])}.")
    setup = Setup(name, global_batch, steps, scan_steps)
    runs = {v: VARIANTS[v](setup) for v in VARIANTS if v in variants}
    same = {1: REFERENCE, n: DEFAULT_VARIANT}
    for k in device_counts:
        if same.get(k) not in runs:
            runs[("devices", k)] = setup.default_path(k)
    for k in without_allreduce:
        runs[("without_allreduce", k)] = setup.without_allreduce(k)
    timed = _measure(runs, repeats, steps)
    return {"variants": {v: timed[v] for v in runs if isinstance(v, str)},
            "devices": {k: timed[same[k] if same.get(k) in runs else ("devices", k)] for k in device_counts},
            "without_allreduce": {k: timed[("without_allreduce", k)] for k in without_allreduce}}


def run_workload(name, *, global_batch=512, steps=100, repeats=7, scan_steps=None, variants=None):
    """Time the ``variants`` on one workload: ``{variant: {"step_ms": ..., "final_loss": ...}}``.

    ``global_batch`` examples per step, split ``(n, global_batch // n, ...)`` over the ``n`` local devices.
    ``scan_steps`` (default: ``training.fit``'s ``steps_per_call``) is how many steps the fused variants run per
    dispatch; ``steps`` must be a multiple of it. With the default, ``pmap_scan`` calls ``fit`` with no settings
    at all: it is exactly the library's default path, and ``single_scan`` is the same call on one device.
    """
    return measure(name, global_batch=global_batch, steps=steps, repeats=repeats, scan_steps=scan_steps,
                   variants=variants)["variants"]


def _measure(runs: dict, repeats: int, steps: int) -> dict:
    """Warm every variant up, then time them in turn, ``repeats`` rounds: a slow spell of a shared machine hits
    all variants alike instead of whichever ran during it. Median per variant, in ms per step."""
    losses = {name: run(start()) for name, (start, run) in runs.items()}   # warm-up: compile, first transfers
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, (start, run) in runs.items():
            state = start()
            t0 = time.perf_counter()
            losses[name] = run(state)
            times[name].append(time.perf_counter() - t0)
    return {name: {"step_ms": round(1e3 * _median(times[name]) / steps, 4), "final_loss": float(losses[name])}
            for name in runs}


def buffer_size(name) -> int:
    """How many numbers the default path's one all-reduce per step carries for workload ``name``: every parameter's
    gradient, the loss and the count of real examples, flattened into one vector (``training.psum_bucketed``)."""
    import jax

    from course_lib import _checks

    _checks.one_of(name, "name", "bench.buffer_size", WORKLOADS)
    params = workloads(name, 8)[0]
    return sum(int(p.size) for p in jax.tree.leaves(params)) + 2


def allreduce_ms(sizes: dict, device_counts, *, iters=50, repeats=7) -> dict:
    """What one all-reduce costs on its own: ``{label: {k: ms}}`` for each ``label: size`` in ``sizes`` and each ``k``.

    ``iters`` all-reduces (``lax.psum``) of a float32 vector ``(size,)`` in a row, fused into one dispatch with
    ``lax.scan`` on the first ``k`` devices, against the same loop without the all-reduce; the difference over
    ``iters``, median of ``repeats`` rounds (taken in turns, as ``measure``'s), 0 where the difference is lost in
    the noise. The data stay on the devices, so what is left is the all-reduce: on simulated devices, the rendezvous
    of ``k`` threads and the sums.
    """
    import jax
    import numpy as np

    from course_lib import _checks, sharding

    where = "bench.allreduce_ms"
    if not isinstance(sizes, dict) or not sizes:
        _checks.fail(where, "sizes", "a non-empty dict {label: how many float32 numbers}", sizes,
                     'Pass e.g. sizes={"one number": 1, "mlp": 19212}.', TypeError)
    sizes = {label: _checks.whole(size, f"sizes[{label!r}]", where) for label, size in sizes.items()}
    devs = jax.local_devices()
    if isinstance(device_counts, (str, bytes)) or not hasattr(device_counts, "__iter__"):
        _checks.fail(where, "device_counts", "a list of device counts", device_counts,
                     f"Pass e.g. device_counts=[2, {len(devs)}].", TypeError)
    counts = [_checks.whole(k, "device_counts", where) for k in device_counts]
    if not counts or max(counts) > len(devs):
        _checks.fail(where, "device_counts", f"a non-empty list of counts from 1 to {len(devs)}, the local devices",
                     device_counts, f"Pass e.g. device_counts=[2, {len(devs)}].")
    iters = _checks.whole(iters, "iters", where)
    repeats = _checks.whole(repeats, "repeats", where)

    def loop(k, size, reduce):
        def body(c, _):
            return reduce(c) * (1.0 / k), None
        f = jax.pmap(lambda c: jax.lax.scan(body, c, None, length=iters)[0], axis_name="i", devices=devs[:k])
        split = jax.sharding.NamedSharding(sharding.device_mesh(devs[:k]), jax.sharding.PartitionSpec("devices"))
        x = jax.device_put(np.ones((k, size), np.float32), split)
        return (lambda: x), (lambda c: float(f(c)[0, 0]))

    runs = {}
    for label, size in sizes.items():
        for k in counts:
            runs[(label, k, "psum")] = loop(k, size, lambda c: jax.lax.psum(c, "i"))
            runs[(label, k, "none")] = loop(k, size, lambda c: c)
    timed = _measure(runs, repeats, iters)
    return {label: {k: round(max(0.0, timed[(label, k, "psum")]["step_ms"] - timed[(label, k, "none")]["step_ms"]), 4)
                    for k in counts} for label in sizes}


def machine() -> dict:
    import jax
    d = jax.devices()[0]
    return {"machine": platform.machine(), "system": platform.system(), "cpu_count": os.cpu_count(),
            "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "python": platform.python_version(), "jax": jax.__version__, "platform": d.platform,
            "device_kind": d.device_kind, "device_count": jax.device_count(),
            "simulated": d.platform == "cpu" and jax.device_count() > 1,
            "xla_flags": os.environ.get("XLA_FLAGS", "")}


# The goals, for the default path on 8 simulated CPU devices: (workload, global batch, devices, most overhead).
OVERHEAD_GOALS = (("mlp", 512, 8, 1.25), ("mlp", 256, 8, 1.5))
LIMIT = 1.0  # simulated devices share the host's cores: at best the same total compute, the same time


def goals(report: dict) -> dict:
    """The benchmark's goals, from a report: the measured ratio of each and whether it is met.

    * on the MLP, the data-parallel overhead of the default path on 8 devices (its time over ``single_scan``'s,
      the same path on one device, the same global batch) is at most 1.25x at global batch 512 and 1.5x at 256;
      ``from_limit`` is how far the ratio is from the limit, 1.0x;
    * on the linear regression, the default path is at least 3x faster than the naive loop.

    Beside each overhead goal, where the report has them: ``without_allreduce``, the overhead of the same path
    with its all-reduce taken out (what the rest of the step costs), and ``allreduce_ms`` and ``allreduce_share``,
    one all-reduce of the workload's buffer on ``k`` devices on its own, in ms and over the one-device step. When
    ``without_allreduce`` meets the goal and the ratio does not, the all-reduce is what misses it.
    """
    out = {}
    for workload, batch, k, most in OVERHEAD_GOALS:
        row = report.get("overhead", {}).get(workload, {}).get(str(batch), {})
        got = row.get(str(k))
        if got:
            r = got["overhead"]
            goal = out[f"{workload}_overhead_{k}dev_batch{batch}"] = {
                "ratio": round(r, 3), "goal": f"<= {most}", "met": r <= most, "limit": LIMIT,
                "from_limit": round(r - LIMIT, 3)}
            bare = report.get("without_allreduce", {}).get(workload, {}).get(str(batch))
            if bare and bare["devices"] == k:
                goal["without_allreduce"] = bare["overhead"]
            ar = report.get("allreduce", {}).get(workload, {}).get("ms", {}).get(str(k))
            if ar is not None and row.get("1", {}).get("step_ms"):
                goal["allreduce_ms"] = ar
                goal["allreduce_share"] = round(ar / row["1"]["step_ms"], 3)
    w = report["workloads"]
    if "regression" in w and "naive_pmap" in w["regression"] and DEFAULT_VARIANT in w["regression"]:
        r = w["regression"]["naive_pmap"]["step_ms"] / w["regression"][DEFAULT_VARIANT]["step_ms"]
        out["regression_naive_vs_default"] = {"ratio": round(r, 3), "goal": ">= 3", "met": r >= 3}
    return out


def _overhead_table(devices: dict) -> dict:
    """``{k: result}`` -> ``{"k": {"step_ms", "overhead"}}``, each over the 1-device time."""
    one = devices[1]["step_ms"]
    return {str(k): {"step_ms": r["step_ms"], "overhead": round(r["step_ms"] / one, 3)} for k, r in devices.items()}


def run(*, global_batch=512, steps=100, repeats=7, scan_steps=None, workload_names=("regression", "mlp"),
        variants=None, extra_batches=(256,), device_counts=None) -> dict:
    """Time the variants on every workload, and the data-parallel overhead per workload, batch and device count.

    Returns ``{"machine", "settings", "default_variant", "workloads", "fusion_gain", "overhead",
    "without_allreduce", "allreduce", "goals"}``:

    * ``workloads[w][variant]``: ``{"step_ms", "final_loss"}`` at ``global_batch``;
    * ``fusion_gain[w]``: ``single_jit`` / ``single_scan``, what fusing steps gains on one device;
    * ``overhead[w][batch][k]``: ``{"step_ms", "overhead"}``, the default path on ``k`` devices over the same
      path on one device, at ``global_batch`` and each of ``extra_batches``, for ``k`` in ``device_counts``
      (default 1, 2, 4, ... up to the local device count, and that count);
    * ``without_allreduce[w][batch]``: ``{"devices", "step_ms", "overhead"}``, the default path on the most devices
      with its all-reduce taken out (``Setup.without_allreduce``, a wrong step timed only to see what the rest of
      the step costs), over the same one-device time;
    * ``allreduce[label]``: ``{"size", "ms": {"k": ms}}``, one all-reduce on its own on ``k`` devices
      (``allreduce_ms``), for one number (``"1 number"``) and for each workload's gradient buffer (``buffer_size``),
      for every ``k`` > 1 in ``device_counts``;
    * ``goals``: see ``goals``.

    ``scan_steps`` defaults to ``training.fit``'s ``steps_per_call``, so ``pmap_scan`` is the default path; with
    any other ``scan_steps`` it is not, ``default_variant`` is ``None`` and no goals are reported.
    """
    import jax

    from course_lib import _checks

    global_batch = _checks.whole(global_batch, "global_batch", "bench.run")
    steps = _checks.whole(steps, "steps", "bench.run")
    repeats = _checks.whole(repeats, "repeats", "bench.run")
    scan_steps = _checks.optional_whole(scan_steps, "scan_steps", "bench.run")
    extra_batches = [_checks.whole(b, "extra_batches", "bench.run") for b in extra_batches]
    k_fused = _fit_default("steps_per_call") if scan_steps is None else scan_steps
    if steps % k_fused:
        raise ValueError(f"bench.run: steps must be a multiple of scan_steps ({k_fused}), got {steps}; pass e.g. "
                         f"steps={max(k_fused, steps - steps % k_fused)}.")
    n = jax.local_device_count()
    if device_counts is None:
        device_counts = device_counts_for(n)
    device_counts = sorted(set(device_counts) | {1})
    multiple = _lcm(device_counts + [n])
    for what, batch in [("global_batch", global_batch)] + [("extra_batches", b) for b in extra_batches]:
        if batch % multiple:
            raise ValueError(f"bench.run: {what} must split evenly over every device count the overhead is measured "
                             f"on ({', '.join(map(str, device_counts))}), got {batch}; pass a multiple of {multiple}.")
    variants = list(VARIANTS) if variants is None else variants
    default_k = _fit_default("steps_per_call")
    scan_steps = default_k if scan_steps is None else scan_steps
    is_default = scan_steps == default_k and DEFAULT_VARIANT in variants
    batches = [global_batch] + [b for b in extra_batches if b != global_batch]
    report = {"machine": machine(),
              "settings": {"global_batch": global_batch, "overhead_batches": batches, "steps": steps,
                           "repeats": repeats, "scan_steps": scan_steps, "device_counts": device_counts},
              "default_variant": DEFAULT_VARIANT if is_default else None,
              "workloads": {}, "fusion_gain": {}, "overhead": {}, "without_allreduce": {}}
    most = max(device_counts)
    bare = (most,) if most > 1 else ()
    for w in workload_names:
        report["overhead"][w] = {}
        report["without_allreduce"][w] = {}
        for batch in batches:
            main = batch == global_batch
            m = measure(w, global_batch=batch, steps=steps, repeats=repeats, scan_steps=scan_steps,
                        variants=variants if main else (), device_counts=device_counts, without_allreduce=bare)
            if main:
                report["workloads"][w] = m["variants"]
            report["overhead"][w][str(batch)] = _overhead_table(m["devices"])
            one = m["devices"][1]["step_ms"]
            for k, r in m["without_allreduce"].items():
                report["without_allreduce"][w][str(batch)] = {"devices": k, "step_ms": r["step_ms"],
                                                              "overhead": round(r["step_ms"] / one, 3)}
        res = report["workloads"][w]
        if "single_jit" in res and REFERENCE in res:
            report["fusion_gain"][w] = round(res["single_jit"]["step_ms"] / res[REFERENCE]["step_ms"], 3)
    report["allreduce"] = {}
    several = [k for k in device_counts if k > 1]
    if several:
        sizes = {"1 number": 1, **{w: buffer_size(w) for w in workload_names}}
        ms = allreduce_ms(sizes, several, repeats=repeats)
        report["allreduce"] = {label: {"size": size, "ms": {str(k): ms[label][k] for k in several}}
                               for label, size in sizes.items()}
    report["goals"] = goals(report) if is_default else {}
    return report


def table(report: dict) -> str:
    m = report["machine"]
    st = report["settings"]
    kind = "simulated CPU devices" if m["simulated"] else f"{m['platform']} devices ({m['device_kind']})"
    lines = [f"{m['device_count']} {kind}, {m['cpu_count']} CPU cores, {m['machine']} {m['system']}, "
             f"JAX {m['jax']}, Python {m['python']}" + (f", XLA_FLAGS={m['xla_flags']}" if m.get("xla_flags") else ""),
             f"global batch {st['global_batch']}, median of {st['repeats']} runs of {st['steps']} steps, "
             f"ms per step; each variant x its group's reference (like with like)"]
    for w, res in report["workloads"].items():
        lines.append(f"\n{w}:")
        groups = [(f"one dispatch per step, x {UNFUSED_REFERENCE}", UNFUSED_REFERENCE,
                   [v for v in res if reference_of(v) == UNFUSED_REFERENCE]),
                  (f"{st['scan_steps']} steps fused per dispatch, x {REFERENCE}", REFERENCE,
                   [v for v in res if reference_of(v) == REFERENCE])]
        for title, reference, names in groups:
            if not names:
                continue
            ref = res.get(reference, {}).get("step_ms")
            lines.append(f"  {title}:")
            for variant in names:
                r = res[variant]
                mark = "  <- default" if variant == report.get("default_variant") else ""
                mark = "  <- reference" if variant == reference else mark
                ratio = f"({r['step_ms'] / ref:5.2f}x)" if ref else " " * 8
                lines.append(f"    {variant:<18} {r['step_ms']:8.3f} ms  {ratio}  final loss "
                             f"{r['final_loss']:.6f}{mark}")
    if report.get("fusion_gain"):
        lines.append(f"\nfusion's gain on one device (single_jit / {REFERENCE}): " +
                     ", ".join(f"{w} {g:.2f}x" for w, g in report["fusion_gain"].items()))
    if report.get("overhead"):
        counts = st["device_counts"]
        lines.append(f"\ndata-parallel overhead: the default path on k devices / on 1 device ({REFERENCE}), "
                     f"same global batch; the limit on simulated devices is {LIMIT:.2f}x")
        bare = report.get("without_allreduce", {})
        has_bare = any(bare.get(w) for w in report["overhead"])
        if has_bare:
            lines.append(f"  (no all-reduce: the same on {max(counts)} devices with its all-reduce taken out, a wrong step "
                         "timed only to see what the rest costs)")
        lines.append(f"  {'workload':<11} {'batch':>5}" + "".join(f"{f'{k} dev':>9}" for k in counts)
                     + (f"{'no all-reduce':>15}" if has_bare else ""))
        for w, per_batch in report["overhead"].items():
            for batch, row in per_batch.items():
                b = bare.get(w, {}).get(batch)
                lines.append(f"  {w:<11} {batch:>5}" + "".join(f"{row[str(k)]['overhead']:8.2f}x" for k in counts)
                             + (f"{b['overhead']:14.2f}x" if b else ""))
    if report.get("allreduce"):
        counts = [k for k in st["device_counts"] if k > 1]
        lines.append("\none all-reduce on its own, ms (psum of a float32 vector in a fused loop, minus the same loop "
                     "without it)")
        lines.append(f"  {'buffer':<24}" + "".join(f"{f'{k} dev':>9}" for k in counts))
        for label, r in report["allreduce"].items():
            name = f"{label} ({r['size']:,})"
            lines.append(f"  {name:<24}" + "".join(f"{r['ms'][str(k)]:9.3f}" for k in counts))
    if report.get("goals"):
        lines.append("\ngoals:")
        for name, g in report["goals"].items():
            limit = f", {g['from_limit']:+.2f} from the limit {g['limit']:.2f}x" if "limit" in g else ""
            lines.append(f"  {name:<30} {g['ratio']:6.2f}  (goal {g['goal']}{limit}): "
                         f"{'met' if g['met'] else 'NOT met'}")
            notes = []
            if "without_allreduce" in g:
                notes.append(f"without its all-reduce {g['without_allreduce']:.2f}x")
            if "allreduce_share" in g:
                notes.append(f"one all-reduce on its own {g['allreduce_ms']:.3f} ms = {g['allreduce_share']:.2f}x "
                             "the one-device step")
            if notes:
                lines.append(f"  {'':<30} " + "; ".join(notes))
    return "\n".join(lines)


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {value}; pass 1 or more")
    return value


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m course_lib.bench", description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=_at_least_one, default=8,
                   help="simulated CPU devices when there is no accelerator")
    p.add_argument("--global-batch", type=_at_least_one, default=512, help="examples per step, over all devices")
    p.add_argument("--extra-batches", type=_at_least_one, nargs="*", default=[256],
                   help="more global batches at which to measure the overhead (default 256)")
    p.add_argument("--steps", type=_at_least_one, default=100)
    p.add_argument("--repeats", type=_at_least_one, default=7)
    p.add_argument("--scan-steps", type=_at_least_one, default=None, help="default: training.fit's steps_per_call")
    p.add_argument("--json", default="bench.json", help="where to write the results (default bench.json)")
    args = p.parse_args(argv)
    scan_steps = _fit_default("steps_per_call") if args.scan_steps is None else args.scan_steps
    if args.steps % scan_steps:
        p.error(f"--steps must be a multiple of --scan-steps ({scan_steps}), got {args.steps}; pass e.g. --steps "
                f"{max(scan_steps, args.steps - args.steps % scan_steps)}")
    # The overhead is measured on 1, 2, 4, ... and --devices devices: every batch must split over each of them.
    counts = device_counts_for(args.devices)
    multiple = _lcm(counts)
    for flag, batch in [("--global-batch", args.global_batch)] + [("--extra-batches", b) for b in args.extra_batches]:
        if batch % multiple:
            p.error(f"{flag} must split evenly over every device count the overhead is measured on with --devices "
                    f"{args.devices} ({', '.join(map(str, counts))}), got {batch}; pass a multiple of {multiple}")
    # Before the run, not after it: an unwritable path fails at once, not at the end.
    folder = os.path.dirname(os.path.abspath(args.json))
    if os.path.isdir(args.json) or not os.path.isdir(folder) or not os.access(folder, os.W_OK) or (
            os.path.exists(args.json) and not os.access(args.json, os.W_OK)):
        p.error(f"--json must be a file that can be written, got {args.json!r}; pass a path in a folder that exists "
                "and that you can write to")
    from course_lib import devices
    devices.simulate_devices(args.devices)
    report = run(global_batch=args.global_batch, steps=args.steps, repeats=args.repeats, scan_steps=args.scan_steps,
                 extra_batches=args.extra_batches)
    print(table(report))
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\nwritten: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
