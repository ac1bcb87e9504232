"""Unit tests run on 8 simulated CPU devices, configured before JAX starts.

The root conftest.py has already set JAX_NUM_CPU_DEVICES. Here the platform is pinned
to the CPU too, so that a machine with one GPU still tests 8-device semantics.
"""

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap

import jax
import pytest

jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_num_cpu_devices", 8)

# The checkers compile the same programs many times (each run wraps the function in a new pmap or jit), and XLA's
# compile is most of a check's time: this test process keeps what it compiled in its own compilation cache and
# removes it when it ends. The notebooks' kernels and the subprocesses the tests start do not use it.
_XLA_CACHE = tempfile.mkdtemp(prefix="course-tests-xla-cache-")
atexit.register(shutil.rmtree, _XLA_CACHE, ignore_errors=True)
jax.config.update("jax_compilation_cache_dir", _XLA_CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_configure(config):
    # A program compiled for a TPU (lesson 13, libtpu's compile-only client) is stored in that cache but cannot be
    # loaded back on this machine: JAX warns and compiles it again, which is right.
    config.addinivalue_line("filterwarnings", "ignore:Error reading persistent compilation cache entry for "
                            ".*PjRtCompiler must be constructed with a Client:UserWarning")


N_DEVICES = 8


@pytest.fixture(autouse=True)
def _progress_file(tmp_path, monkeypatch):
    """Every test records exercise progress (course_lib/progress.py) in its own empty file, not the learner's."""
    monkeypatch.setenv("COURSE_PROGRESS", str(tmp_path / "course_progress.json"))
    monkeypatch.delenv("COURSE_SOLUTIONS", raising=False)


def pytest_report_header(config):
    return (f"unit tests: {N_DEVICES} simulated CPU devices (jax_platforms=cpu), whatever accelerator this machine "
            "has; notebooks: JAX_PLATFORMS=" + os.environ.get("JAX_PLATFORMS", "(unset)"))


@pytest.fixture(scope="session")
def devices():
    devs = jax.devices()
    assert len(devs) == N_DEVICES, f"tests expect {N_DEVICES} simulated devices, got {len(devs)}"
    return devs


def run_python(code: str, env: dict | None = None, timeout: float = 120,
               accelerators: bool = False) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (JAX not yet started), with a timeout.

    JAX sees only the CPU there (``JAX_PLATFORMS=cpu``), as on a machine without an accelerator, so a
    GPU or TPU on the test machine does not change what the test checks. ``accelerators=True`` lets
    JAX look for every platform (tests that put a stand-in accelerator in place need it).
    """
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    if not accelerators:
        full_env["JAX_PLATFORMS"] = "cpu"
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, timeout=timeout)


def gone(pid) -> bool:
    """Whether process ``pid`` has ended (a zombie not yet reaped counts as ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie not yet reaped counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
    return False


# The errors that mean a public function let a wrong argument through to Python, NumPy or JAX.
RAW = (IndexError, KeyError, ZeroDivisionError, AttributeError)


def unclear_errors(sweep, junk) -> list[str]:
    """Each argument of each ``(name, fn, kwargs)`` in ``sweep`` swapped for ``junk``: the calls whose error is not
    course_lib's own (a raw one, or a message that does not start with the function's name)."""
    unclear = []
    for name, fn, kwargs in sweep:
        for arg in kwargs:
            try:
                fn(**{**kwargs, arg: junk})
            except Exception as e:
                if isinstance(e, RAW) or not str(e).startswith(name):
                    unclear.append(f"{name}({arg}={junk!r}): {type(e).__name__}: {str(e)[:300]}")
    return unclear


def stop_process_group(proc, timeout: float = 20) -> None:
    """End ``proc``'s process group: SIGTERM, then SIGKILL if it has not ended within ``timeout`` seconds."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


# XLA's CPU compiler limited to an old instruction set (XLA_FLAGS=--xla_cpu_max_isa=SSE4_2, how the suite simulates
# another machine for the notebooks' stored outputs) cannot compile float16 conversions in this jaxlib: the program
# needs a runtime routine it does not link ("Failed to materialize symbols"). Tests that feed a float16 answer then
# fail for that reason alone. Where a probe shows the limit, such a failure is reported as a skip that says so;
# every other failure stays a failure.
def _float16_compiles() -> bool:
    if "xla_cpu_max_isa" not in os.environ.get("XLA_FLAGS", ""):
        return True
    try:
        import jax.numpy as jnp
        (jnp.arange(3.0).astype(jnp.float16) * 2).block_until_ready()
        return True
    except Exception:  # noqa: BLE001: any failure means float16 does not compile here
        return False


_FLOAT16_COMPILES = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    global _FLOAT16_COMPILES
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or "Failed to materialize symbols" not in str(report.longrepr):
        return
    if _FLOAT16_COMPILES is None:
        _FLOAT16_COMPILES = _float16_compiles()
    if not _FLOAT16_COMPILES:
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0,
                           "Skipped: XLA's CPU compiler limited by XLA_FLAGS=--xla_cpu_max_isa cannot compile "
                           "float16 conversions in this jaxlib")
