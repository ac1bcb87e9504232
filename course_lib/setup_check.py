"""A one-minute check that the course works here, with a report to paste to the instructor.

From a terminal, ``./course.sh check`` (or ``python -m course_lib.setup_check``); from a notebook cell::

    from course_lib.setup_check import run
    run()

It checks, in a fresh Python process (so that a notebook's own JAX, devices and exercise record stay as they are):

1. Python (>= 3.12) and JAX's version (>= 0.11);
2. 8 devices, real or simulated;
3. graphviz's ``dot``, by drawing a diagram of those devices;
4. one exercise: a reference solution through ``course_lib.exercises.check``;
5. the progress file: a temporary one is written and read back (yours is only read);
6. whether lesson 13 can compile for TPUs: libtpu there, and a small step compiled for 4 TPU chips
   (time-boxed; lesson 13 is the only lesson that needs it, so its absence is a note, not a failure).

The exit status is 1 when something lessons 00-12 need is missing; each failure says how to fix it on this
system (no ``dot``: the line that installs graphviz here). ``tpu_compiler_hint()`` is the one sentence that says
how to get lesson 13's TPU compiler on the platform the learner is on; the lessons' skip messages use it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import glob
import importlib.metadata
import importlib.util
import io
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

MIN_PYTHON = (3, 12)
MIN_JAX = (0, 11)
DEVICES = 8
# The whole check stays under a minute: the TPU compile (a separate process, started first) gets this long.
TPU_TIMEOUT_S = 45
EXERCISE = "00.1"
TPU_TOPOLOGY = "v5e:2x2"

OK, FAIL, NOTE = "ok", "FAIL", "note"


@dataclasses.dataclass
class Finding:
    """One line of the report: what was checked, its status (ok, FAIL or note), what was seen, and the fix."""
    what: str
    status: str
    seen: str
    fix: str = ""

    def line(self) -> str:
        return f"  {self.status:<5}{self.what}: {self.seen}"


# ----------------------------------------------------------------------------------------------
# Where the learner is, and what to run there


def hosted_platform() -> str | None:
    """"colab", "kaggle", "binder" (binder/start says so) or None (a machine of one's own)."""
    if "KAGGLE_KERNEL_RUN_TYPE" in os.environ:
        return "kaggle"
    if os.environ.get("COURSE_PLATFORM") == "binder":
        return "binder"
    if "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ:
        return "colab"
    try:
        if importlib.util.find_spec("google.colab") is not None:
            return "colab"
    except (ImportError, ValueError):
        pass
    return None


def _course_venv() -> bool:
    """Whether this Python runs in a virtual environment that ./course.sh built (it leaves a stamp there)."""
    return (pathlib.Path(sys.prefix) / ".course-stamp").is_file()


def libtpu_platform() -> bool:
    """Whether libtpu has wheels for this machine (Linux x86-64 only)."""
    return sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")


def libtpu_requirement() -> str:
    """The libtpu that the installed JAX pins (its ``tpu`` extra), e.g. ``libtpu==0.0.50.*``."""
    try:
        for req in importlib.metadata.requires("jax") or []:
            if req.startswith("libtpu") and "extra" in req and "tpu" in req.split(";", 1)[1]:
                return req.split(";", 1)[0].replace(" ", "")
        version = importlib.metadata.version("jax")
    except importlib.metadata.PackageNotFoundError:
        return "libtpu"
    return f"jax[tpu]=={version}"


def tpu_compiler_hint() -> str:
    """How to get lesson 13's TPU compiler (libtpu) on the platform this runs on, in one sentence.

    E.g. "./course.sh tpu installs it" in the course's own environment, the ``%pip`` line on Colab and Kaggle,
    and on macOS, Windows or ARM Linux that it has no wheels there and where to go instead.
    """
    if not libtpu_platform():
        return (f"libtpu has wheels for Linux x86-64 only, and this is {platform.system()} {platform.machine()}: "
                "here the TPU cells skip; open lesson 13 on Colab or Kaggle, whose first cell installs libtpu")
    req = libtpu_requirement()
    host = hosted_platform()
    if host == "binder":
        return (f"Binder's image leaves it out (about 200 MB to download): run %pip install \"{req}\" in a cell, "
                "then restart the kernel")
    if host is not None:
        name = {"colab": "Colab", "kaggle": "Kaggle"}[host]
        return (f"on {name}, lesson 13's first cell installs it; or run %pip install \"{req}\" (the version this "
                "JAX pins), then restart the kernel")
    if _course_venv():
        return "run ./course.sh tpu in the course's folder (it installs the pinned libtpu), then restart the kernel"
    return (f"run {pathlib.Path(sys.executable).name} -m pip install \"{req}\" (the version this JAX pins), then "
            "restart the kernel")


def _jax_platforms_default() -> None:
    """As ./course.sh lab does: with no TPU or NVIDIA GPU here, JAX gets the CPU only (libtpu, if installed, would
    otherwise look for a TPU and print its start-up errors)."""
    if os.environ.get("JAX_PLATFORMS"):
        return
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*") or shutil.which("nvidia-smi"):
        return
    os.environ["JAX_PLATFORMS"] = "cpu"


# ----------------------------------------------------------------------------------------------
# The checks


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:2])


