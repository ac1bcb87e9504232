"""Data-parallel training of the lesson 05/07 linear regression, as one process of a multi-process job.

Lesson 08. Every process runs this same program (SPMD again, one level up). Each one starts
JAX's distributed runtime, sees all devices of all processes, builds its own part of each
global batch, and calls the same jitted step; the gradient all-reduce spans the processes.

From a shell, one command per process::

    python -m course_lib.train_dp --coordinator-address 127.0.0.1:12345 --num-processes 2 --process-id 0 \\
        --local-devices 4
    python -m course_lib.train_dp --coordinator-address 127.0.0.1:12345 --num-processes 2 --process-id 1 \\
        --local-devices 4

On a cluster (Cloud TPU, SLURM, Kubernetes with JobSet) leave out the three coordinator flags:
``jax.distributed.initialize()`` finds them. ``--local-devices`` simulates CPU devices and is for one
machine only. Each process prints ``RESULT {json}`` as its last line.

The coordinator that process 0 starts listens on the address given, ``127.0.0.1`` above, and nowhere else
(``coordinator_bind_address``); JAX's default would listen on every interface of the machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from course_lib import _checks


def _at_least(minimum):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {minimum}, got {value}; pass {minimum} or "
                                             "more")
        return value
    return parse


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m course_lib.train_dp", description=__doc__.splitlines()[0])
    p.add_argument("--coordinator-address", help="host:port of process 0 (omit on a cluster: auto-detected)")
    p.add_argument("--num-processes", type=_at_least(1), help="how many processes (omit on a cluster)")
    p.add_argument("--process-id", type=_at_least(0), help="this process's index, 0..num_processes-1 (omit on a "
                   "cluster)")
    p.add_argument("--local-devices", type=_at_least(1),
                   help="simulate this many CPU devices in this process (one machine)")
    p.add_argument("--single-process", action="store_true", help="no distributed runtime: all devices local")
    p.add_argument("--interleave-devices", action="store_true",
                   help="order the mesh's devices round-robin over the processes (each feeds non-adjacent rows)")
    p.add_argument("--steps", type=_at_least(1), default=50)
    p.add_argument("--batch-size", type=_at_least(1), default=64, help="the global batch, over all devices")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=_at_least(0), default=0)
    p.add_argument("--init-timeout", type=_at_least(1), default=60, help="seconds to wait for the other processes")
    args = p.parse_args(argv)
    if args.process_id is not None and args.num_processes is not None and args.process_id >= args.num_processes:
        p.error(f"--process-id must be in 0..{args.num_processes - 1} (--num-processes {args.num_processes}), got "
                f"{args.process_id}")
    if args.coordinator_address is not None and not args.coordinator_address.rpartition(":")[2].isdigit():
        p.error(f"--coordinator-address must be host:port, e.g. 127.0.0.1:12345, got {args.coordinator_address!r}")
    return args


def start(args) -> None:
    """Configure devices and start the distributed runtime, before any other JAX operation."""
    import jax

    if args.local_devices:
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", args.local_devices)
    if args.single_process:
        return
    explicit = [args.coordinator_address, args.num_processes, args.process_id]
    if any(v is not None for v in explicit) and not all(v is not None for v in explicit):
        raise SystemExit("give all three of --coordinator-address, --num-processes and --process-id, or none "
                         "(on a cluster, where jax.distributed.initialize() discovers them)")
    # The coordinator (process 0) listens on the address given, and on no other interface of the machine.
    jax.distributed.initialize(coordinator_address=args.coordinator_address, num_processes=args.num_processes,
                               process_id=args.process_id, initialization_timeout=args.init_timeout,
                               coordinator_bind_address=args.coordinator_address)


def _check_counts(steps, batch_size) -> None:
    _checks.whole(steps, "steps", "train_dp.train")
    _checks.whole(batch_size, "batch_size", "train_dp.train")


def train(steps: int = 50, batch_size: int = 64, lr: float = 0.1, seed: int = 0, log=print,
          devices=None) -> dict:
    """Train on every device of every process; return this process's view of the result.

    Each process loads only the rows of each global batch that belong to its own devices and
    assembles the global array with ``jax.make_array_from_process_local_data``. ``devices`` (default
    ``jax.devices()``) sets the mesh's order; a process's devices need not be adjacent in it.
    """
    import jax
    import jax.numpy as jnp
    import optax
    from jax.sharding import NamedSharding, PartitionSpec as P

    from course_lib import data, sharding, training

    _check_counts(steps, batch_size)
    devices = jax.devices() if devices is None else _checks.device_list(devices, "devices", "train_dp.train")
    n, pid = len(devices), jax.process_index()
    mesh = sharding.device_mesh(devices)
    split = NamedSharding(mesh, P(sharding.DEVICE_AXIS))
    # Which rows of the (n, B // n, ...) batch are this process's: those of its own devices.
    mine = [i for i, d in enumerate(mesh.devices.flat) if d.process_index == pid]
    rows = f"{mine[0]}..{mine[-1]}" if mine == list(range(mine[0], mine[-1] + 1)) else ", ".join(map(str, mine))
    log(f"process {pid} of {jax.process_count()}: {jax.local_device_count()} local devices, {n} in all; "
        f"this process feeds device rows {rows}")

    x, y, true_params = data.regression_data(n=1024, seed=seed)

    def loss_fn(params, batch, key):
        pred = batch["x"] @ params["w"] + params["b"]
        return training.masked_mean((pred - batch["y"]) ** 2, batch["mask"])

    def my_part_of_each_batch():
        for batch in data.batches(x, y, batch_size, n_devices=n, seed=seed, epochs=None):
            yield {k: jax.make_array_from_process_local_data(split, v[mine], v.shape)
                   for k, v in batch.items()}

    optimizer = optax.sgd(lr)
    state = training.init_state({"w": jnp.zeros(x.shape[1]), "b": jnp.float32(0.0)}, optimizer,
                                jax.random.key(seed), devices=devices, backend="jit")
    step = training.make_train_step(loss_fn, optimizer, devices=devices, backend="jit")
    start_time = time.perf_counter()
    state, history = training.fit(step, state, my_part_of_each_batch(), num_steps=steps, progress=False)
    for h in history["train"]:
        if h["step"] % 10 == 0 or h["step"] == steps:
            log(f"process {pid}: step {h['step']:>4} loss {h['loss']:.6f}")
    params = jax.tree.map(lambda a: a.addressable_shards[0].data.tolist(), state.params)
    return {"process_index": pid, "process_count": jax.process_count(), "devices": n,
            "device_owners": [[d.id, d.process_index, d.platform, d.device_kind] for d in devices],
            "local_devices": jax.local_device_count(), "steps": steps, "final_loss": history["train"][-1]["loss"],
            "losses": [h["loss"] for h in history["train"]], "params": params,
            "seconds": round(time.perf_counter() - start_time, 3)}


def main(argv=None) -> int:
    args = parse_args(argv)
    start(args)

    def log(msg):
        print(msg, flush=True)

    devices = None
    if args.interleave_devices:  # round-robin: process 0's first device, process 1's first, ..., then the seconds
        import jax
        devices = sorted(jax.devices(), key=lambda d: ([x for x in jax.devices() if x.process_index ==
                                                         d.process_index].index(d), d.process_index))
    result = train(steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed, log=log,
                   devices=devices)
    print("RESULT " + json.dumps(result), flush=True)
    if not args.single_process:
        import jax
        jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
