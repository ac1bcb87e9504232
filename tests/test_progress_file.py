"""The progress file (course_lib/progress.py): shared by kernels, lasting, atomic, never silently overwritten;
and solutions: withheld on request, printed as code a learner pastes as it is."""

import ast
import json
import os
import subprocess
import sys
import textwrap

import pytest

from course_lib import progress, solutions
from course_lib import exercises as ex

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_path_defaults_to_the_working_directory_and_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("COURSE_PROGRESS")
    monkeypatch.chdir(tmp_path)
    assert progress.path() == tmp_path / "course_progress.json"
    monkeypatch.setenv("COURSE_PROGRESS", str(tmp_path / "ada.json"))
    assert progress.path() == tmp_path / "ada.json"


def test_check_hint_solution_are_recorded_and_progress_reads_the_file(tmp_path, capsys):
    file = progress.path()
    assert not file.exists()
    ex.check("02.1", lambda x, n: x)                     # wrong
    ex.check("02.1", ex.exercises()["02.1"].solution)     # right
    ex.check("02.2", None)                               # a placeholder: not an attempt
    ex.hint("02.3")
    ex.solution("02.3")
    data = json.loads(file.read_text())
    assert data["format"] == "course-progress" and data["version"] == 1
    e = data["exercises"]
    assert (e["02.1"]["checks"], e["02.1"]["passed"]) == (2, True)
    assert "02.2" not in e
    assert (e["02.3"]["hints"], e["02.3"]["solutions"], e["02.3"]["checks"]) == (1, 1, 0)
    text = str(ex.progress("02"))
    assert "✔ 02.1" in text and "passed (2 attempts)" in text and "· 02.3" in text
    assert text.endswith("1 of 3 exercises passed, as recorded in course_progress.json.")


def test_progress_lasts_across_processes_like_a_restarted_kernel(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    code = "from course_lib.exercises import check, exercises; check('00.2', exercises()['00.2'].solution)"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, timeout=120)
    code2 = "from course_lib.exercises import progress; print(progress('00'))"
    out = subprocess.run([sys.executable, "-c", code2], env=env, check=True, capture_output=True, text=True,
                         timeout=120).stdout
    assert "✔ 00.2" in out and "1 of 2 exercises passed" in out


HAMMER = textwrap.dedent("""
    import sys
    from course_lib import progress
    who, n = sys.argv[1], int(sys.argv[2])
    for i in range(n):
        progress.record(f"{who}.{i % 5}", "check", passed=(i % 2 == 0))
        progress.record("shared.1", "hint")
""")


def test_two_processes_writing_at_once_lose_nothing(tmp_path):
    file = tmp_path / "course_progress.json"
    env = {**os.environ, "PYTHONPATH": ROOT, "COURSE_PROGRESS": str(file)}
    n = 150
    procs = [subprocess.Popen([sys.executable, "-c", HAMMER, who, str(n)], env=env) for who in ("a", "b")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    e = progress.load(file)["exercises"]
    assert sum(e[f"a.{k}"]["checks"] for k in range(5)) == n
    assert sum(e[f"b.{k}"]["checks"] for k in range(5)) == n
    assert e["shared.1"]["hints"] == 2 * n
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]  # no temporary file left behind


@pytest.mark.parametrize("content, fragment", [
    ("{not json", "is not valid JSON"),
    ('{"cells": []}', "is not a course progress file"),
    ("[1, 2]", "is not a course progress file"),
    ('{"format": "course-progress", "version": 7, "exercises": {}}', "of version 7"),
    ('{"format": "course-progress", "version": 1, "exercises": []}', "should map exercise ids"),
])
def test_a_corrupt_or_foreign_file_is_a_clear_error_and_is_left_alone(tmp_path, capsys, content, fragment):
    file = progress.path()
    file.write_text(content)
    with pytest.raises(ValueError, match=fragment) as info:
        progress.load()
    assert str(file) in str(info.value) and ("COURSE_PROGRESS" in str(info.value) or "Update" in str(info.value))
    with pytest.raises(ValueError, match=fragment):
        progress.record("02.1", "check", passed=True)
    with pytest.raises(ValueError, match=fragment):
        ex.progress()
    fb = ex.check("02.1", ex.exercises()["02.1"].solution)   # the exercise still works, and says why not recorded
    assert fb and "progress not recorded" in capsys.readouterr().out
    assert file.read_text() == content


