"""What data parallelism costs, measured: one training step per global batch, eight ways, two workloads.

Lesson 08. ``python -m course_lib.bench`` prints a table, writes JSON, and names the machine,
the device kind and the JAX version. It runs on whatever devices exist (simulated CPU devices,
one GPU, a TPU slice); with ``--devices N`` on a CPU-only machine it simulates N devices.

Variants, all from the same initial parameters over the same global batches (``VARIANTS``):

* ``single_jit``: one device, a jitted step on the whole global batch (the reference, and on simulated
  devices, which share the host's cores, the practical limit);
* ``naive_pmap``: the tutorial loop: course_lib's pmap step, one dispatch per step, and a host read of the
  loss after every step;
* ``pmap_step``: the same step in ``training.fit`` with ``steps_per_call=1``: one dispatch per step, no
  per-step host read;
* ``pmap_scan``: course_lib's default path, ``training.make_train_step`` + ``training.fit`` with no settings:
  ``steps_per_call`` (10) steps fused into one dispatch with ``lax.scan``, the oldest dispatch read back only
  when ``max_ahead`` (20) steps would otherwise be in flight;
* ``shard_map``: the same with the ``"shard_map"`` backend of ``training.make_train_step``;
* ``jit_sharded``: the same with the ``"jit"`` backend (plain jit, sharded inputs);
* ``fsdp`` and ``accumulate`` (lesson 10): ``sharded_state``'s FSDP step, and its replicated step with 4
  micro-batches per device (``sharded_state.bench_variants``), one dispatch per step.

The pmap and shard_map variants send one all-reduce per step (``training.psum_bucketed``); for
``jit_sharded`` the compiler decides (two, on the CPU backend).

Every figure is the median over ``--repeats`` timed runs of ``--steps`` steps, after a warm-up run
that compiles, each run ended by ``block_until_ready`` (or a host read of the loss, which waits the same way).
The variants take turns, one run each per round, so that a slow spell of a shared machine hits them all
alike. The batches are on the devices before timing starts, and so is each run's initial state.

``goals(report)`` checks the two goals the README states, for the default path: at most 1.25x the
``single_jit`` step on the MLP, and at least 3x faster than ``naive_pmap`` on the linear regression.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import sys
import time


def workloads(name, global_batch, seed=0):
    """(params, loss_fn(params, batch, key), x, y) for 'regression' or 'mlp'."""
    import jax
    import jax.numpy as jnp
    import optax

    from course_lib import data, training

    if name == "regression":
        x, y, _ = data.regression_data(n=max(4096, global_batch * 4), seed=seed)
        params = {"w": jnp.zeros(x.shape[1]), "b": jnp.float32(0.0)}

        def loss_fn(p, batch, key):
            return training.masked_mean((batch["x"] @ p["w"] + p["b"] - batch["y"]) ** 2, batch["mask"])

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
            return training.masked_mean(ce, batch["mask"])

        return params, loss_fn, x, y, optax.adam(1e-3)
    raise ValueError(f"unknown workload {name!r}: 'regression' or 'mlp'")


def _median(values):
    values = sorted(values)
    return values[len(values) // 2]


VARIANTS = ("single_jit", "naive_pmap", "pmap_step", "pmap_scan", "shard_map", "jit_sharded", "fsdp", "accumulate")


def _fit_default(name):
    from course_lib import training
    return inspect.signature(training.fit).parameters[name].default


def run_workload(name, *, global_batch=512, steps=100, repeats=7, scan_steps=None, variants=VARIANTS):
    """Time the ``variants`` on one workload: ``{variant: {"step_ms": ..., "final_loss": ...}}``.

    ``global_batch`` examples per step, split ``(n, global_batch // n, ...)`` over the ``n`` local devices.
    ``scan_steps`` (default: ``training.fit``'s ``steps_per_call``) is how many steps the fused variants run per
    dispatch; ``steps`` must be a multiple of it. With the default, ``pmap_scan`` calls ``fit`` with no settings
    at all: it is exactly the library's default path.
    """
    import jax
    import optax

    from course_lib import data, sharded_state, sharding, training

    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise ValueError(f"unknown variants {sorted(unknown)}; choose from {list(VARIANTS)}.")
    n = jax.local_device_count()
    default_k = _fit_default("steps_per_call")
    scan_steps = default_k if scan_steps is None else scan_steps
    if steps % scan_steps:
        raise ValueError(f"steps ({steps}) must be a multiple of scan_steps ({scan_steps}).")
    if global_batch % n:
        raise ValueError(f"global_batch ({global_batch}) must divide over the {n} devices; use a multiple of {n}.")
    params, loss_fn, x, y, opt = workloads(name, global_batch)
    host_batches = [b for b, _ in zip(data.batches(x, y, global_batch, n_devices=n, epochs=None), range(steps))]
    # variant -> (start, run): start() makes the initial state on the devices (not timed), run(state) trains
    # over every batch and returns the final loss, read on the host (which waits for the devices).
    runs = {}

    # single_jit: one device, the whole global batch.
    dev0 = jax.local_devices()[0]
    whole = [jax.device_put(jax.tree.map(lambda a: a.reshape((-1,) + a.shape[2:]), b), dev0) for b in host_batches]

    def single_loss(p, batch):
        return loss_fn(p, batch, None)

    @jax.jit
    def single_step(p, o, batch):
        loss, grads = jax.value_and_grad(single_loss)(p, batch)
        updates, o = opt.update(grads, o, p)
        return optax.apply_updates(p, updates), o, loss

    def run_single(state):
        p, o = state
        for b in whole:
            p, o, loss = single_step(p, o, b)
        return float(jax.block_until_ready(loss))

    runs["single_jit"] = (lambda: jax.block_until_ready(jax.device_put((params, opt.init(params)), dev0)),
                          run_single)

    # The data-parallel variants share course_lib's step and device-resident sharded batches.
    pmap_step = training.make_train_step(loss_fn, opt)
    split = jax.sharding.NamedSharding(sharding.device_mesh(), jax.sharding.PartitionSpec("devices"))
    device_batches = [jax.device_put(b, split) for b in host_batches]     # (n, B // n, ...), already in place

    def start(backend="pmap"):
        return lambda: jax.block_until_ready(training.init_state(params, opt, jax.random.key(0), backend=backend))

    def run_naive(state):
        for b in device_batches:
            state, metrics = pmap_step(state, b)
            loss = float(metrics["loss"][0])               # a host read every step
        return loss

    runs["naive_pmap"] = (start(), run_naive)

    def run_fit(step, **settings):
        def run(state):
            _, history = training.fit(step, state, device_batches, progress=False, **settings)
            return history["train"][-1]["loss"]
        return run

    fused = {} if scan_steps == default_k else {"steps_per_call": scan_steps, "max_ahead": 2 * scan_steps}
    runs["pmap_step"] = (start(), run_fit(pmap_step, steps_per_call=1))
    runs["pmap_scan"] = (start(), run_fit(pmap_step, **fused))
    for backend, label in [("shard_map", "shard_map"), ("jit", "jit_sharded")]:
        runs[label] = (start(backend), run_fit(training.make_train_step(loss_fn, opt, backend=backend), **fused))
    runs.update(sharded_state.bench_variants(params, loss_fn, opt, host_batches))     # lesson 10
    return _measure({v: runs[v] for v in VARIANTS if v in variants}, repeats, steps)


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


def machine() -> dict:
    import jax
    d = jax.devices()[0]
    return {"machine": platform.machine(), "system": platform.system(), "cpu_count": os.cpu_count(),
            "python": platform.python_version(), "jax": jax.__version__, "platform": d.platform,
            "device_kind": d.device_kind, "device_count": jax.device_count(),
            "simulated": d.platform == "cpu" and jax.device_count() > 1}


DEFAULT_VARIANT = "pmap_scan"   # what make_train_step + fit do with their defaults


def goals(report: dict) -> dict:
    """The two goals of the benchmark, from a report: the measured ratios and whether each is met.

    * the default path costs at most 1.25x the single-device jit step on the MLP;
    * it is at least 3x faster than the naive loop on the linear regression.
    """
    out = {}
    w = report["workloads"]
    if "mlp" in w and "single_jit" in w["mlp"]:
        r = w["mlp"][DEFAULT_VARIANT]["step_ms"] / w["mlp"]["single_jit"]["step_ms"]
        out["mlp_default_vs_single_jit"] = {"ratio": round(r, 3), "goal": "<= 1.25", "met": r <= 1.25}
    if "regression" in w and "naive_pmap" in w["regression"]:
        r = w["regression"]["naive_pmap"]["step_ms"] / w["regression"][DEFAULT_VARIANT]["step_ms"]
        out["regression_naive_vs_default"] = {"ratio": round(r, 3), "goal": ">= 3", "met": r >= 3}
    return out


def run(*, global_batch=512, steps=100, repeats=7, scan_steps=None, workload_names=("regression", "mlp"),
        variants=VARIANTS) -> dict:
    """Time the variants on every workload: ``{"machine", "settings", "default_variant", "workloads", "goals"}``.

    ``scan_steps`` defaults to ``training.fit``'s ``steps_per_call``, so ``pmap_scan`` is the default path; with
    any other ``scan_steps`` it is not, ``default_variant`` is ``None`` and no goals are reported.
    """
    from course_lib import _checks

    global_batch = _checks.whole(global_batch, "global_batch", "bench.run")
    steps = _checks.whole(steps, "steps", "bench.run")
    repeats = _checks.whole(repeats, "repeats", "bench.run")
    scan_steps = _checks.optional_whole(scan_steps, "scan_steps", "bench.run")
    default_k = _fit_default("steps_per_call")
    scan_steps = default_k if scan_steps is None else scan_steps
    if steps % scan_steps:
        raise ValueError(f"bench.run: steps must be a multiple of scan_steps ({scan_steps}), got {steps}; pass e.g. "
                         f"steps={max(scan_steps, steps - steps % scan_steps)}.")
    is_default = scan_steps == default_k and DEFAULT_VARIANT in variants
    report = {"machine": machine(), "settings": {"global_batch": global_batch, "steps": steps, "repeats": repeats,
                                                  "scan_steps": scan_steps},
              "default_variant": DEFAULT_VARIANT if is_default else None,
              "workloads": {w: run_workload(w, global_batch=global_batch, steps=steps, repeats=repeats,
                                            scan_steps=scan_steps, variants=variants) for w in workload_names}}
    report["goals"] = goals(report) if is_default else {}
    return report


def table(report: dict) -> str:
    m = report["machine"]
    kind = "simulated CPU devices" if m["simulated"] else f"{m['platform']} devices ({m['device_kind']})"
    lines = [f"{m['device_count']} {kind}, {m['cpu_count']} CPU cores, {m['machine']} {m['system']}, "
             f"JAX {m['jax']}, Python {m['python']}",
             f"global batch {report['settings']['global_batch']}, median of {report['settings']['repeats']} runs "
             f"of {report['settings']['steps']} steps, {report['settings']['scan_steps']} steps per fused dispatch; "
             f"ms per step (x single_jit)"]
    for w, res in report["workloads"].items():
        ref = res.get("single_jit", {}).get("step_ms")
        lines.append(f"\n{w}:")
        for variant, r in res.items():
            mark = "  <- default" if variant == report.get("default_variant") else ""
            ratio = f"({r['step_ms'] / ref:5.2f}x)" if ref else " " * 8
            lines.append(f"  {variant:<12} {r['step_ms']:9.3f} ms  {ratio}  final loss {r['final_loss']:.6f}{mark}")
    if report.get("goals"):
        lines.append("\ngoals:")
        for name, g in report["goals"].items():
            lines.append(f"  {name:<30} {g['ratio']:6.2f}  (goal {g['goal']}: {'met' if g['met'] else 'NOT met'})")
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
    p.add_argument("--steps", type=_at_least_one, default=100)
    p.add_argument("--repeats", type=_at_least_one, default=7)
    p.add_argument("--scan-steps", type=_at_least_one, default=None, help="default: training.fit's steps_per_call")
    p.add_argument("--json", default="bench.json", help="where to write the results (default bench.json)")
    args = p.parse_args(argv)
    scan_steps = _fit_default("steps_per_call") if args.scan_steps is None else args.scan_steps
    if args.steps % scan_steps:
        p.error(f"--steps must be a multiple of --scan-steps ({scan_steps}), got {args.steps}; pass e.g. --steps "
                f"{max(scan_steps, args.steps - args.steps % scan_steps)}")
    if args.global_batch % args.devices:
        p.error(f"--global-batch must divide across --devices {args.devices}, got {args.global_batch}; pass a "
                f"multiple of {args.devices}")
    # Before the run, not after it: an unwritable path fails at once, not at the end.
    folder = os.path.dirname(os.path.abspath(args.json))
    if os.path.isdir(args.json) or not os.path.isdir(folder) or not os.access(folder, os.W_OK) or (
            os.path.exists(args.json) and not os.access(args.json, os.W_OK)):
        p.error(f"--json must be a file that can be written, got {args.json!r}; pass a path in a folder that exists "
                "and that you can write to")
    import jax
    jax.config.update("jax_num_cpu_devices", args.devices)
    report = run(global_batch=args.global_batch, steps=args.steps, repeats=args.repeats, scan_steps=args.scan_steps)
    print(table(report))
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\nwritten: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
