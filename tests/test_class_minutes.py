"""INSTRUCTORS.md's minutes table is the one tools/class_minutes.py computes from the lessons as they are, and the
README links the guide."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("class_minutes", ROOT / "tools" / "class_minutes.py")
class_minutes = importlib.util.module_from_spec(spec)
spec.loader.exec_module(class_minutes)


def test_the_minutes_table_is_up_to_date():
    assert class_minutes.main(["--check"]) == 0, "run: python tools/class_minutes.py --write"


def test_the_table_has_every_lesson_and_more_minutes_with_going_further():
    rows = [r for r in class_minutes.table().splitlines() if r.startswith("| 0") or r.startswith("| 1")]
    assert len(rows) == len(list((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))) == 14
    for r in rows:
        core, full = (int(x) for x in r.strip("| ").split(" | ")[-2:])
        assert 0 < core <= full and core % 5 == 0


def test_minutes_grow_with_words_code_and_exercises():
    row = {"lesson": "02", "main": {"words": 1200, "code_lines": 100, "exercises": 2},
           "further": {"words": 0, "code_lines": 0, "exercises": 0}}
    core, full = class_minutes.minutes(row)
    assert core == full
    bigger = {**row, "main": {"words": 2400, "code_lines": 100, "exercises": 2}}
    assert class_minutes.minutes(bigger)[0] >= core + 10


def test_readme_links_the_instructors_guide():
    assert "](INSTRUCTORS.md)" in (ROOT / "README.md").read_text()
    guide = (ROOT / "INSTRUCTORS.md").read_text()
    for heading in ("## Minutes per lesson", "## Sample schedules", "## Checking lectures before class",
                    "## Binder, Colab and Kaggle", "## Grading with nbgrader", "## Slides",
                    "## Withholding solutions"):
        assert heading in guide


def test_section_minutes_add_up_to_the_lesson_table():
    rows = {r.split(" | ")[0].strip("| ")[:2]: r for r in class_minutes.table().splitlines() if r.startswith("| ")}
    for lesson, secs in class_minutes.all_sections().items():
        core = sum(s["minutes"] for s in secs if not s["further"])
        assert int(rows[lesson].split(" | ")[-2]) - 5 < core <= int(rows[lesson].split(" | ")[-2]), lesson
        found = [e for s in secs for e in s["exercises"]]
        assert len(found) == len(set(found)) and found, lesson


def test_sections_start_at_every_level_two_heading_even_mid_cell(tmp_path):
    import json
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "markdown", "id": "a", "metadata": {}, "source": "# 99 · T\n\nIntro words here"},
        {"cell_type": "markdown", "id": "b", "metadata": {}, "source": "## 1. One\n\nfour words in one"},
        {"cell_type": "code", "id": "c", "metadata": {}, "outputs": [], "execution_count": None,
         "source": "x = 1\ncheck(\"99.1\", f)"},
        {"cell_type": "markdown", "id": "d", "metadata": {}, "source": "Stuck? hint.\n\n## Common errors\n\nthree more"},
        {"cell_type": "markdown", "id": "e", "metadata": {}, "source": "## Going further (optional)\n\nmore words"}]}
    p = tmp_path / "99_test.ipynb"
    p.write_text(json.dumps(nb))
    secs = class_minutes.sections(p)
    assert [s["label"] for s in secs] == ["Introduction", "§1", "Common errors", "Going further"]
    assert [s["further"] for s in secs] == [False, False, False, True]
    assert secs[1]["exercises"] == ["99.1"] and secs[1]["code_lines"] == 2
    assert secs[2]["words"] == 5 and secs[1]["words"] == 9      # "Stuck? hint." stays with §1 (lesson_stats counts "##")
    assert secs[1]["minutes"] == secs[1]["teach_min"] + class_minutes.DEFAULT_EXERCISE_MIN


def _order(plan):
    """The plan as one sequence: class 1, its homework, class 2, ..."""
    for items, hw in zip(plan["classes"], plan["homework"]):
        yield from items
        yield from hw


def test_schedules_fit_the_clock_with_a_break_and_place_every_exercise_once_after_its_prerequisites():
    secs = class_minutes.all_sections()
    for key, plan in class_minutes.SCHEDULES.items():
        for items in plan["classes"]:
            total = sum(class_minutes.item_minutes(i, secs) for i in items)
            assert total <= class_minutes.CLASS_MIN, (key, total)
            assert sum(i[1] for i in items if i[0] == "break") >= 10
        placed, covered = [], set()
        for item in _order(plan):
            labels, exs = class_minutes.expand(item, secs)
            if not labels and not exs:
                continue
            lesson = item[1]
            covered |= {(lesson, lab) for lab in labels}
            for e in exs:
                home = next(s["label"] for s in secs[lesson] if e in s["exercises"])
                assert (lesson, home) in covered, (key, e, "its section is not taught by then")
                for need in class_minutes.PREREQUISITES.get(e, []):
                    assert need in covered, (key, e, "comes before its prerequisite", need)
            placed += exs
        want = [e for ls in plan["lessons"] for s in secs[ls] for e in s["exercises"]]
        assert sorted(placed) == sorted(want), (key, set(want) ^ set(placed))


def test_a_schedule_with_12_1_before_its_prerequisites_is_caught():
    secs = class_minutes.all_sections()
    bad = ("teach", "12", ["§1", "§2", "Exercises"], ["12.1"], "")
    covered = {("12", lab) for lab in bad[2]}
    assert any(need not in covered for need in class_minutes.PREREQUISITES["12.1"])
    assert class_minutes.item_minutes(bad, secs) >= class_minutes.EXERCISE_MIN["12"]
