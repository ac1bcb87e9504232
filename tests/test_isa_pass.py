"""The second nbval pass (conftest.py): every notebook again, as a processor with another instruction set runs it."""

import os
import pathlib
import subprocess
import sys

import importlib.util
import shutil

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("course_root_conftest", ROOT / "conftest.py")
root = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(root)


@pytest.mark.parametrize("option, flags, isa", [
    ("auto", "", "SSE4_2"),
    ("auto", "--xla_cpu_max_isa=AVX2", "SSE4_2"),
    ("auto", "--xla_cpu_max_isa=SSE4_2", "AVX2"),
    ("auto", "--xla_cpu_max_isa=AVX2 --xla_cpu_max_isa=sse4_2", "AVX2"),
    ("avx", "", "AVX"),
    ("none", "--xla_cpu_max_isa=AVX2", None),
    ("NONE", "", None),
])
def test_the_second_pass_picks_another_instruction_set(option, flags, isa):
    assert root.second_isa(option, flags) == isa


def test_the_second_pass_replaces_the_isa_and_keeps_other_flags():
    assert root.isa_flags("--xla_foo=1 --xla_cpu_max_isa=AVX2 --xla_bar", "SSE4_2") == \
        "--xla_foo=1 --xla_bar --xla_cpu_max_isa=SSE4_2"
    assert root.isa_flags("", "AVX2") == "--xla_cpu_max_isa=AVX2"


@pytest.fixture
def probe_dir():
    """A folder inside the repository (the root conftest.py applies only below it), removed afterwards."""
    path = ROOT / "build" / f"isa_probe_{os.getpid()}"
    path.mkdir(parents=True)
    yield path
    shutil.rmtree(path)


def _notebook(folder, source):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source)]
    path = folder / "isa_probe.ipynb"
    nbformat.write(nb, path)
    return path


def _nbval(path, *args):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--rootdir={ROOT}", "-c",
         str(ROOT / "pyproject.toml"), "--nbval-lax", str(path), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_by_default_each_notebook_runs_once_and_its_kernel_sees_the_flag(probe_dir):
    """One pass, its kernel started with --xla_cpu_max_isa=SSE4_2; this process's XLA_FLAGS stays as it was."""
    before = os.environ.get("XLA_FLAGS")
    path = _notebook(probe_dir, "import os\nassert 'xla_cpu_max_isa=SSE4_2' in os.environ.get('XLA_FLAGS', '')")
    done = _nbval(path, "-rA")
    out = done.stdout + done.stderr
    assert "1 passed" in out and "failed" not in out and "@" not in done.stdout, out[-3000:]
    assert os.environ.get("XLA_FLAGS") == before, "the pass must leave this process's XLA_FLAGS as it was"


def test_two_passes_collect_each_notebook_twice_and_only_the_second_kernel_sees_the_flag(probe_dir):
    """With --nbval-passes=2 the second kernel starts with --xla_cpu_max_isa in XLA_FLAGS; the first without it."""
    before = os.environ.get("XLA_FLAGS")
    path = _notebook(probe_dir, "import os\nassert 'xla_cpu_max_isa' not in os.environ.get('XLA_FLAGS', '')")
    done = _nbval(path, "-rA", "--nbval-passes=2")
    out = done.stdout + done.stderr
    assert "isa_probe.ipynb@SSE4_2::Cell 0" in out, out[-3000:]
    assert "1 failed, 1 passed" in out, out[-3000:]  # the plain pass passes; the SSE4_2 kernel has the flag
    assert os.environ.get("XLA_FLAGS") == before, "the second pass must leave this process's XLA_FLAGS as it was"


def test_none_runs_the_kernels_as_this_processor(probe_dir):
    path = _notebook(probe_dir, "import os\nassert 'xla_cpu_max_isa' not in os.environ.get('XLA_FLAGS', '')")
    for passes in ("1", "2"):
        done = _nbval(path, "--nbval-isa=none", f"--nbval-passes={passes}")
        assert "1 passed" in done.stdout and "failed" not in done.stdout and "@" not in done.stdout, \
            done.stdout[-2000:]


def test_without_libtpu_lesson_13s_cells_skip_and_say_why(tmp_path):
    """On macOS or Windows libtpu cannot be installed: nbval skips lesson 13, naming libtpu, instead of failing."""
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.util\n"
        "_find = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, package=None: (None if name.split('.')[0] == 'libtpu'\n"
        "                                                       else _find(name, package))\n")
    notebook = next((ROOT / "notebooks").glob("13_*.ipynb"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-n", "0",
                           str(notebook)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "passed" not in done.stdout and " skipped" in done.stdout, done.stdout[-2000:]
    assert "lesson 13 needs libtpu" in done.stdout
