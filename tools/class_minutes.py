"""Minutes per lesson and per section, and the sample schedules, for INSTRUCTORS.md, from the lessons as they are
now (tools/lesson_stats.py) and measurements.

    python tools/class_minutes.py            # print the three tables
    python tools/class_minutes.py --write    # replace them in INSTRUCTORS.md (between their markers)
    python tools/class_minutes.py --check    # exit 1 if INSTRUCTORS.md's tables differ from the lessons' sizes

Run --write after a lesson changes size or its sections change (tests/test_class_minutes.py fails until then).
A section is a ``## `` heading and what follows it up to the next; its minutes use the same rates (below), the
lesson's running time shared among its main-path sections by their code lines. A schedule's minutes are sums of
its sections' (SCHEDULES).

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
import json
import math
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
GUIDE = ROOT / "INSTRUCTORS.md"
BEGIN, END = "<!-- minutes:begin (tools/class_minutes.py --write) -->", "<!-- minutes:end -->"
MARKERS = {name: (f"<!-- {name}:begin (tools/class_minutes.py --write) -->", f"<!-- {name}:end -->")
           for name in ("minutes", "sections", "schedules")}

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


# ---------------------------------------------------------------------------------------------
# Minutes per section (a `## ` heading and what follows it, up to the next), by the same rates


def section_label(heading: str) -> str:
    """``## 3. Why ...`` -> ``§3``; a "Going further" heading -> ``Going further``; else the heading's text."""
    text = heading[3:].strip()
    m = re.match(r"(\d+)\.\s", text)
    if m:
        return f"§{m.group(1)}"
    if "going further" in text.lower():
        return "Going further"
    return re.split(r"[:(]", text)[0].strip()


def sections(path) -> list[dict]:
    """The lesson's sections in order: ``{"label", "heading", "further", "words", "code_lines", "exercises"
    (ids), "run_min", "minutes", "teach_min"}``. A ``## `` line starts a section wherever it sits in a markdown
    cell. ``run_min`` shares the lesson's Run All time and the minutes to look at outputs among the main-path
    sections by their code lines (as the lesson table counts them all in the core); ``teach_min`` is the
    section without its exercises, ``minutes`` with them (EXERCISE_MIN per exercise)."""
    stats = _lesson_stats()
    nb = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    lesson = pathlib.Path(path).name[:2]
    out = [{"label": "Introduction", "heading": "(before §1)", "further": False, "words": 0, "code_lines": 0,
            "exercises": []}]
    further = False
    for cell in nb["cells"]:
        if stats.is_install_cell(cell):
            continue
        text = stats._text(cell)
        if cell["cell_type"] == "markdown":
            chunk, fenced = [], False
            for line in text.splitlines():
                if line.lstrip().startswith(("```", "~~~")):
                    fenced = not fenced
                if not fenced and line.startswith("## "):
                    out[-1]["words"] += stats.words("\n".join(chunk))
                    chunk = []
                    further = further or "going further" in line.lower()
                    out.append({"label": section_label(line), "heading": line[3:].strip(), "further": further,
                                "words": 0, "code_lines": 0, "exercises": []})
                chunk.append(line)
                if not fenced and line.lstrip().startswith("#") and "going further" in line.lower():
                    further = out[-1]["further"] = True
            out[-1]["words"] += stats.words("\n".join(chunk))
        elif cell["cell_type"] == "code":
            out[-1]["code_lines"] += stats.code_lines(text)
            out[-1]["exercises"] += re.findall(r"^\s*check\(\s*[\"'](\d\d\.\d+)[\"']", text, flags=re.M)
    out = [s for s in out if s["words"] or s["code_lines"] or s["exercises"]]
    per_ex = EXERCISE_MIN.get(lesson, DEFAULT_EXERCISE_MIN)
    run = RUN_ALL_S.get(lesson, 120) / 60 + LOOK_MIN
    main_code = sum(s["code_lines"] for s in out if not s["further"]) or 1
    for s in out:
        s["run_min"] = 0.0 if s["further"] else run * s["code_lines"] / main_code
        s["teach_min"] = s["words"] / READING_WPM + s["code_lines"] * CODE_MIN_PER_LINE + s["run_min"]
        s["minutes"] = s["teach_min"] + per_ex * len(s["exercises"])
    return out


def all_sections() -> dict[str, list[dict]]:
    return {p.name[:2]: sections(p) for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))}


