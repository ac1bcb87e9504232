"""Checkpointing with several processes, and a save that crashes half-way: the two programs of lesson 11.

``python -m course_lib.checkpoint_worker --directory DIR`` (started by ``distributed.launch`` with the
coordinator flags, one per process) trains the lesson 05 regression on every device of every process, and
saves a checkpoint every ``--save-every`` steps. Every process calls ``save``: each writes the parts of the
arrays that live on its devices, and Orbax's process 0 alone writes the metadata and renames the step into
place. Only process 0 logs. Each process prints ``RESULT {json}`` last.

``crash_mid_save(directory, step)`` starts ``python -m course_lib.checkpoint_worker --crash-test`` in a child
process that saves a large state, and kills it with SIGKILL while the save is being written; the child is
stopped and reaped on every path.

The coordinator binds to 127.0.0.1 only (``coordinator_bind_address``).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import select
import signal
import subprocess
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m course_lib.checkpoint_worker", description=__doc__.splitlines()[0])
    p.add_argument("--coordinator-address", help="127.0.0.1:port of process 0")
    p.add_argument("--num-processes", type=int)
    p.add_argument("--process-id", type=int)
    p.add_argument("--local-devices", type=int, help="simulate this many CPU devices in this process")
    p.add_argument("--directory", required=True, help="the checkpoint directory, shared by every process")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--crash-test", action="store_true", help="one process: start saving a large state, then wait")
    p.add_argument("--init-timeout", type=int, default=60)
    return p.parse_args(argv)


def start(args) -> None:
    """CPU devices and the distributed runtime, bound to loopback; before any other JAX operation."""
    import jax

    if args.local_devices:
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", args.local_devices)
    if args.num_processes and args.num_processes > 1:
        host, port = args.coordinator_address.rsplit(":", 1)
        if host not in ("127.0.0.1", "localhost"):
            raise SystemExit(f"--coordinator-address {args.coordinator_address}: this worker is for one machine; "
                             "use 127.0.0.1:PORT.")
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=args.num_processes,
                                   process_id=args.process_id, coordinator_bind_address=f"127.0.0.1:{port}",
                                   initialization_timeout=args.init_timeout)


def train_and_save(directory, steps=20, save_every=10, batch_size=64, seed=0, log=print) -> dict:
    """Train on every device of every process and save every ``save_every`` steps; this process's view."""
    import jax
    import jax.numpy as jnp
    import optax
    from jax.sharding import NamedSharding, PartitionSpec as P

    from course_lib import checkpoint, data, sharding, training

    devices = jax.devices()
    n, pid = len(devices), jax.process_index()
    mesh = sharding.device_mesh(devices)
    split = NamedSharding(mesh, P(sharding.DEVICE_AXIS))
    mine = [i for i, d in enumerate(mesh.devices.flat) if d.process_index == pid]
    x, y, _ = data.regression_data(n=1024, seed=seed)

    def loss_fn(params, batch, key):
        return training.masked_mean((batch["x"] @ params["w"] + params["b"] - batch["y"]) ** 2, batch["mask"])

    def global_batch(batch):  # this process builds only its devices' rows (lesson 08)
        return {k: jax.make_array_from_process_local_data(split, v[mine[0]:mine[-1] + 1], v.shape)
                for k, v in batch.items()}

    optimizer = optax.sgd(0.1)
    state = training.init_state({"w": jnp.zeros(x.shape[1]), "b": jnp.float32(0.0)}, optimizer,
                                jax.random.key(seed), devices=devices, backend="jit")
    step = training.make_train_step(loss_fn, optimizer, devices=devices, backend="jit")
    batches = (global_batch(b) for b in data.batches(x, y, batch_size, n_devices=n, seed=seed, epochs=None))
    losses, saved = [], []
    with checkpoint.Checkpoints(directory) as ckpt:
        for i, batch in zip(range(1, steps + 1), batches):
            state, metrics = step(state, batch)
            losses.append(float(metrics["loss"]))
            if i % save_every == 0:
                # Every process calls save. The replicated state is written once (by the process holding its
                # replica 0); the sharded batch by every process, for the rows on its own devices.
                ckpt.save(i, {"state": state, "last_batch_x": batch["x"]}, extra={"position": i, "seed": seed})
                saved.append(i)
                if pid == 0:
                    log(f"step {i}: loss {losses[-1]:.4f}, checkpoint saved")
    params = jax.tree.map(lambda a: a.addressable_shards[0].data.tolist(), state.params)
    return {"process_index": pid, "process_count": jax.process_count(), "devices": n, "saved": saved,
            "losses": losses, "params": params}


