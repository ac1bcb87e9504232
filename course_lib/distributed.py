"""Launch several JAX processes on this machine, as a cluster would on several, and collect their results.

Lesson 08. ``launch`` starts ``num_processes`` copies of ``python -m course_lib.train_dp``
(or another module), each with its own simulated CPU devices, joined through JAX's
distributed runtime on ``127.0.0.1``. It waits for all of them and returns what each one
printed on its ``RESULT`` line. It never leaves a process behind:

* it binds only to the loopback address: the coordinator that process 0 starts listens on ``127.0.0.1``
  alone (``coordinator_bind_address``), not on every interface;
* every worker dies with the Python process that launched it, even one killed with ``kill -9`` (a crash, a
  kernel restart): each worker runs under ``course_lib._worker``, which sets a parent-death signal on Linux and,
  everywhere, watches a pipe from the launcher and kills its own process group when the pipe closes;
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
import numbers
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from . import _checks, _worker

__all__ = ["WorkerFailed", "WorkerResult", "Launcher", "launch", "free_port", "worker_env"]

# Proxy settings that gRPC (the coordinator's transport) may honour; JAX warns about every one of them, no_proxy too.
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "grpc_proxy", "ftp_proxy", "no_proxy")


class WorkerFailed(RuntimeError):
    """A worker exited with an error, exited without a result, or the job timed out; every worker has been stopped."""


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
    devices_per_process = _checks.whole(devices_per_process, "devices_per_process", "worker_env")
    if base is not None and not isinstance(base, dict):
        _checks.fail("worker_env", "base", "a dict of environment variables, or None", base,
                     "Pass e.g. base=dict(os.environ).", TypeError)
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
        where = type(self).__name__
        self.num_processes = _checks.whole(num_processes, "num_processes", where)
        self.devices_per_process = _checks.whole(devices_per_process, "devices_per_process", where)
        if not isinstance(module, str) or not module or module.endswith(".py"):
            _checks.fail(where, "module", "a module name to run with python -m", module,
                         "Pass e.g. module='course_lib.train_dp' (dotted, no .py).",
                         ValueError if isinstance(module, str) else TypeError)
        if isinstance(args, (str, bytes)) or not all(isinstance(a, str) for a in _iterable(args, where)):
            _checks.fail(where, "args", "a list of strings (command-line arguments)", args,
                         "Pass e.g. args=['--steps', '40'].", TypeError)
        self.timeout = _positive_seconds(timeout, "timeout", where)
        if env is not None and not isinstance(env, dict):
            _checks.fail(where, "env", "a dict of environment variables, or None", env,
                         "Pass e.g. env={**os.environ, 'XLA_FLAGS': '...'}.", TypeError)
        self.module, self.args, self.base_env = module, list(args), env
        self.processes: list[subprocess.Popen] = []
        self._logs = []
        self._tmp = None
        self._lifeline = None  # the write end of the pipe every worker watches; closing it ends them
        self.coordinator_address = None  # 127.0.0.1:port, once started

    def start(self) -> "Launcher":
        """Start the workers, each in a session of its own, tied to this process's life (see the module doc)."""
        if self.processes:
            raise RuntimeError(f"{type(self).__name__}.start: the workers are already started; make a new "
                               "Launcher to run the job again.")
        try:
            port = free_port()
            self._tmp = tempfile.TemporaryDirectory(prefix="course_workers_")
            env = worker_env(self.devices_per_process, self.base_env)
            read_end, self._lifeline = os.pipe()
            env[_worker.PIPE_VARIABLE] = str(read_end)
            env[_worker.PARENT_VARIABLE] = str(os.getpid())
            address = self.coordinator_address = f"127.0.0.1:{port}"
            try:
                for pid in range(self.num_processes):
                    log = open(os.path.join(self._tmp.name, f"worker{pid}.log"), "w+")
                    self._logs.append(log)
                    cmd = [sys.executable, "-m", "course_lib._worker", self.module, "--coordinator-address", address,
                           "--num-processes", str(self.num_processes), "--process-id", str(pid),
                           "--local-devices", str(self.devices_per_process), *self.args]
                    # A session of its own, so that stopping a worker stops anything it started.
                    self.processes.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                           stdin=subprocess.DEVNULL, start_new_session=True,
                                                           pass_fds=(read_end,)))
            finally:
                os.close(read_end)
        except BaseException:
            self.close()
            raise
        return self

    def output(self, pid: int) -> str:
        """What worker ``pid`` has printed so far (stdout and stderr)."""
        pid = _checks.whole(pid, "pid", f"{type(self).__name__}.output", minimum=0)
        if pid >= len(self._logs):
            _checks.fail(f"{type(self).__name__}.output", "pid", f"a started worker's index, 0..{len(self._logs) - 1}",
                         pid, "Call start() first." if not self._logs else f"Pass pid={len(self._logs) - 1} or less.")
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
        """Wait for every worker; stop them all as soon as one fails or time runs out.

        Every worker must exit 0 and print a ``RESULT {json}`` line. On any other ending (an error, no result, the
        timeout, Ctrl-C, a bad argument) every worker is stopped before the exception leaves.
        """
        try:
            if not self.processes:
                raise RuntimeError(f"{type(self).__name__}.wait: no workers are running; call start() first, or use "
                                   "the launcher as a context manager (with Launcher(...) as launcher:).")
            poll = _positive_seconds(poll, "poll", f"{type(self).__name__}.wait", 0.1)
            deadline = time.monotonic() + self.timeout
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
            results = []
            for i, p in enumerate(self.processes):
                text = self.output(i)
                lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
                if not lines:
                    raise WorkerFailed(f"worker {i} (process {i} of {self.num_processes}) exited with code 0 but "
                                       f"printed no 'RESULT {{json}}' line, so it has no result. A worker module "
                                       f"must end by printing one (as course_lib.train_dp does). Its last output:\n"
                                       f"{_tail(text) or '(nothing)'}")
                try:
                    result = json.loads(lines[-1][7:])
                except json.JSONDecodeError as e:
                    raise WorkerFailed(f"worker {i} printed a RESULT line that is not JSON ({e}); print it with "
                                       f"json.dumps. The line: {lines[-1][:200]}") from None
                results.append(WorkerResult(i, p.returncode, text, result))
            return results
        except BaseException:
            self.stop()
            raise

    def close(self) -> None:
        """Stop the workers, close the pipe they watch, delete their logs. Safe to call twice."""
        self.stop()
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        for log in self._logs:
            log.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()


def _iterable(value, where):
    try:
        return list(value)
    except TypeError:
        _checks.fail(where, "args", "a list of strings (command-line arguments)", value,
                     "Pass e.g. args=['--steps', '40'].", TypeError)


def _positive_seconds(value, name, where, example=180) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0 or value == float("inf"):
        _checks.fail(where, name, "a number of seconds > 0", value, f"Pass e.g. {name}={example}.",
                     ValueError if isinstance(value, numbers.Real) and not isinstance(value, bool) else TypeError)
    return float(value)


def launch(num_processes: int = 2, devices_per_process: int = 4, args=(), timeout: float = 180.0,
           module: str = "course_lib.train_dp", env: dict | None = None) -> list[WorkerResult]:
    """Run ``python -m module`` as ``num_processes`` cooperating JAX processes on 127.0.0.1; return their results.

    Raises:
      WorkerFailed: a worker failed (named, with its last output), exited without a ``RESULT`` line, or the job
        timed out; all were stopped.
      TypeError, ValueError: a bad argument, before any worker starts.
    """
    with Launcher(num_processes, devices_per_process, module, args, timeout, env) as launcher:
        return launcher.wait()