def section_table() -> str:
    """Per lesson, each section's teaching minutes (whole minutes), ``+`` the exercises in it, and the lesson's
    minutes per exercise."""
    lines = ["| Lesson | min/ex | Main path: section teaching minutes + its exercises | Going further |",
             "|---|---|---|---|"]
    for lesson, secs in all_sections().items():
        def fmt(s):
            ex = f" + {', '.join(s['exercises'])}" if s["exercises"] else ""
            return f"{s['label']} {max(1, round(s['teach_min']))}{ex}"
        main = " · ".join(fmt(s) for s in secs if not s["further"])
        gf = " · ".join(fmt(s) for s in secs if s["further"]) or "—"
        lines.append(f"| {lesson} | {EXERCISE_MIN.get(lesson, DEFAULT_EXERCISE_MIN)} | {main} | {gf} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Sample schedules, their minutes summed from the sections'
#
# A class is a list of items, in order: ("fixed", text, minutes) for set-up, recap and wrap-up; ("break", minutes);
# ("teach", lesson, [section labels], [exercise ids done in class], note). A taught item's minutes are its
# sections' teach_min plus EXERCISE_MIN per exercise done in class. Homework: ("hw", lesson, labels or "all",
# exercise ids or "all"), "all" meaning every section (Going further included) or every exercise of the lesson.
# tests/test_class_minutes.py checks that each class fits its clock with a break, that every exercise of the
# lessons a schedule covers is placed once (in class or as homework), and that none comes before its section
# or its PREREQUISITES.

MAIN = ["Introduction", "§1", "§2", "§3", "§4", "§5"]
PREREQUISITES = {"12.1": [("10", "§3"), ("12", "§4")], "12.2": [("12", "§3"), ("12", "§4")],
                 "11.4": [("10", "§3")], "07.2": [("05", "§1"), ("06", "§3")]}
CLASS_MIN = 120
SCHEDULES = {
    "one": {"title": "One 2-hour class", "lessons": ["00", "01", "02"], "classes": [[
        ("fixed", "set-up check: everyone runs `./course.sh check` (or opens lesson 00 on Binder/Colab)", 10),
        ("teach", "00", ["Introduction", "§1", "§2", "§3", "§4", "§5", "Exercises"], ["00.1"], ""),
        ("teach", "01", ["Introduction", "§1", "§2"], ["01.1"], ""),
        ("break", 10),
        ("teach", "01", ["§3", "§4"], [], "01.2–01.3 as homework"),
        ("teach", "02", ["Introduction", "§1", "§2", "§3", "§4", "§5"], ["02.1", "02.2"], ""),
        ("fixed", "wrap-up: what to do next, `progress()` to see where each learner is", 5)]],
        "homework": [[("hw", "00", ["§6", "Common errors", "Going further"], ["00.2"]),
                      ("hw", "01", ["Common errors", "Going further"], ["01.2", "01.3"]),
                      ("hw", "02", ["Common errors", "Going further"], ["02.3"])]]},
    "three": {"title": "3 × 2 hours", "lessons": [f"{i:02d}" for i in range(14)], "classes": [
        [("fixed", "set-up check: everyone runs `./course.sh check` (or opens lesson 00 on Binder/Colab)", 10),
         ("teach", "00", ["Introduction", "§1", "§2", "§3", "§4", "§5", "Exercises"], ["00.1"], ""),
         ("teach", "01", ["Introduction", "§1", "§2", "§3", "§4", "Common errors"], ["01.1"], ""),
         ("break", 10),
         ("teach", "02", ["Introduction", "§1", "§2", "§3", "§4", "§5", "Common errors"], ["02.1", "02.2"], ""),
         ("fixed", "wrap-up and homework", 5)],
        [("fixed", "recap, questions on the homework", 5),
         ("teach", "04", ["Introduction", "§1", "§2", "§3", "§5"], ["04.1", "04.2"], ""),
         ("break", 10),
         ("teach", "05", ["Introduction", "§1", "§2", "§3"], ["05.1", "05.2"], ""),
         ("teach", "05", ["§4"], [], "as a demonstration: start lesson 05's Run All at the start of the class"),
         ("fixed", "wrap-up and homework", 5)],
        [("fixed", "recap, questions on the homework", 5),
         ("teach", "06", ["Introduction", "§1", "§2", "§3", "§4", "Common errors", "Summary"], ["06.1", "06.2"], ""),
         ("break", 10),
         ("teach", "07", ["Introduction", "§2", "§3"], ["07.2"], "§1 (the migration table) as reading"),
         ("teach", "12", ["Introduction", "§1", "§2"], [], "a preview: start lesson 12's Run All at the start "
                                                            "of the class"),
         ("fixed", "wrap-up: the self-study path through 08–13", 5)]],
        "homework": [
            [("hw", "00", ["§6", "Common errors", "Going further"], ["00.2"]),
             ("hw", "01", ["Going further"], ["01.2", "01.3"]),
             ("hw", "02", ["Going further"], ["02.3"]),
             ("hw", "03", "all", "all")],
            [("hw", "04", ["§4", "Common errors", "Summary", "Going further"], ["04.3", "04.4", "04.5"]),
             ("hw", "05", ["Common errors", "Summary", "Going further"], ["05.3"])],
            [("hw", "06", ["Going further"], []),
             ("hw", "07", ["§1", "Common errors", "Summary", "Going further"], ["07.1"]),
             ("hw", "08", "all", "all"), ("hw", "09", "all", "all"), ("hw", "10", "all", "all"),
             ("hw", "11", "all", "all"), ("hw", "12", "all", "all"), ("hw", "13", "all", "all")]]},
}


def _labels(labels) -> str:
    """["Introduction", "§1", "§2", "§3", "Common errors"] -> "§1–§3, Common errors" (the opening is implied)."""
    out, run = [], []
    for lab in [x for x in labels if x != "Introduction"] + [None]:
        if lab and re.fullmatch(r"§\d+", lab) and (not run or int(lab[1:]) == int(run[-1][1:]) + 1):
            run.append(lab)
            continue
        if run:
            out.append(run[0] if len(run) == 1 else f"{run[0]}–{run[-1]}")
        run = [lab] if lab and re.fullmatch(r"§\d+", lab) else []
        if lab and not run:
            out.append(lab)
    return ", ".join(out) or "opening"


def _find(secs, lesson, label):
    for s in secs[lesson]:
        if s["label"] == label:
            return s
    raise KeyError(f"lesson {lesson} has no section {label!r} (its sections: {[s['label'] for s in secs[lesson]]})")


def item_minutes(item, secs=None) -> int:
    secs = secs or all_sections()
    if item[0] == "fixed":
        return item[2]
    if item[0] == "break":
        return item[1]
    _, lesson, labels, exs, _ = item
    per_ex = EXERCISE_MIN.get(lesson, DEFAULT_EXERCISE_MIN)
    return math.ceil(sum(_find(secs, lesson, lab)["teach_min"] for lab in labels) + per_ex * len(exs))


def expand(item, secs) -> tuple[list[str], list[str]]:
    """(section labels, exercise ids) an item covers."""
    if item[0] == "teach":
        return item[2], item[3]
    if item[0] == "hw":
        lesson = item[1]
        labels = [s["label"] for s in secs[lesson]] if item[2] == "all" else item[2]
        exs = [e for s in secs[lesson] for e in s["exercises"]] if item[3] == "all" else item[3]
        return labels, exs
    return [], []


def schedule_markdown(key: str, secs=None) -> str:
    secs = secs or all_sections()
    plan = SCHEDULES[key]
    lines = [f"**{plan['title']}** (each class {CLASS_MIN} minutes on the clock, a break included):", "",
             "| class | clock (min) | content | min |", "|---|---|---|---|"]
    for k, items in enumerate(plan["classes"], 1):
        t = 0
        for item in items:
            m = item_minutes(item, secs)
            if item[0] == "fixed":
                text = item[1]
            elif item[0] == "break":
                text = "break"
            else:
                _, lesson, labels, exs, note = item
                text = f"{lesson} {_labels(labels)}" + (f"; exercise{'s' if len(exs) > 1 else ''} "
                                                       f"{', '.join(exs)}" if exs else "") + (f" ({note})" if note else "")
            lines.append(f"| {k if t == 0 else ''} | {t}–{t + m} | {text} | {m} |")
            t += m
        hw = []
        for item in plan["homework"][k - 1]:
            labels, exs = expand(item, secs)
            taught = any(i[0] == "teach" and i[1] == item[1] for c in plan["classes"][:k] for i in c)
            what = ("the rest of the lesson" if taught else "the whole lesson") if item[2] == "all" \
                else _labels(labels)
            hw.append(f"{item[1]} {what}" + (f" ({', '.join(exs)})" if exs else ""))
        lines.append(f"| | {t} of {CLASS_MIN} | *homework:* {'; '.join(hw)} | |")
    return "\n".join(lines)


def schedules_markdown() -> str:
    secs = all_sections()
    return "\n\n".join(schedule_markdown(k, secs) for k in SCHEDULES)


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
    blocks = {"minutes": table(), "sections": section_table(), "schedules": schedules_markdown()}
    if not (args.write or args.check):
        print("\n\n".join(blocks.values()))
        return 0
    text = GUIDE.read_text(encoding="utf-8")
    stale = []
    for name, new in blocks.items():
        begin, end = MARKERS[name]
        if begin not in text or end not in text:
            print(f"{GUIDE.name} has no {name} markers ({begin} ... {end})", file=sys.stderr)
            return 1
        head, rest = text.split(begin, 1)
        old, tail = rest.split(end, 1)
        if old.strip() != new.strip():
            stale.append(name)
        text = f"{head}{begin}\n{new}\n{end}{tail}"
    if args.check:
        if stale:
            print(f"{GUIDE.name}'s {', '.join(stale)} table(s) are stale: run python tools/class_minutes.py --write",
                  file=sys.stderr)
            return 1
        return 0
    GUIDE.write_text(text, encoding="utf-8")
    print(f"wrote the minutes, sections and schedules tables into {GUIDE.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
