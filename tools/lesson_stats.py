"""How big each lesson is: prose words and code lines on its main path and under "Going further".

    python tools/lesson_stats.py                 # a table for every notebooks/NN_*.ipynb
    python tools/lesson_stats.py --check         # exit 1, naming them, if a main path is over its limit
    python tools/lesson_stats.py --json          # the same numbers as JSON (INSTRUCTORS.md's minutes use them)

The main path is every cell before the first heading that contains "Going further", leaving out the install
cell (the Colab/Kaggle cell that starts with ``# @title``). Words are the whitespace-separated words of the
markdown cells outside fenced code; code lines are the non-blank lines of code cells that are not comments.
Limits (issue 43): lessons 00-08 at most 2,500 words and 250 code lines, lessons 09-13 at most 3,300 and 330.
"""

import argparse
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIMITS = {"early": (2500, 250), "late": (3300, 330)}  # (words, code lines); lessons 00-08 early, 09-13 late


def _text(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def is_install_cell(cell) -> bool:
    return cell.get("cell_type") == "code" and _text(cell).lstrip().startswith("# @title")


def is_going_further(cell) -> bool:
    if cell.get("cell_type") != "markdown":
        return False
    return any(line.lstrip().startswith("#") and "going further" in line.lower()
               for line in _text(cell).splitlines())


def words(markdown: str) -> int:
    prose = re.sub(r"```.*?```", " ", markdown, flags=re.S)
    return len(prose.split())


def code_lines(code: str) -> int:
    return sum(1 for line in code.splitlines() if line.strip() and not line.lstrip().startswith("#"))


def stats(path) -> dict:
    """``{"lesson", "main": {"words", "code_lines", "cells", "exercises"}, "further": {...}}`` for one notebook."""
    nb = json.loads(pathlib.Path(path).read_text())
    part = "main"
    out = {p: {"words": 0, "code_lines": 0, "cells": 0, "exercises": 0} for p in ("main", "further")}
    for cell in nb["cells"]:
        if is_install_cell(cell):
            continue
        if part == "main" and is_going_further(cell):
            part = "further"
        text = _text(cell)
        out[part]["cells"] += 1
        if cell["cell_type"] == "markdown":
            out[part]["words"] += words(text)
        elif cell["cell_type"] == "code":
            out[part]["code_lines"] += code_lines(text)
            out[part]["exercises"] += len(re.findall(r"^\s*check\(\s*[\"']\d\d\.\d+[\"']", text, flags=re.M))
    return {"lesson": pathlib.Path(path).name[:2], "notebook": pathlib.Path(path).name, **out}


def limit(lesson: str) -> tuple[int, int]:
    return LIMITS["early" if int(lesson) <= 8 else "late"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    paths = args.notebooks or sorted(str(p) for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    rows = [stats(p) for p in paths]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"{'lesson':<8}{'words':>7}{'code':>6}{'ex':>4}   {'GF words':>8}{'GF code':>8}{'GF ex':>6}   limit")
        for r in rows:
            m, f = r["main"], r["further"]
            w, c = limit(r["lesson"])
            flag = "" if m["words"] <= w and m["code_lines"] <= c else "  OVER"
            print(f"{r['lesson']:<8}{m['words']:>7}{m['code_lines']:>6}{m['exercises']:>4}   "
                  f"{f['words']:>8}{f['code_lines']:>8}{f['exercises']:>6}   {w}/{c}{flag}")
    over = [r["notebook"] for r in rows
            if r["main"]["words"] > limit(r["lesson"])[0] or r["main"]["code_lines"] > limit(r["lesson"])[1]]
    if args.check and over:
        print("over the main-path limit: " + ", ".join(over), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
