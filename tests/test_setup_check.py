"""The one-minute set-up check (course_lib/setup_check.py): `./course.sh check` and `run()` from a notebook pass here,
leave the learner's progress file as it was, and fail with the install line when graphviz's `dot` is not on PATH;
the TPU compiler's hint names the command for the platform the learner is on."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from course_lib import setup_check

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "course.sh"
# What course.sh check needs from the system besides Python (no `dot` among them).
TOOLS = ["bash", "cat", "dirname", "sed", "printf", "uname", "id", "ls", "sort", "grep", "mktemp", "rm"]


def fake_venv(tmp_path) -> pathlib.Path:
    """A folder that course.sh takes for a set-up virtual environment: its python runs this test's Python, and its
    stamp says it was built from this checkout with the learner's extras, so course.sh installs nothing."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/bash\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    source = (ROOT / "pyproject.toml").read_bytes() + (ROOT / "constraints.txt").read_bytes()
    stamp = subprocess.run([str(python), "-c", "import sys, hashlib; print(hashlib.sha256(sys.stdin.buffer.read())"
                            ".hexdigest(), sys.version)"], input=source, capture_output=True, check=True).stdout
    (venv / ".course-stamp").write_bytes(stamp + b"lab\n")
    return venv


def course_sh_check(tmp_path, path: str, extra_env=None, args=()):
    env = {**os.environ, "COURSE_VENV": str(fake_venv(tmp_path)), "PATH": path,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **(extra_env or {})}
    return subprocess.run(["bash", str(SCRIPT), "check", *args], capture_output=True, text=True, env=env,
                          timeout=180)


LEARNERS_FILE = '{"format": "course-progress", "version": 1, "exercises": {}}\n'


@pytest.mark.timeout(200)
def test_course_sh_check_passes_and_leaves_the_learners_progress_file_alone(tmp_path):
    mine = tmp_path / "mine.json"
    mine.write_text(LEARNERS_FILE)
    r = course_sh_check(tmp_path, os.environ["PATH"], {"COURSE_PROGRESS": str(mine)})
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "Course set-up check (paste this to your instructor)"
    for what in ["Python: 3.", "JAX: 0.", "8 devices: 8 x", "graphviz: dot", "exercise check: 00.1"]:
        assert any(ln.startswith(f"  ok   {what}") for ln in lines), (what, r.stdout)
    assert any("progress file" in ln for ln in lines) and any("lesson 13 (TPU compiler)" in ln for ln in lines)
    assert "FAIL" not in r.stdout
    tpu_line = next(ln for ln in lines if "lesson 13 (TPU compiler)" in ln)
    if tpu_line.startswith("  ok"):     # the verdict says what passed: 00-13 only where lesson 13's compile did
        assert "everything lessons 00-13 need works" in lines[-1] and "00-12" not in lines[-1]
    else:
        assert "everything lessons 00-12 need works; lesson 13's TPU compiler: see its note" in lines[-1]
    assert mine.read_text() == LEARNERS_FILE, "the learner's own progress file is only read"
    assert not list(tmp_path.glob("course_progress.json")) and not (ROOT / "course_progress.json").exists()