def check_python() -> Finding:
    v = sys.version.split()[0]
    where = f"{platform.system()} {platform.machine()}"
    if sys.version_info >= MIN_PYTHON:
        return Finding("Python", OK, f"{v} on {where}")
    return Finding("Python", FAIL, f"{v} on {where}; the course needs >= {'.'.join(map(str, MIN_PYTHON))}",
                   "run ./course.sh setup: it finds a Python >= 3.12, or prints how to install one on this system")


def check_jax() -> Finding:
    try:
        import jax
        import jaxlib
    except ImportError as e:
        return Finding("JAX", FAIL, f"cannot import it ({e})", _setup_fix("jax"))
    seen = f"{jax.__version__} (jaxlib {jaxlib.__version__})"
    if _version_tuple(jax.__version__) < MIN_JAX:
        return Finding("JAX", FAIL, f"{seen}; the course needs >= {'.'.join(map(str, MIN_JAX))}",
                       _setup_fix("-U jax jaxlib"))
    return Finding("JAX", OK, seen)


def _setup_fix(what: str) -> str:
    if hosted_platform() is not None:  # Colab, Kaggle, Binder
        return f"run %pip install {what}, then restart the kernel"
    if _course_venv():
        return "run ./course.sh setup (it reinstalls the course's pinned versions)"
    return f"run {pathlib.Path(sys.executable).name} -m pip install {what}, or use ./course.sh setup"


def check_devices():
    """Finding, and the devices (None if there are not 8)."""
    try:
        from course_lib.devices import lesson_devices
        with contextlib.redirect_stdout(io.StringIO()) as said:
            devices = lesson_devices(DEVICES)
    except Exception as e:  # DeviceSetupError, or JAX failing to start a backend
        return Finding(f"{DEVICES} devices", FAIL, f"{type(e).__name__}: {str(e).strip()[:300]}",
                       f"set JAX_NUM_CPU_DEVICES={DEVICES} before starting Python (./course.sh lab does), "
                       "and restart the kernel"), None
    kinds: dict[str, int] = {}
    for d in devices:
        kind = d.platform.upper() + ("" if d.device_kind.lower() == d.platform else f" ({d.device_kind})")
        kinds[kind] = kinds.get(kind, 0) + 1
    text = ", ".join(f"{n} x {k}" for k, n in kinds.items())
    simulated = all(d.platform == "cpu" for d in devices)
    first = said.getvalue().strip().splitlines()
    return Finding(f"{DEVICES} devices", OK, text + (" (simulated)" if simulated else "")
                   + (f"; {first[0]}" if first and not simulated else "")), devices


def check_dot(devices) -> Finding:
    from course_lib import diagrams
    fix = f"install graphviz: {diagrams.graphviz_install_hint()}; then run this check again"
    dot = shutil.which("dot")
    if dot is None:
        return Finding("graphviz", FAIL, "its `dot` program is not on PATH, so no diagram can be drawn", fix)
    try:  # the devices' diagram; without devices (JAX failed above), a diagram of two nodes
        source = diagrams.device_topology(devices).source if devices else "digraph { a -> b }"
        svg = diagrams.render(source, "svg")
    except Exception as e:
        return Finding("graphviz", FAIL, f"`dot` ({dot}) could not draw a diagram: {str(e)[:200]}", fix)
    if b"<svg" not in svg:
        return Finding("graphviz", FAIL, f"`dot` ({dot}) did not write an SVG picture", fix)
    said = subprocess.run([dot, "-V"], capture_output=True, text=True, timeout=20).stderr
    version = re.search(r"version (\S+)", said)
    name = f"dot {version.group(1)}" if version else "dot"
    drew = "the devices' diagram" if devices else "a diagram"
    return Finding("graphviz", OK, f"{name} drew {drew} ({len(svg) // 1024} kB of SVG)")


