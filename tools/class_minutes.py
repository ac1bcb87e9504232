"""Minutes per lesson for INSTRUCTORS.md, from the lessons as they are now (tools/lesson_stats.py) and measurements.

    python tools/class_minutes.py            # print the table
    python tools/class_minutes.py --write    # replace the table in INSTRUCTORS.md (between its minutes markers)
    python tools/class_minutes.py --check    # exit 1 if INSTRUCTORS.md's table differs from the lessons' sizes

Run --write after a lesson changes size (tests/test_class_minutes.py fails until then).

A learner's minutes for a lesson = reading + code + running + exercises, rounded up to 5 minutes:
- reading: prose words (lesson_stats: markdown outside code fences) at READING_WPM words per minute;
- code: code lines (lesson_stats: non-blank, non-comment lines) at CODE_MIN_PER_LINE minutes each;
- running: RUN_ALL_S, the lesson's measured Run All time (seconds), plus LOOK_MIN to look at the outputs;
- exercises: EXERCISE_MIN[lesson] minutes per exercise: the time learners took per exercise in the course's
  recorded walk-throughs (2026-11-29), or DEFAULT_EXERCISE_MIN where none was recorded.
"Core" is the main path (cells before the first "Going further" heading, without the install cell); "with
Going further" adds that part's words, code and exercises.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
GUIDE = ROOT / "INSTRUCTORS.md"
BEGIN, END = "<!-- minutes:begin (tools/class_minutes.py --write) -->", "<!-- minutes:end -->"

# Calibration, from the recorded walk-throughs (2026-11-29): a beginner read lessons 03-07's prose at 60-135
# words a minute (rereading included), a learner read 09-13's at 141-155 and their code at about 25 lines in
# 1 minute (0.04 min a line, counting blank and comment lines; lesson_stats counts neither, hence 0.05).
READING_WPM = 120
CODE_MIN_PER_LINE = 0.05
LOOK_MIN = 3

# Run All, seconds: `./course.sh instructor` (every cell, solutions in place) on 2 shared x86-64 cores at load
# 8-16, 2026-11-29: an upper bound for a laptop.
RUN_ALL_S = {"00": 52, "01": 21, "02": 26, "03": 38, "04": 63, "05": 81, "06": 28, "07": 43, "08": 25, "09": 106,
             "10": 211, "11": 119, "12": 411, "13": 443}

# Minutes per exercise, from the walk-throughs: lesson 03 15 min for 3, 04 40 for 4, 05 25 for 3, 06 10 for 2,
# 07 30-45 for 2, 09 10 for 2, 10 40 for 5, 11 20 for 4, 12 25 for 3, 13 10-15 for 1.
EXERCISE_MIN = {"03": 5, "04": 10, "05": 8, "06": 5, "07": 19, "09": 5, "10": 8, "11": 5, "12": 8, "13": 13}
DEFAULT_EXERCISE_MIN = 8    # 00, 01, 02, 08: no recorded time; the mean of the recorded ones


def _lesson_stats():
    spec = importlib.util.spec_from_file_location("lesson_stats", ROOT / "tools" / "lesson_stats.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _up5(x: float) -> int:
    return int(5 * math.ceil(x / 5))


def minutes(row: dict) -> tuple[int, int]:
    """(core, with Going further) minutes for one lesson_stats row."""
    lesson = row["lesson"]
    per_ex = EXERCISE_MIN.get(lesson, DEFAULT_EXERCISE_MIN)
    run = RUN_ALL_S.get(lesson, 120) / 60 + LOOK_MIN

    def part(p):
        return p["words"] / READING_WPM + p["code_lines"] * CODE_MIN_PER_LINE + p["exercises"] * per_ex

    core = part(row["main"]) + run
    return _up5(core), _up5(core + part(row["further"]))


def table() -> str:
    stats = _lesson_stats()
    paths = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    lines = ["| Lesson | Core words / code lines / exercises | Run All (s) | Core min | With Going further min |",
             "|---|---|---|---|---|"]
    total_core = total_all = 0
    for path in paths:
        row = stats.stats(path)
        core, full = minutes(row)
        total_core, total_all = total_core + core, total_all + full
        m = row["main"]
        lines.append(f"| {path.stem} | {m['words']} / {m['code_lines']} / {m['exercises']} | "
                     f"{RUN_ALL_S.get(row['lesson'], '?')} | {core} | {full} |")
    lines.append(f"| **All {len(paths)}** | | | **{total_core}** (≈ {total_core / 60:.1f} h) | **{total_all}** "
                 f"(≈ {total_all / 60:.1f} h) |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    new = table()
    if not (args.write or args.check):
        print(new)
        return 0
    text = GUIDE.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        print(f"{GUIDE.name} has no minutes markers ({BEGIN} ... {END})", file=sys.stderr)
        return 1
    head, rest = text.split(BEGIN, 1)
    old, tail = rest.split(END, 1)
    if args.check:
        if old.strip() != new.strip():
            print(f"{GUIDE.name}'s minutes table is stale: run python tools/class_minutes.py --write", file=sys.stderr)
            return 1
        return 0
    GUIDE.write_text(f"{head}{BEGIN}\n{new}\n{END}{tail}", encoding="utf-8")
    print(f"wrote the minutes table into {GUIDE.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
