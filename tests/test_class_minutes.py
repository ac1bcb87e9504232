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