def check_exercise(progress_file: pathlib.Path) -> Finding:
    """A reference solution through ``check``, quietly, recording (if it records) into ``progress_file``."""
    saved = os.environ.get("COURSE_PROGRESS")
    os.environ["COURSE_PROGRESS"] = str(progress_file)
    try:
        from course_lib.exercises import check, exercises
        reference = exercises()[EXERCISE].solution
        with contextlib.redirect_stdout(io.StringIO()) as said:
            feedback = check(EXERCISE, reference)
    except Exception as e:
        return Finding("exercise check", FAIL, f"{EXERCISE} could not be checked: {type(e).__name__}: {e}"[:300],
                       "paste this report to the instructor")
    finally:
        if saved is None:
            os.environ.pop("COURSE_PROGRESS", None)
        else:
            os.environ["COURSE_PROGRESS"] = saved
    if not feedback:
        return Finding("exercise check", FAIL, f"the reference solution of {EXERCISE} did not pass: "
                       + said.getvalue().strip()[:300], "paste this report to the instructor")
    return Finding("exercise check", OK, f"{EXERCISE}'s reference solution passed its checker")


def check_progress(progress_file: pathlib.Path, yours: pathlib.Path | None) -> Finding:
    """Write and read a temporary progress file; only read the learner's own (``yours``)."""
    try:
        from course_lib import progress
    except ImportError:
        return Finding("progress file", NOTE, "not available in this course_lib yet (no course_lib.progress)")
    try:
        data = progress.load(progress_file)
        if EXERCISE not in data.get("exercises", {}):  # check() did not record it: record one event ourselves
            progress.record(EXERCISE, "check", True, path=progress_file)
            data = progress.load(progress_file)
        if EXERCISE not in data.get("exercises", {}):
            return Finding("progress file", FAIL, f"a check of {EXERCISE} was not recorded in {progress_file.name}",
                           "paste this report to the instructor")
    except Exception as e:
        return Finding("progress file", FAIL, f"writing and reading one failed: {type(e).__name__}: {e}"[:300],
                       "paste this report to the instructor")
    if yours is None:
        return Finding("progress file", OK, "records and reads back")
    try:
        mine = progress.load(yours)
    except ValueError as e:
        return Finding("progress file", FAIL, f"yours cannot be read: {e}"[:400], str(e).split(". ", 1)[-1])
    n = len(mine.get("exercises", {}))
    return Finding("progress file", OK, f"records and reads back; yours, {yours}, "
                   + (f"holds {n} exercise(s)" if yours.exists() else "starts at your first check"))


TPU_PROGRAM = f"""
import time
t = time.perf_counter()
import jax, jax.numpy as jnp
from jax.experimental import topologies
from jax.sharding import NamedSharding, PartitionSpec as P
topology = topologies.get_topology_desc({TPU_TOPOLOGY!r}, platform="tpu")
chips = topology.devices
mesh = jax.make_mesh((len(chips),), ("data",), devices=chips)
x = jax.ShapeDtypeStruct((8 * len(chips), 128), jnp.float32, sharding=NamedSharding(mesh, P("data")))
compiled = jax.jit(lambda x: jnp.sum(x * x)).lower(x).compile()
hlo = compiled.as_text()
print("RESULT", len(chips), chips[0].device_kind, "all-reduce" in hlo, round(time.perf_counter() - t, 1))
"""


