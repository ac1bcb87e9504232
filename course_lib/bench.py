"""What data parallelism costs, measured: one training step per global batch, six ways, two workloads.

Lesson 08. ``python -m course_lib.bench`` prints a table, writes JSON, and names the machine,
the device kind and the JAX version. It runs on whatever devices exist (simulated CPU devices,
one GPU, a TPU slice); with ``--devices N`` on a CPU-only machine it simulates N devices.

Variants, all from the same initial parameters over the same global batches:

* ``single_jit``: one device, a jitted step on the whole global batch (the reference);
* ``naive_pmap``: the tutorial loop, a pmap step and a host read of the loss after every step;
* ``pmap``: course_lib's default path, ``training.make_train_step`` + the bounded ``training.fit`` loop;
* ``pmap_scan``: ``scan_steps`` steps fused into one dispatch with ``lax.scan`` inside pmap;
* ``shard_map``: the ``"shard_map"`` backend of ``training.make_train_step``;
* ``jit_sharded``: the ``"jit"`` backend (plain jit, sharded inputs).

Every figure is the median over ``--repeats`` timed runs of ``--steps`` steps, after a warm-up run
that compiles, each run ended by ``block_until_ready``. The data lives on the devices before timing.
"""

from __future__ import annotations

import argparse
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


def run_workload(name, *, global_batch=256, steps=50, repeats=5, scan_steps=10):
    """Time every variant on one workload; returns {variant: {"step_ms": ..., "final_loss": ...}}."""
    import jax
    import numpy as np
    import optax

    from course_lib import data, sharding, training

    n = jax.local_device_count()
    if steps % scan_steps:
        raise ValueError(f"steps ({steps}) must be a multiple of scan_steps ({scan_steps}).")
    params, loss_fn, x, y, opt = workloads(name, global_batch)
    host_batches = [b for b, _ in zip(data.batches(x, y, global_batch, n_devices=n, epochs=None), range(steps))]
    results = {}

    def timed(run):
        run()                                             # warm-up: compile, first transfers
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            loss = run()
            times.append(time.perf_counter() - t0)
        return 1e3 * _median(times) / steps, loss

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

    def run_single():
        p, o = jax.device_put((params, opt.init(params)), dev0)
        for b in whole:
            p, o, loss = single_step(p, o, b)
        return float(jax.block_until_ready(loss))

    results["single_jit"] = timed(run_single)

    # The pmap variants share course_lib's step and device-resident sharded batches.
    pmap_step = training.make_train_step(loss_fn, opt)
    split = jax.sharding.NamedSharding(sharding.device_mesh(), jax.sharding.PartitionSpec("devices"))
    device_batches = [jax.device_put(b, split) for b in host_batches]     # (n, B // n, ...), already in place

    def fresh(backend="pmap"):
        return training.init_state(params, opt, jax.random.key(0), backend=backend)

    def run_naive():
        state = fresh()
        for b in device_batches:
            state, metrics = pmap_step(state, b)
            loss = float(metrics["loss"][0])               # a host read every step
        return loss

    results["naive_pmap"] = timed(run_naive)

    def run_fit(backend, step):
        def run():
            state = fresh(backend)
            _, history = training.fit(step, state, device_batches, progress=False)
            return history["train"][-1]["loss"]
        return run

    results["pmap"] = timed(run_fit("pmap", pmap_step))

    device_step = training.device_step(loss_fn, opt)

    def scan_body(state, batches):
        return jax.lax.scan(device_step, state, batches)

    scan_pmap = jax.pmap(scan_body, axis_name=training.AXIS)
    chunks = []
    for i in range(0, steps, scan_steps):
        group = host_batches[i:i + scan_steps]
        stacked = jax.tree.map(lambda *a: np.stack(a, axis=1), *group)    # (n, K, b, ...)
        chunks.append(jax.device_put(stacked, split))

    def run_scan():
        state = fresh()
        for c in chunks:
            state, metrics = scan_pmap(state, c)
        return float(np.asarray(metrics["loss"])[0, -1])

    results["pmap_scan"] = timed(run_scan)
    for backend, label in [("shard_map", "shard_map"), ("jit", "jit_sharded")]:
        results[label] = timed(run_fit(backend, training.make_train_step(loss_fn, opt, backend=backend)))
    return {k: {"step_ms": round(v[0], 4), "final_loss": float(v[1])} for k, v in results.items()}


def machine() -> dict:
    import jax
    d = jax.devices()[0]
    return {"machine": platform.machine(), "system": platform.system(), "cpu_count": os.cpu_count(),
            "python": platform.python_version(), "jax": jax.__version__, "platform": d.platform,
            "device_kind": d.device_kind, "device_count": jax.device_count(),
            "simulated": d.platform == "cpu" and jax.device_count() > 1}


def run(*, global_batch=256, steps=50, repeats=5, scan_steps=10, workload_names=("regression", "mlp")) -> dict:
    return {"machine": machine(), "settings": {"global_batch": global_batch, "steps": steps, "repeats": repeats,
                                                "scan_steps": scan_steps},
            "workloads": {w: run_workload(w, global_batch=global_batch, steps=steps, repeats=repeats,
                                          scan_steps=scan_steps) for w in workload_names}}


def table(report: dict) -> str:
    m = report["machine"]
    kind = "simulated CPU devices" if m["simulated"] else f"{m['platform']} devices ({m['device_kind']})"
    lines = [f"{m['device_count']} {kind}, {m['cpu_count']} CPU cores, {m['machine']} {m['system']}, "
             f"JAX {m['jax']}, Python {m['python']}",
             f"global batch {report['settings']['global_batch']}, median of {report['settings']['repeats']} runs "
             f"of {report['settings']['steps']} steps; ms per step (x single_jit)"]
    for w, res in report["workloads"].items():
        ref = res["single_jit"]["step_ms"]
        lines.append(f"\n{w}:")
        for variant, r in res.items():
            lines.append(f"  {variant:<12} {r['step_ms']:9.3f} ms  ({r['step_ms'] / ref:5.2f}x)  "
                         f"final loss {r['final_loss']:.6f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m course_lib.bench", description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=8, help="simulated CPU devices when there is no accelerator")
    p.add_argument("--global-batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--scan-steps", type=int, default=10)
    p.add_argument("--json", default="bench.json", help="where to write the results (default bench.json)")
    args = p.parse_args(argv)
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
