"""Copies for a class (tools/copies.py): student copies carry no answers, instructor copies put every reference
solution under its stub's name, nbgrader sources grade right and wrong answers, and a class table comes from
learners' progress files.

Executing the instructor form of every lesson is nbval's `--nbval-passes=2` (conftest.py); every reference solution
passes its checker in tests/test_exercises_framework.py.
"""

import ast
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from course_lib import progress, solutions
from course_lib.exercises import exercises

ROOT = pathlib.Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("copies", ROOT / "tools" / "copies.py")
copies = importlib.util.module_from_spec(spec)
spec.loader.exec_module(copies)


def _solution_lines(id_):
    """The solution body's lines worth searching for (stripped, at least 12 characters)."""
    code = solutions.code(id_)
    tree = ast.parse(code)
    fn = tree.body[-1]
    lines = code.splitlines()[fn.body[0].lineno - 1:fn.end_lineno]
    return [ln.strip() for ln in lines if len(ln.strip()) >= 12 and not ln.strip().startswith(("#", "def "))]


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("student")
    copies.student(str(d))
    return d


def test_student_copy_has_every_lesson_stubs_without_outputs_and_withholds_solutions(student_dir, monkeypatch):
    names = sorted(p.name for p in student_dir.glob("[0-9][0-9]_*.ipynb"))
    assert names == [p.name for p in copies.LESSONS] and len(names) == 14
    seen = set()
    for path in student_dir.glob("[0-9][0-9]_*.ipynb"):
        nb = json.loads(path.read_text())
        assert "✔ Correct" not in json.dumps(nb, ensure_ascii=False)
        for i, id_, name in copies.exercise_cells(nb):
            seen.add(id_)
            cell = nb["cells"][i]
            assert cell["outputs"] == [] and cell["execution_count"] is None
            src = "".join(cell["source"])
            assert copies.is_stub(src, name)
            stub = ast.get_source_segment(src, copies._stub(src, name))
            assert not [line for line in _solution_lines(id_) if line in stub], id_
    assert seen == set(exercises())
    assert json.loads((student_dir / "course_settings.json").read_text())["solutions"] == "off"
    monkeypatch.chdir(student_dir)          # a kernel started there: solution() shows no code
    assert solutions.withheld()


def test_every_copy_carries_the_pages_the_lessons_link_to(student_dir, tmp_path):
    pages = sorted(p.name for p in (ROOT / "notebooks").glob("*.md"))
    assert "hardware.md" in pages
    assert sorted(p.name for p in student_dir.glob("*.md")) == pages
    copies.instructor(str(tmp_path / "inst"), ["02"], run=False)
    assert sorted(p.name for p in (tmp_path / "inst").glob("*.md")) == pages
    copies.nbgrader_sources(str(tmp_path / "grading"), ["02"])
    assert sorted(p.name for p in (tmp_path / "grading" / "source" / "lesson02").glob("*.md")) == pages


def test_is_stub_tells_a_stub_from_an_answer():
    assert copies.is_stub("def f(x):\n    # Your code here\n    ...\n", "f")
    assert copies.is_stub("def make(a):\n    def step(b):\n        ...\n    return step\n", "make")
    assert not copies.is_stub("def f(x):\n    return 2 * x\n", "f")


def test_instructor_copy_puts_every_solution_under_its_stub_name(tmp_path):
    assert copies.instructor(str(tmp_path), run=False) == 0
    filled = 0
    for path in tmp_path.glob("[0-9][0-9]_*.ipynb"):
        nb = json.loads(path.read_text())
        for i, id_, name in copies.exercise_cells(nb):
            src = "".join(nb["cells"][i]["source"])
            tree = ast.parse(src)                         # valid Python
            defs = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
            assert name in defs and not copies.is_stub(src, name), id_
            assert all(line in src for line in _solution_lines(id_)), id_
            assert f'check("{id_}", {name})' in src
            filled += 1
    assert filled == 42


