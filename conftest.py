"""Settings shared by the unit tests and the notebook kernels that nbval starts.

nbval starts each notebook's kernel with this process's environment, so what is set
here is what the notebooks see: 8 simulated CPU devices unless the caller chose
otherwise (on the CPU even where an accelerator exists), and no debugger warnings on the kernel's stderr.
"""

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
# The stored outputs were made on 8 simulated CPU devices; on a machine with a GPU or TPU, the notebooks
# under test still run there (set JAX_PLATFORMS yourself to run them on the accelerator, without nbval's
# comparison holding).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # ipykernel's debugger warns on stderr otherwise
# On a loaded 2-core machine (two test workers, each running a notebook's 8 simulated devices) one device thread can
# wait at a collective's rendezvous long enough for XLA's CPU runtime to print a "stuck" warning on stderr, which
# nbval then reports as an unexpected output. Only the warning's delay changes; a real hang still ends the test.
_WARN = "--xla_cpu_collective_call_warn_stuck_timeout_seconds"
if _WARN not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" {_WARN}=300").strip()

# Exercise progress (course_lib/progress.py) goes to a file in a temporary folder, never into the repository:
# each notebook's kernel gets a fresh one (pytest_runtest_setup below), named like a learner's, so that a
# stored `progress()` output shows only what that notebook did. The folder is removed when this process ends.
import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

_PROGRESS_DIR = tempfile.mkdtemp(prefix="course-progress-")
atexit.register(shutil.rmtree, _PROGRESS_DIR, ignore_errors=True)


def fresh_progress_file() -> str:
    """Point COURSE_PROGRESS at a new, empty ``course_progress.json`` in this run's temporary folder."""
    folder = tempfile.mkdtemp(dir=_PROGRESS_DIR)
    os.environ["COURSE_PROGRESS"] = os.path.join(folder, "course_progress.json")
    return os.environ["COURSE_PROGRESS"]


if not os.environ.get("COURSE_PROGRESS"):
    fresh_progress_file()


# ---------------------------------------------------------------------------------------------------------------
# Another processor's rounding: the notebooks run with XLA's CPU compiler limited to another instruction set.
#
# XLA compiles for the host's instruction set, so a float's 7th digit can differ from one processor to the next
# (AVX-512 here, AVX2 or SSE4.2 on an instructor's laptop). A stored output that prints such digits passes on
# the machine that stored it and fails elsewhere. So nbval starts each notebook's kernel with
# XLA_FLAGS=--xla_cpu_max_isa=<another set> (SSE4_2; AVX2 where XLA_FLAGS already limits to SSE4_2): the stored
# outputs, made as this processor runs them, are compared with another processor's run, and such an output fails
# here first. Each notebook runs once, as a learner gets it (its exercise cells are the stubs).
# `--nbval-isa=none` runs the kernels as this processor (a quick first look); `--nbval-isa=AVX2` picks the set.
# `--nbval-passes=2` runs every notebook twice, as before: as this processor, then as another in its instructor
# form (tools/copies.py: each exercise holds its reference solution and asserts that its check passes).
# ---------------------------------------------------------------------------------------------------------------
import re  # noqa: E402

ISA_FLAG = "--xla_cpu_max_isa"


def pytest_addoption(parser):
    parser.addoption(
        "--nbval-isa", default="auto", metavar="ISA",
        help="run the notebooks with XLA_FLAGS=--xla_cpu_max_isa=ISA (SSE4_2, AVX, AVX2, AVX512...), as "
             "another processor would; 'auto' (the default) picks SSE4_2, or AVX2 where XLA_FLAGS already limits "
             "to SSE4_2; 'none' runs them as this processor")
    parser.addoption(
        "--nbval-passes", default="1", choices=("1", "2"),
        help="1 (the default): every notebook runs once, its kernel limited to --nbval-isa's instruction set; "
             "2: once as this processor, then again limited to that set, in --nbval-isa-form")
    parser.addoption(
        "--nbval-isa-form", default="instructor", choices=("instructor", "as-is"),
        help="with --nbval-passes=2, what the second pass runs: 'instructor' (the default) fills every exercise with its reference "
             "solution and asserts that its check passes (tools/copies.py), so all 42 are tested without an "
             "extra run; 'as-is' runs the notebooks as stored")


