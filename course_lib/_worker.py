"""Run a module as a worker of ``course_lib.distributed`` that dies with the process that launched it.

``python -m course_lib._worker MODULE ARGS...`` runs ``python -m MODULE ARGS...`` after arranging two things,
so that a worker never outlives its launcher (a kernel restart, a crash, a ``kill -9``):

* on Linux, a parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGKILL)``): the kernel kills this process the
  moment its parent exits;
* everywhere, a pipe from the launcher (file descriptor ``COURSE_PARENT_PIPE``): a daemon thread waits on it,
  and when it closes (the launcher exited, however it died) it kills this worker's whole process group.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading

PIPE_VARIABLE = "COURSE_PARENT_PIPE"
PARENT_VARIABLE = "COURSE_PARENT_PID"
# "0" leaves the parent-death signal out, so that a test can show the pipe alone suffices (as on macOS).
SIGNAL_VARIABLE = "COURSE_PARENT_DEATH_SIGNAL"


def _die() -> None:
    try:
        if os.getpgid(0) == os.getpid():  # the worker leads its own session: this takes its children too
            os.killpg(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    finally:
        os._exit(137)


def _parent_death_signal() -> None:
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl here: the pipe below still covers it
        pass


def _watch_pipe(fd: int) -> None:
    def watch():
        try:
            while os.read(fd, 1024):
                pass
        except OSError:
            pass
        _die()  # end of file: the launcher is gone

    threading.Thread(target=watch, name="course-parent-watch", daemon=True).start()


def guard() -> None:
    """Tie this process's life to its launcher's (see the module docstring)."""
    if os.environ.pop(SIGNAL_VARIABLE, "1") != "0":
        _parent_death_signal()
    expected = os.environ.pop(PARENT_VARIABLE, None)
    if expected is not None and os.getppid() != int(expected):
        _die()  # the launcher died before the signal above was set
    fd = os.environ.pop(PIPE_VARIABLE, None)
    if fd is not None:
        _watch_pipe(int(fd))


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m course_lib._worker MODULE [ARGS...]")
    module = sys.argv.pop(1)
    guard()
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