def test_assert_form_fails_a_cell_whose_solution_does_not_pass():
    src = 'from course_lib.exercises import check\n\ndef split_batch(x, n):\n    ...\n\ncheck("02.1", split_batch)'
    solved = copies.solved_source(src, "02.1", "split_batch", assert_check=True)
    ns = {}
    exec(solved, ns)                                      # the real solution: the assert holds
    broken = solved.replace("return x.reshape", "return None and x.reshape")
    with pytest.raises(AssertionError, match="02.1"):
        exec(broken, {})


def test_passed_checks_reads_the_verdicts_from_outputs():
    nb = {"cells": [{"cell_type": "code", "source": 'check("02.1", f)', "outputs": [
        {"output_type": "stream", "name": "stdout", "text": "[02.1] ✔ Correct: fine\n"}]},
        {"cell_type": "code", "source": 'check("02.2", g)', "outputs": [
            {"output_type": "stream", "name": "stdout", "text": "[02.2] ✘ Not yet: no\n"}]}]}
    assert copies.passed_checks(nb) == {"02.1": True, "02.2": False}


def test_copies_refuse_to_overwrite_the_course():
    with pytest.raises(SystemExit, match="not over the course"):
        copies.student(str(ROOT / "notebooks"))


# ---------------------------------------------------------------------------------------------
# The class table


def test_class_table_one_row_per_learner_and_csv(tmp_path, capsys):
    a = tmp_path / "ada.json"
    progress.record("02.1", "check", passed=True, path=a)
    progress.record("02.2", "check", passed=False, path=a)
    progress.record("02.2", "hint", path=a)
    progress.record("02.2", "hint", path=a)
    b = tmp_path / "b.json"
    progress.set_learner("Grace", path=b)
    progress.record("05.1", "check", passed=True, path=b)
    bad = tmp_path / "notes.json"
    bad.write_text('{"cells": []}')
    out_csv = tmp_path / "class.csv"
    rc = copies.main(["progress", str(a), str(b), str(bad), "--csv", str(out_csv)])
    out, err = capsys.readouterr()
    assert rc == 1 and "notes.json" in err and "not a course progress file" in err
    # written for the instructor: which file, why, what to do; nothing a learner would do in a notebook
    assert "left out of the table" in err and "Ask that learner" in err and "COURSE_PROGRESS=" not in err
    lines = out.splitlines()
    ada = next(ln for ln in lines if ln.startswith("ada"))
    grace = next(ln for ln in lines if ln.startswith("Grace"))
    assert "1/2/2" in ada.split() and ada.split()[-1] == "1"
    assert "1/1/0" in grace.split() and grace.split()[-1] == "1"
    rows = out_csv.read_text().splitlines()
    assert rows[0].startswith("learner,file,00_passed,00_tried,00_hints")
    ada_row = dict(zip(rows[0].split(","), rows[1].split(",")))
    assert (ada_row["learner"], ada_row["02_passed"], ada_row["02_tried"], ada_row["02_hints"]) == ("ada", "1", "2",
                                                                                                     "2")


def test_class_table_reads_without_lock_files_and_csv_makes_its_folder(tmp_path, capsys):
    a = tmp_path / "in" / "ada.json"
    a.parent.mkdir()
    a.write_text(json.dumps({"format": progress.FORMAT, "version": progress.VERSION,
                             "exercises": {"02.1": {"checks": 1, "passed": True, "hints": 0, "solutions": 0}}}))
    torn = tmp_path / "in" / "bob.json"
    torn.write_text('{"format": "course-progress", "vers')
    out_csv = tmp_path / "out" / "week1" / "class.csv"          # a folder that does not exist yet
    rc = copies.main(["progress", str(a), str(torn), str(tmp_path / "in" / "cy.json"), "--csv", str(out_csv)])
    out, err = capsys.readouterr()
    assert rc == 1 and out_csv.is_file() and "ada" in out_csv.read_text()
    assert "bob.json: left out of the table: it is not JSON" in err
    assert "cy.json: left out of the table: there is no such file" in err
    assert sorted(p.name for p in (tmp_path / "in").iterdir()) == ["ada.json", "bob.json"]   # no .lock files
    with pytest.raises(SystemExit, match="that is a folder"):
        copies.main(["progress", str(a), "--csv", str(tmp_path / "out")])