def second_isa(option: str, xla_flags: str) -> str | None:
    """The instruction set of the second pass: ``option`` as given, or for 'auto' one other than XLA_FLAGS's."""
    if option.lower() == "none":
        return None
    if option.lower() != "auto":
        return option.upper()
    current = re.findall(rf"{ISA_FLAG}=(\S*)", xla_flags)
    return "AVX2" if current and current[-1].upper() == "SSE4_2" else "SSE4_2"


def isa_flags(xla_flags: str, isa: str) -> str:
    """``xla_flags`` with any --xla_cpu_max_isa replaced by ``isa``."""
    kept = [f for f in xla_flags.split() if not f.startswith(ISA_FLAG + "=")]
    return " ".join(kept + [f"{ISA_FLAG}={isa}"])


# Slowest first. `./course.sh test` runs `--dist loadfile --no-loadscope-reorder`: xdist hands out whole files (each
# notebook pass is one) in collection order, so the order below decides how the two workers finish: longest first,
# the many short unit-test files filling in at the end (otherwise one long notebook can start last and run alone
# while the other worker idles). Rough seconds per notebook pass and per slow file on 2 cores; only the order
# matters, and an estimate that is off costs time, never a result.
SECONDS_GUESS = {"13": 145, "12": 135, "10": 115, "09": 60, "11": 55, "05": 40, "04": 35, "07": 25,
                 "test_diagnose.py": 125, "test_site.py": 110, "test_exercises_framework.py": 105,
                 "test_bench.py": 100, "test_fool_07_2.py": 60, "test_isa_pass.py": 50, "test_fool_11_4.py": 45,
                 "test_copies.py": 40, "test_devices.py": 35, "test_fool_13_1.py": 35, "test_lesson13.py": 35,
                 "test_fool_10_4.py": 35, "test_fool_10_3.py": 35, "test_fool_12_2.py": 30, "test_backends.py": 30,
                 "test_course_script.py": 30, "test_exercises_lesson11.py": 30, "test_fool_05_1.py": 30,
                 "test_lab_browser.py": 30, "test_distributed.py": 25, "test_exercises_lesson05.py": 25,
                 "test_browser.py": 25, "test_exercises_lesson04.py": 25, "test_colab_runtime.py": 25,
                 "test_fool_04_4.py": 25, "test_fool_07_1.py": 25, "test_sharded_state.py": 20,
                 "test_exercises_basics_feedback.py": 20, "test_checkpoint.py": 20, "test_fool_10_2.py": 20,
                 "test_fool_11_1.py": 15, "test_fool_04_5.py": 15, "test_faults_processes.py": 15,
                 "test_fool_04_2.py": 15, "test_slides.py": 15, "test_training.py": 15, "test_collectives.py": 15}


def _schedule_rank(nodeid: str) -> int:
    """Sort key of a test file or notebook pass: its guessed seconds, longest first (0 when unknown)."""
    name = nodeid.split("::")[0].split("/")[-1]
    lesson = re.match(r"(\d\d)_.*\.ipynb", name)
    return -SECONDS_GUESS.get(lesson.group(1) if lesson else name, 0)


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: _schedule_rank(item.nodeid))  # stable: each file keeps its own order
    _skip_lesson13_without_libtpu(items)


def _skip_lesson13_without_libtpu(items):
    """Lesson 13 compiles for TPUs with libtpu, which has wheels for Linux x86-64 only: elsewhere its stored
    outputs cannot be reproduced, so its nbval cells skip and say why (tests/test_lesson13.py still runs the
    notebook there, without libtpu, to the end)."""
    import importlib.util
    if importlib.util.find_spec("libtpu") is not None:
        return
    import pytest
    from course_lib.setup_check import tpu_compiler_hint
    skip = pytest.mark.skip(reason=f"lesson 13 needs libtpu, which this environment lacks: {tpu_compiler_hint()}")
    for item in items:
        if item.nodeid.split("::")[0].split("@")[0].endswith(".ipynb") and "/13_" in "/" + item.nodeid:
            item.add_marker(skip)


def _nbval_on(option) -> bool:
    return bool(getattr(option, "nbval", False) or getattr(option, "nbval_lax", False))