def test_record_refuses_an_unknown_event_and_a_missing_folder(tmp_path):
    with pytest.raises(ValueError, match="event should be one of check, hint, solution"):
        progress.record("02.1", "peek")
    with pytest.raises(ValueError, match="does not exist"):
        progress.record("02.1", "check", path=tmp_path / "nowhere" / "p.json")


def test_the_learner_field_is_kept_and_shown(tmp_path):
    progress.set_learner("ada")
    progress.record("02.1", "check", passed=True)
    assert progress.load()["learner"] == "ada"
    assert "passed by ada" in str(ex.progress("02"))


# ---------------------------------------------------------------------------------------------
# Solutions


def test_solutions_withheld_print_no_code_and_hints_still_work(monkeypatch, capsys):
    monkeypatch.setenv("COURSE_SOLUTIONS", "off")
    ex.solution("02.1")
    out = capsys.readouterr().out
    assert "withheld" in out and "def " not in out and "reshape" not in out
    monkeypatch.setattr(ex, "_hints_shown", ex.collections.Counter())
    ex.hint("02.1")
    assert "Hint 1 of" in capsys.readouterr().out
    assert "solutions" not in progress.load()["exercises"].get("02.1", {"solutions": 0}) or \
        progress.load()["exercises"]["02.1"]["solutions"] == 0


def test_a_course_settings_file_withholds_them_and_the_environment_wins(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "course_settings.json").write_text('{"solutions": "off"}')
    assert solutions.withheld()
    monkeypatch.setenv("COURSE_SOLUTIONS", "on")
    assert not solutions.withheld()
    monkeypatch.delenv("COURSE_SOLUTIONS")
    (tmp_path / "course_settings.json").write_text('{"solutions": "on"}')
    assert not solutions.withheld()


@pytest.mark.parametrize("id_", list(solutions.STUB_NAMES))
def test_solution_code_defines_the_stub_name_and_needs_nothing_else(id_):
    code = solutions.code(id_)
    tree = ast.parse(code)
    defs = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert defs[-1] == solutions.STUB_NAMES[id_]
    # every name it reads is bound by the code itself (its imports, arguments, assignments) or a builtin
    assert not solutions._free_names(tree) - {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    namespace = {}
    exec(compile(code, f"<solution {id_}>", "exec"), namespace)   # the imports resolve
    assert callable(namespace[solutions.STUB_NAMES[id_]])


@pytest.mark.parametrize("id_", ["02.1", "03.2", "04.5", "06.1", "10.5"])
def test_pasted_solution_passes_its_check_in_a_fresh_namespace(id_):
    namespace = {}
    exec(solutions.code(id_), namespace)
    assert ex.check(id_, namespace[solutions.STUB_NAMES[id_]])


def test_stub_names_match_the_notebooks():
    import glob
    import re
    found = {}
    for f in sorted(glob.glob(os.path.join(ROOT, "notebooks", "[0-9][0-9]_*.ipynb"))):
        for cell in json.load(open(f))["cells"]:
            found.update(re.findall(r'check\("(\d\d\.\d+)",\s*(\w+)\)', "".join(cell["source"])))
    assert found == solutions.STUB_NAMES
    assert set(found) == set(ex.exercises())


def test_after_the_last_hint_a_withheld_class_is_not_sent_to_solution(monkeypatch, capsys):
    monkeypatch.setenv("COURSE_SOLUTIONS", "off")
    monkeypatch.setattr(ex, "_hints_shown", ex.collections.Counter())
    n = len(ex.exercises()["02.1"].hints)
    for _ in range(n + 1):
        ex.hint("02.1")
    lines = capsys.readouterr().out.strip().splitlines()
    last_hint, last = lines[-2], lines[-1]
    assert "No hints left" in last and "withheld" in last and "lesson 02" in last
    assert "withheld" in last_hint and "is next" not in last_hint
    for line in lines:   # no promise of a solution, no pointer to the file that holds the reference solutions
        assert "solution(" not in line and "lesson02.py" not in line and "course_lib/exercises" not in line


def test_with_solutions_on_the_last_hint_points_to_solution(monkeypatch, capsys):
    monkeypatch.setenv("COURSE_SOLUTIONS", "on")
    monkeypatch.setattr(ex, "_hints_shown", ex.collections.Counter())
    n = len(ex.exercises()["02.1"].hints)
    for _ in range(n + 1):
        ex.hint("02.1")
    lines = capsys.readouterr().out.strip().splitlines()
    assert "solution('02.1') is next" in lines[-2] and "solution('02.1') prints" in lines[-1]
    assert progress.load()["exercises"]["02.1"]["hints"] == n