# ---------------------------------------------------------------------------------------------
# nbgrader: a round trip on lesson 00 (its whole notebook runs once per submission: about a minute here)

NBGRADER = shutil.which("nbgrader", path=os.path.dirname(sys.executable)) or shutil.which("nbgrader")


def test_nbgrader_sources_mark_solutions_and_lock_graded_tests(tmp_path, capsys):
    copies.nbgrader_sources(str(tmp_path), ["02"])
    said = capsys.readouterr().out     # the commands that work: nbgrader needs the environment activated (alembic)
    assert f"source {pathlib.Path(sys.prefix) / 'bin' / 'activate'}" in said
    assert "nbgrader generate_assignment lesson02" in said and "nbgrader autograde lesson02" in said
    nb = json.loads((tmp_path / "source" / "lesson02" / "02_pmap_basics.ipynb").read_text())
    answers = [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("solution")]
    tests = [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade")]
    assert len(answers) == len(tests) == 3
    for c in answers:
        src = "".join(c["source"])
        assert "### BEGIN SOLUTION" in src and "### END SOLUTION" in src and "check(" not in src
    assert ["".join(c["source"]) for c in tests] == ['assert check("02.1", split_batch)',
                                                     'assert check("02.2", sum_of_squares)',
                                                     'assert check("02.3", block_on)']
    assert all(c["metadata"]["nbgrader"]["locked"] and c["metadata"]["nbgrader"]["points"] == 1 for c in tests)
    assert (tmp_path / "nbgrader_config.py").exists()


@pytest.mark.skipif(NBGRADER is None, reason="nbgrader is not installed (pip install -e '.[instructor]' installs "
                                               "nbgrader 0.9.6); the nbgrader round trip needs it")
def test_nbgrader_generate_and_autograde_give_full_and_zero_marks(tmp_path):
    copies.nbgrader_sources(str(tmp_path), ["00"])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_NUM_CPU_DEVICES": "8", "JAX_PLATFORMS": "cpu",
           "COURSE_PROGRESS": str(tmp_path / "progress.json"),
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}  # nbgrader runs alembic
    run = lambda *a: subprocess.run([NBGRADER, *a, "--force"], cwd=tmp_path, env=env, capture_output=True,
                                    text=True, timeout=600)
    done = run("generate_assignment", "lesson00")
    assert done.returncode == 0, done.stderr[-3000:]
    name = "00_setup_and_devices.ipynb"
    release = json.loads((tmp_path / "release" / "lesson00" / name).read_text())
    assert "raise NotImplementedError()" in json.dumps(release) and "BEGIN SOLUTION" not in json.dumps(release)
    assert json.loads((tmp_path / "release" / "lesson00" / "course_settings.json").read_text())["solutions"] == "off"
    source = json.loads((tmp_path / "source" / "lesson00" / name).read_text())
    right = json.loads(json.dumps(release))
    for cell, src_cell in zip(right["cells"], source["cells"]):    # the answers, as a learner who solved them
        if cell["metadata"].get("nbgrader", {}).get("solution"):
            cell["source"] = [ln for ln in src_cell["source"] if "### " not in ln]
    for who, nb in [("alice", right), ("bob", release)]:
        folder = tmp_path / "submitted" / who / "lesson00"
        folder.mkdir(parents=True)
        (folder / name).write_text(json.dumps(nb))
    done = run("autograde", "lesson00")
    assert done.returncode == 0, done.stderr[-3000:]
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}") as gb:
        alice = gb.find_submission("lesson00", "alice")
        bob = gb.find_submission("lesson00", "bob")
        assert (alice.score, alice.max_score) == (2.0, 2.0)
        assert (bob.score, bob.max_score) == (0.0, 2.0)


def test_course_sh_help_lists_the_class_commands():
    r = subprocess.run([str(ROOT / "course.sh"), "help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    for cmd in ("student DIR", "instructor DIR", "nbgrader DIR", "progress FILE"):
        assert f"./course.sh {cmd}" in r.stdout