def crash_test(directory, step: int, megabytes: int = 64) -> None:
    """Start an asynchronous save of ``megabytes`` of arrays, say so, and wait for it (to be killed meanwhile)."""
    import jax.numpy as jnp

    from course_lib import checkpoint

    ckpt = checkpoint.Checkpoints(directory, asynchronous=True)
    pieces = 16
    state = {f"w{i:02d}": jnp.full((megabytes * 2 ** 20 // (4 * pieces),), float(i)) for i in range(pieces)}
    ckpt.save(step, state, extra={"position": step})
    # Orbax may create the step's temporary directory in its background thread too: say SAVING only once the
    # half-written step is on disk (or, on a fast disk, already complete), so that the kill lands mid-save.
    folder, deadline = pathlib.Path(directory), time.monotonic() + 30
    while time.monotonic() < deadline and not (
            folder.is_dir() and any(p.name.startswith(str(step)) for p in folder.iterdir())):
        time.sleep(0.005)
    print("SAVING", flush=True)  # the arrays are off the devices; a background thread is writing them
    ckpt.wait()
    print("SAVED", flush=True)


def crash_mid_save(directory, step: int, megabytes: int = 64, timeout: float = 120.0) -> dict:
    """Run a save of step ``step`` in a child process and SIGKILL it mid-save; report what it left behind.

    Returns ``{"killed_mid_save": bool, "left_behind": [names in directory], "returncode": int}``:
    ``killed_mid_save`` is true when the kill landed before the step was complete. The child is killed and
    reaped on every path (an error, a timeout, Ctrl-C).
    """
    from course_lib import _checks

    if isinstance(directory, bool) or not isinstance(directory, (str, os.PathLike)) or str(directory) == "":
        _checks.fail("crash_mid_save", "directory", "a path (a str or a pathlib.Path)", directory,
                     "Pass the checkpoint directory, e.g. run_dir.", TypeError)
    step = _checks.whole(step, "step", "crash_mid_save", minimum=0,
                         fix="Pass a step newer than the directory's latest, e.g. step=200.")
    megabytes = _checks.whole(megabytes, "megabytes", "crash_mid_save", fix="e.g. megabytes=64.")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        _checks.fail("crash_mid_save", "timeout", "a number of seconds > 0", timeout, "e.g. timeout=120.",
                     TypeError if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) else ValueError)
    directory = pathlib.Path(directory)
    latest = max((int(q.name) for q in directory.iterdir() if q.name.isdigit()), default=None) \
        if directory.is_dir() else None
    if latest is not None and step <= latest:
        raise ValueError(f"crash_mid_save: step={step}, but {directory.name}/ already holds step {latest}: the child "
                         f"would refuse to save it. Pass a newer step, e.g. step={latest + 100}.")
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "course_lib.checkpoint_worker", "--directory", str(directory), "--crash-test",
           "--steps", str(step), "--batch-size", str(megabytes)]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                             env=env, start_new_session=True, text=True)
    lines = []
    try:
        deadline = time.monotonic() + timeout
        while "SAVING" not in lines and time.monotonic() < deadline:
            ready, _, _ = select.select([child.stdout], [], [], 0.5)
            if ready:
                line = child.stdout.readline()
                if not line:  # the child ended
                    break
                lines.append(line.strip())
        os.killpg(child.pid, signal.SIGKILL)  # mid-save: the background thread is writing the arrays
    finally:
        if child.poll() is None:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        child.wait(timeout=30)
        child.stdout.close()
    if "SAVING" not in lines:
        raise RuntimeError(f"the crash-test child never started its save (exit code {child.returncode}).")
    return {"killed_mid_save": "SAVED" not in lines and str(step) not in _complete(directory),
            "left_behind": sorted(p.name for p in directory.iterdir()), "returncode": child.returncode}


def _complete(directory: pathlib.Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.name.isdigit()]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.crash_test:
        start(args)
        crash_test(args.directory, args.steps, megabytes=args.batch_size)
        return 0
    start(args)
    result = train_and_save(args.directory, args.steps, args.save_every, args.batch_size, args.seed,
                            log=lambda m: print(m, flush=True))
    print("RESULT " + json.dumps(result), flush=True)
    if args.num_processes and args.num_processes > 1:
        import jax
        jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