def _start_kernel_with_isa(start, isa: str) -> None:
    """Run ``start()`` (nbval's setup, which starts the kernel with a copy of os.environ) with XLA limited to
    ``isa``; this process's XLA_FLAGS is as it was afterwards."""
    before = os.environ.get("XLA_FLAGS")
    os.environ["XLA_FLAGS"] = isa_flags(before or "", isa)
    try:
        start()
    finally:
        if before is None:
            del os.environ["XLA_FLAGS"]
        else:
            os.environ["XLA_FLAGS"] = before


def pytest_collect_file(file_path, parent):
    if file_path.suffix != ".ipynb" or not _nbval_on(parent.config.option):
        return None
    isa = second_isa(parent.config.getoption("--nbval-isa"), os.environ.get("XLA_FLAGS", ""))
    if isa is None or parent.config.getoption("--nbval-passes") == "1":
        return None  # one pass: nbval's own, its kernels started with the flag (pytest_configure below)
    from nbval.plugin import IPyNbFile

    instructor_form = parent.config.getoption("--nbval-isa-form") == "instructor"

    class OtherIsaNotebook(IPyNbFile):
        """The same notebook, its kernel started with XLA limited to ``isa``: ``path@SSE4_2::Cell N``.

        In its instructor form (the default), each exercise cell holds the reference solution under the stub's
        name and ends in ``assert check(...)``: a solution that does not pass fails the cell. Those cells' outputs,
        and those of later cells that use an exercise's function or ``progress()``, are not compared (they
        differ from the stored stubs' by design); every other cell is compared as in the first pass.
        """

        def collect(self):
            items = list(super().collect())
            if instructor_form:
                _instructor_form(items, self.nb)
            return items

        def setup(self):
            _start_kernel_with_isa(super().setup, isa)

    base = os.path.relpath(file_path, parent.config.rootpath).replace(os.sep, "/")
    return OtherIsaNotebook.from_parent(parent, path=file_path, nodeid=f"{base}@{isa}")


import pytest  # noqa: E402


def _one_pass_isa(config) -> str | None:
    """The instruction set of the single nbval pass, or None (two passes, or this processor's)."""
    if config.getoption("--nbval-passes", "1") != "1":
        return None
    return second_isa(config.getoption("--nbval-isa", "auto"), os.environ.get("XLA_FLAGS", ""))


def pytest_configure(config):
    """One pass: every notebook kernel nbval starts gets XLA_FLAGS with the other instruction set; this process's
    XLA_FLAGS (the unit tests' JAX) stays as it was."""
    isa = _one_pass_isa(config)
    if isa is None or not _nbval_on(config.option):
        return
    from nbval.plugin import IPyNbFile
    if getattr(IPyNbFile.setup, "_course_isa", None):
        return
    plain_setup = IPyNbFile.setup

    def setup(self):
        _start_kernel_with_isa(lambda: plain_setup(self), isa)

    setup._course_isa = isa
    IPyNbFile.setup = setup


def pytest_report_header(config):
    isa = _one_pass_isa(config)
    if isa is not None:
        return [f"nbval: each notebook runs once, as a processor limited to {isa} would run it "
                f"(XLA_FLAGS=--xla_cpu_max_isa={isa}); --nbval-passes=2 adds this processor's own pass"]
    return []


_progress_for = set()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before a notebook's first cell (when nbval starts its kernel), a fresh progress file for that kernel."""
    parent = item.parent
    if str(getattr(parent, "path", "")).endswith(".ipynb") and id(parent) not in _progress_for:
        _progress_for.add(id(parent))
        fresh_progress_file()


def _instructor_form(items, nb) -> None:
    """Turn nbval's cell items of ``nb`` into the instructor copy's (tools/copies.py), in place."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("course_copies", os.path.join(os.path.dirname(__file__),
                                                                                "tools", "copies.py"))
    copies = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copies)
    exercise_at = {i: (id_, name) for i, id_, name in copies.exercise_cells(nb)}
    names = {name for _, name in exercise_at.values()}
    cell_index = {id(cell): i for i, cell in enumerate(nb.cells)}
    seen_exercise = False
    for item in items:
        i = cell_index.get(id(item.cell))
        if i in exercise_at:
            id_, name = exercise_at[i]
            item.cell.source = copies.solved_source(item.cell.source, id_, name, assert_check=True)
            item.options["check"] = False
            seen_exercise = True
        elif seen_exercise and (re.search(r"\bprogress\(", item.cell.source)
                                or any(re.search(rf"\b{n}\b", item.cell.source) for n in names)):
            item.options["check"] = False