@pytest.mark.timeout(200)
def test_without_dot_on_path_it_fails_with_the_line_that_installs_graphviz(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        if shutil.which(tool):
            (bin_dir / tool).symlink_to(shutil.which(tool))
    (bin_dir / "apt-get").write_text("#!/bin/sh\nexit 99\n")  # a Debian-like system, without graphviz
    (bin_dir / "apt-get").chmod(0o755)
    assert shutil.which("dot", path=str(bin_dir)) is None
    r = course_sh_check(tmp_path, str(bin_dir), args=["--skip", "tpu"])  # lesson 13's compile is tested above
    assert r.returncode == 1, r.stdout + r.stderr
    assert "lesson 13" not in r.stdout
    assert "  FAIL graphviz: its `dot` program is not on PATH" in r.stdout
    fix = r.stdout.split("To fix:", 1)[1]
    assert "graphviz: install graphviz: sudo apt-get install -y graphviz" in fix
    assert "1 problem(s)" in r.stdout and "  ok   8 devices" in r.stdout, "the other checks still ran"


@pytest.mark.timeout(200)
def test_run_from_a_notebook_cell_checks_in_a_fresh_process(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_PROGRESS", str(tmp_path / "mine.json"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    assert setup_check.run() is True
    out = capsys.readouterr().out
    assert out.startswith("Course set-up check") and "  ok   exercise check" in out
    assert not (tmp_path / "mine.json").exists(), "a check leaves no progress file of the learner's"


def test_the_tpu_hint_names_the_command_for_each_platform(monkeypatch):
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    monkeypatch.setattr(setup_check, "libtpu_platform", lambda: False)
    monkeypatch.setattr(setup_check.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(setup_check.platform, "machine", lambda: "arm64")
    mac = setup_check.tpu_compiler_hint()
    assert "Linux x86-64 only" in mac and "Darwin arm64" in mac and "Colab or Kaggle" in mac
    assert "./course.sh" not in mac and "pip install" not in mac
    monkeypatch.setattr(setup_check, "libtpu_platform", lambda: True)
    monkeypatch.setattr(setup_check, "libtpu_requirement", lambda: "libtpu==0.0.50.*")
    monkeypatch.setattr(setup_check, "hosted_platform", lambda: "colab")
    colab = setup_check.tpu_compiler_hint()
    assert "on Colab, lesson 13's first cell installs it" in colab and '%pip install "libtpu==0.0.50.*"' in colab
    assert "./course.sh" not in colab
    monkeypatch.setattr(setup_check, "hosted_platform", lambda: "binder")
    binder = setup_check.tpu_compiler_hint()
    assert binder.startswith("Binder's image leaves it out") and '%pip install "libtpu==0.0.50.*"' in binder
    monkeypatch.setattr(setup_check, "hosted_platform", lambda: None)
    monkeypatch.setattr(setup_check, "_course_venv", lambda: True)
    assert setup_check.tpu_compiler_hint().startswith("run ./course.sh tpu")
    monkeypatch.setattr(setup_check, "_course_venv", lambda: False)
    other = setup_check.tpu_compiler_hint()
    assert '-m pip install "libtpu==0.0.50.*"' in other and "./course.sh" not in other


def test_binder_start_makes_the_check_name_binder(monkeypatch):
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    monkeypatch.setenv("COURSE_PLATFORM", "binder")
    assert setup_check.hosted_platform() == "binder"
    assert "export COURSE_PLATFORM=binder" in (ROOT / "binder" / "start").read_text()


def test_the_libtpu_requirement_is_the_one_this_jax_pins():
    req = setup_check.libtpu_requirement()
    import importlib.metadata
    pinned = [r for r in importlib.metadata.requires("jax") or [] if r.startswith("libtpu")]
    if pinned:
        assert req == pinned[0].split(";")[0].replace(" ", "")
    else:
        assert req.startswith("jax[tpu]==")


def test_the_verdict_names_the_lessons_whose_checks_passed():
    from course_lib import setup_check as sc
    base = [sc.Finding("Python", sc.OK, "3.12"), sc.Finding("JAX", sc.OK, "0.12")]
    tpu_ok = sc.Finding("lesson 13 (TPU compiler)", sc.OK, "compiled")
    tpu_note = sc.Finding("lesson 13 (TPU compiler)", sc.NOTE, "no libtpu")
    last = lambda found: sc.report(found, 1.0).splitlines()[-1]
    assert "everything lessons 00-13 need works" in last(base + [tpu_ok])
    assert "00-12" in last(base + [tpu_note]) and "see its note" in last(base + [tpu_note])
    assert "00-12" in last(base) and "not checked" in last(base)
    assert "00-13" not in last(base + [tpu_note]) and "00-13" not in last(base)