class TpuCompile:
    """Lesson 13's TPU compiler: a small step compiled for 4 TPU chips, in a process of its own started at once
    (libtpu writes start-up messages to stderr and holds a lock; a separate process keeps both out of here)."""

    def __init__(self, timeout: float = TPU_TIMEOUT_S):
        self.timeout = timeout
        self.proc = None
        self.why_not = None
        if not libtpu_platform():
            self.why_not = "no TPU compiler"
        elif importlib.util.find_spec("libtpu") is None:
            self.why_not = "libtpu is not installed"
        else:
            env = {**os.environ, "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
                   "TPU_SKIP_MDS_QUERY": "1"}
            self.started = time.monotonic()
            self.proc = subprocess.Popen([sys.executable, "-c", TPU_PROGRAM], stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)

    def finding(self) -> Finding:
        what = "lesson 13 (TPU compiler)"
        if self.proc is None:
            return Finding(what, NOTE, f"{self.why_not}; {tpu_compiler_hint()}")
        left = max(1.0, self.timeout - (time.monotonic() - self.started))
        try:
            out, err = self.proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return Finding(what, NOTE, f"libtpu {_version('libtpu')} is installed, but a small compile did not "
                           f"finish within {self.timeout:g} s (a busy machine?); lesson 13's compiles take longer "
                           "still: run it when the machine is quieter")
        m = re.search(r"RESULT (\d+) (.+) (True|False) ([\d.]+)", out)
        if self.proc.returncode != 0 or not m:
            said = (err.strip().splitlines() or ["no output"])[-1][:300]
            fix = (f"reinstall it: {tpu_compiler_hint()}" if _course_venv() or hosted_platform()
                   else f"reinstall it: {pathlib.Path(sys.executable).name} -m pip install --force-reinstall "
                        f"\"{libtpu_requirement()}\"")
            return Finding(what, FAIL, f"libtpu {_version('libtpu')} is installed but JAX could not compile for "
                           f"TPUs with it: {said}", fix)
        return Finding(what, OK, f"libtpu {_version('libtpu')} compiled a sharded step for {m.group(1)} "
                       f"'{m.group(2)}' chips ({TPU_TOPOLOGY}) in {float(m.group(4)):.0f} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "?"


# ----------------------------------------------------------------------------------------------
# The report


def checks(only: str | None = None, skip: str | None = None) -> list[Finding]:
    """Run the checks in this process (JAX must not have started yet: use ``run()`` from a notebook).
    ``only="tpu"``: lesson 13's compiler alone; ``skip="tpu"``: every check but that one."""
    os.environ.setdefault("JAX_NUM_CPU_DEVICES", str(DEVICES))
    _jax_platforms_default()
    tpu = TpuCompile() if skip != "tpu" else None
    try:
        if only == "tpu":
            return [tpu.finding()]
        found = [check_python(), check_jax()]
        devices = None
        if found[-1].status == OK:
            device_finding, devices = check_devices()
            found.append(device_finding)
        found.append(check_dot(devices))
        yours = None
        with contextlib.suppress(ImportError):
            from course_lib import progress
            yours = progress.path()
        with tempfile.TemporaryDirectory(prefix="course-check-") as tmp:
            progress_file = pathlib.Path(tmp) / "course_progress.json"
            if found[1].status == OK:
                found.append(check_exercise(progress_file))
            found.append(check_progress(progress_file, yours))
        if tpu is not None:
            found.append(tpu.finding())
        return found
    finally:
        if tpu is not None:
            tpu.stop()


def report(found: list[Finding], seconds: float) -> str:
    from course_lib import __version__
    host = hosted_platform()
    how = ({"colab": "Colab", "kaggle": "Kaggle", "binder": "Binder"}[host] if host
           else "./course.sh's environment" if _course_venv() else sys.prefix)
    lines = ["Course set-up check (paste this to your instructor)"]
    lines += [f.line() for f in found]
    failed = [f for f in found if f.status == FAIL]
    tpu_ok = any(f.status == OK and f.what.startswith("lesson 13") for f in found)
    if failed:
        verdict = f"{len(failed)} problem(s): the fixes are below"
    elif len(found) == 1:  # --only tpu
        verdict = "lesson 13 can compile for TPUs" if tpu_ok else "lesson 13 cannot compile for TPUs here"
    else:
        # Worded by what passed: lesson 13 is named only where its TPU compile was checked and passed.
        tpu_checked = any(f.what.startswith("lesson 13") for f in found)
        verdict = ("everything lessons 00-13 need works, lesson 13's TPU compile included" if tpu_ok
                   else "everything lessons 00-12 need works; lesson 13's TPU compiler: see its note" if tpu_checked
                   else "everything lessons 00-12 need works (lesson 13's TPU compiler was not checked)")
    lines.append(f"course_lib {__version__} in {how}; checked in {seconds:.0f} s: {verdict}.")
    if failed:
        lines.append("To fix:")
        lines += [f"  {f.what}: {f.fix}" for f in failed]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="./course.sh check", description=__doc__.split("\n\n")[0])
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--only", choices=["tpu"], help="check lesson 13's TPU compiler only")
    what.add_argument("--skip", choices=["tpu"], help="leave lesson 13's TPU compiler out (a faster check)")
    args = ap.parse_args(argv)
    started = time.monotonic()
    found = checks(args.only, args.skip)
    print(report(found, time.monotonic() - started), flush=True)
    return 1 if any(f.status == FAIL for f in found) else 0


def run(timeout: float = 120) -> bool:
    """Run the check from a notebook cell, in a fresh Python process, and print its report; True if it passed.

    The notebook's own JAX (its device count), exercise record and progress file are left as they are.
    """
    env = dict(os.environ)
    if hosted_platform() == "colab":
        env.setdefault("COLAB_RELEASE_TAG", "colab")  # the child process has no google.colab imported
    try:
        done = subprocess.run([sys.executable, "-m", "course_lib.setup_check"], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        print(f"The set-up check did not finish within {timeout:g} s: the machine is very busy, or something "
              "hangs. Run ./course.sh check in a terminal to see where it stops.")
        return False
    print(done.stdout.rstrip())
    if done.returncode not in (0, 1) or not done.stdout.strip():
        print(f"The check itself failed (exit status {done.returncode}):\n" + done.stderr.strip()[-1500:])
    return done.returncode == 0


if __name__ == "__main__":
    sys.exit(main())
