"""Launch several JAX processes on this machine, as a cluster would on several, and collect their results.

Lesson 07. ``launch`` starts ``num_processes`` copies of ``python -m course_lib.train_dp``
(or another module), each with its own simulated CPU devices, joined through JAX's
distributed runtime on ``127.0.0.1``. It waits for all of them and returns what each one
printed on its ``RESULT`` line. It never leaves a process behind:

* it binds only to the loopback address;
* if a worker exits with an error, it stops the others at once and raises ``WorkerFailed``
  naming the worker and showing the end of its output (the survivors would otherwise wait in a
  collective for a partner that is gone);
* on timeout or Ctrl-C it stops every worker, then raises;
* proxy variables are removed from the workers' environment, so gRPC never tries to reach the
  coordinator through a proxy.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

__all__ = ["WorkerFailed", "WorkerResult", "Launcher", "launch", "free_port", "worker_env"]

# Proxy settings that gRPC (the coordinator's transport) may honour; JAX warns about every one of them, no_proxy too.
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "grpc_proxy", "ftp_proxy", "no_proxy")


class WorkerFailed(RuntimeError):
    """A worker exited with an error, or the job timed out; every worker has been stopped."""


@dataclasses.dataclass
class WorkerResult:
    process_id: int
    returncode: int
    output: str
    result: dict | None


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(devices_per_process: int, base: dict | None = None) -> dict:
    """The environment of a worker: no proxies, CPU devices, unbuffered output."""
    env = dict(os.environ if base is None else base)
    for name in PROXY_VARIABLES:
        env.pop(name, None)
        env.pop(name.upper(), None)
    env["JAX_PLATFORMS"] = "cpu"
    env["JAX_NUM_CPU_DEVICES"] = str(devices_per_process)
    env["PYTHONUNBUFFERED"] = "1"
    return env


_sleep = time.sleep  # the polling pause (a test replaces it to simulate Ctrl-C during the wait)


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


class Launcher:
    """Start, watch and stop a group of worker processes. Use ``launch`` unless you need the processes."""

    def __init__(self, num_processes: int = 2, devices_per_process: int = 4, module: str = "course_lib.train_dp",
                 args=(), timeout: float = 180.0, env: dict | None = None):
        if num_processes < 1 or devices_per_process < 1:
            raise ValueError("num_processes and devices_per_process must be at least 1.")
        self.num_processes, self.devices_per_process = num_processes, devices_per_process
        self.module, self.args, self.timeout, self.base_env = module, list(args), timeout, env
        self.processes: list[subprocess.Popen] = []
        self._logs = []
        self._tmp = None

    def start(self) -> "Launcher":
        port = free_port()
        self._tmp = tempfile.TemporaryDirectory(prefix="course_workers_")
        env = worker_env(self.devices_per_process, self.base_env)
        for pid in range(self.num_processes):
            log = open(os.path.join(self._tmp.name, f"worker{pid}.log"), "w+")
            cmd = [sys.executable, "-m", self.module, "--coordinator-address", f"127.0.0.1:{port}",
                   "--num-processes", str(self.num_processes), "--process-id", str(pid),
                   "--local-devices", str(self.devices_per_process), *self.args]
            # A session of its own, so that stopping a worker stops anything it started.
            self.processes.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                   stdin=subprocess.DEVNULL, start_new_session=True))
            self._logs.append(log)
        return self

    def output(self, pid: int) -> str:
        log = self._logs[pid]
        log.flush()
        with open(log.name) as f:
            return f.read()

    def stop(self) -> None:
        """Stop every worker still running: SIGTERM, then SIGKILL after 3 s. Safe to call twice."""
        for p in self.processes:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 3
        for p in self.processes:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=5)

    def wait(self, poll: float = 0.1) -> list[WorkerResult]:
        """Wait for every worker; stop them all as soon as one fails or time runs out."""
        deadline = time.monotonic() + self.timeout
        try:
            while True:
                codes = [p.poll() for p in self.processes]
                failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
                if failed:
                    i = failed[0]
                    self.stop()
                    raise WorkerFailed(f"worker {i} (process {i} of {self.num_processes}) exited with code {codes[i]}; "
                                       f"the other workers were stopped. Its last output:\n{_tail(self.output(i))}")
                if all(c == 0 for c in codes):
                    break
                if time.monotonic() > deadline:
                    running = [i for i, c in enumerate(codes) if c is None]
                    self.stop()
                    raise WorkerFailed(f"timed out after {self.timeout:.0f} s with workers {running} still running; "
                                       f"all were stopped. Last output of worker {running[0]}:\n"
                                       f"{_tail(self.output(running[0]))}")
                _sleep(poll)
        except BaseException:
            self.stop()
            raise
        results = []
        for i, p in enumerate(self.processes):
            text = self.output(i)
            lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
            results.append(WorkerResult(i, p.returncode, text, json.loads(lines[-1][7:]) if lines else None))
        return results

    def close(self) -> None:
        self.stop()
        for log in self._logs:
            log.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()


def launch(num_processes: int = 2, devices_per_process: int = 4, args=(), timeout: float = 180.0,
           module: str = "course_lib.train_dp", env: dict | None = None) -> list[WorkerResult]:
    """Run ``python -m module`` as ``num_processes`` cooperating JAX processes on 127.0.0.1; return their results.

    Raises:
      WorkerFailed: a worker failed (named, with its last output) or the job timed out; all were stopped.
    """
    with Launcher(num_processes, devices_per_process, module, args, timeout, env) as launcher:
        return launcher.wait()
