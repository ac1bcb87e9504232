"""Slideshow metadata for every lesson, so that RISE (jupyterlab-rise) and ``nbconvert --to slides`` show a lesson
as slides at 1280 × 720.

    python tools/slides.py --apply [NOTEBOOK ...]   # write the metadata (default: notebooks/NN_*.ipynb)
    python tools/slides.py --check [NOTEBOOK ...]   # exit 1, naming them, where the metadata is missing or stale

The rule, cell by cell (``metadata.slideshow.slide_type``):
- the title cell and each ``## `` section heading start a slide, and so does any heading that says "Going
  further" (at any level), so that optional material sits on its own slides;
- each ``### `` heading starts a sub-slide (RISE: down);
- the install cell (Colab/Kaggle, ``# @title``) and cells tagged ``remove-cell`` are skipped;
- any other cell continues the (sub-)slide (``-``), unless adding it would overflow the screen: then it starts
  a new sub-slide. The size rule estimates a cell's height in lines of RISE's default font at 1280 × 720:
  prose and code wrap at 90 characters, a heading counts 2 lines, a text output at most 12, a picture 10, and a
  slide holds 17 lines. A cell larger than that on its own gets its own sub-slide, which RISE scrolls
  (``"scroll": true`` in the notebook's ``rise`` metadata).

Before assigning slides, ``--apply`` splits every markdown cell at each ``## `` heading that is not its first
line (outside code fences), so that each section starts a cell, and so a slide: the text before the heading stays
in the cell, each heading and what follows it becomes a new markdown cell (a new cell id, nbformat 4.5; the
cell's tags kept). Code cells are never split. ``--check`` names a markdown cell with a ``## `` heading in its
middle. Otherwise only metadata changes (the notebook's ``rise`` settings and each cell's ``slideshow``): the
text, the code and the outputs stay.
"""

from __future__ import annotations

import argparse
import copy
import math
import pathlib
import re
import sys

import nbformat

ROOT = pathlib.Path(__file__).resolve().parent.parent
WRAP = 90              # characters per line at 1280 px
BUDGET = 17            # lines per slide at 720 px
OUTPUT_CAP = 12        # a long text output shows this many lines (the rest scrolls)
PICTURE = 10           # a diagram, scaled to the slide
RISE = {"width": 1280, "height": 720, "scroll": True, "start_slideshow_at": "beginning",
        "enable_chalkboard": False, "transition": "none"}


def _lines(text: str) -> int:
    return sum(max(1, math.ceil(len(line) / WRAP)) for line in text.splitlines()) if text.strip() else 0


def height(cell) -> int:
    """The cell's estimated height on a slide, in lines."""
    if cell.cell_type == "markdown":
        heads = sum(1 for ln in cell.source.splitlines() if ln.lstrip().startswith("#"))
        return _lines(cell.source) + heads
    if cell.cell_type != "code":
        return 0
    h = _lines(cell.source)
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if any(k.startswith("image/") for k in data):
            h += PICTURE
            continue
        text = out.get("text", "") or data.get("text/plain", "")
        text = "".join(text) if isinstance(text, list) else text
        h += min(OUTPUT_CAP, _lines(text))
    return h


def _heading(cell) -> str | None:
    if cell.cell_type != "markdown":
        return None
    first = cell.source.lstrip().splitlines()[0] if cell.source.strip() else ""
    return first if first.startswith("#") else None


SECTION = re.compile(r"^## ")
FENCE = re.compile(r"^\s*(```|~~~)")


def mid_cell_sections(cell) -> list[int]:
    """Line numbers (0-based) of the ``## `` headings in a markdown cell that are not its first line, outside
    fenced code; ``[]`` for code cells and for cells that only start with one."""
    if cell.cell_type != "markdown":
        return []
    found, fenced, seen_text = [], False, False
    for n, line in enumerate(cell.source.splitlines()):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and SECTION.match(line) and seen_text:
            found.append(n)
        seen_text = seen_text or bool(line.strip())
    return found


def _new_id(taken: set[str]) -> str:
    from nbformat.corpus.words import generate_corpus_id
    while True:
        cid = generate_corpus_id()
        if cid not in taken:
            taken.add(cid)
            return cid


def split_sections(nb) -> int:
    """Split every markdown cell at its mid-cell ``## `` headings (``mid_cell_sections``); returns how many new
    cells were made. Each new cell gets a fresh id and the original's metadata without its ``slideshow``."""
    taken = {c.get("id") for c in nb.cells if c.get("id")}
    cells, made = [], 0
    for cell in nb.cells:
        cuts = mid_cell_sections(cell)
        if not cuts:
            cells.append(cell)
            continue
        lines = cell.source.splitlines()
        bounds = [0] + cuts + [len(lines)]
        for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
            text = "\n".join(lines[a:b]).strip("\n").rstrip()
            part = cell if k == 0 else copy.deepcopy(cell)
            part.source = text
            if k:
                part.metadata.pop("slideshow", None)
                part.pop("attachments", None)
                if "id" in cell or nb.nbformat_minor >= 5:
                    part["id"] = _new_id(taken)
                made += 1
            cells.append(part)
    nb.cells = cells
    return made


def is_install_cell(cell) -> bool:
    return cell.cell_type == "code" and cell.source.lstrip().startswith("# @title")


def slide_types(nb) -> list[str]:
    """The slide type of every cell, by the rule in this module's docstring."""
    types, used = [], 0
    for i, cell in enumerate(nb.cells):
        head = _heading(cell)
        if is_install_cell(cell) or "remove-cell" in cell.metadata.get("tags", []):
            types.append("skip")
            continue
        h = height(cell)
        if i == 0 or (head and (head.startswith(("# ", "## ")) or "going further" in head.lower())):
            kind, used = "slide", h
        elif head and head.startswith("### "):
            kind, used = "subslide", h
        elif used + h > BUDGET and used > 0:
            kind, used = "subslide", h
        else:
            kind, used = "-", used + h
        types.append(kind)
    return types


def apply(nb) -> bool:
    """Split markdown cells at mid-cell sections, then write the slide metadata into ``nb``; returns whether
    anything changed."""
    changed = split_sections(nb) > 0
    changed = nb.metadata.get("rise") != RISE or changed
    nb.metadata["rise"] = dict(RISE)
    for cell, kind in zip(nb.cells, slide_types(nb)):
        if cell.metadata.get("slideshow", {}).get("slide_type") != kind:
            cell.metadata["slideshow"] = {"slide_type": kind}
            changed = True
    return changed


def stale(nb) -> list[str]:
    """What differs from the rule: ``[]`` when the notebook's slide metadata is up to date."""
    problems = [] if nb.metadata.get("rise") == RISE else ["the notebook's rise settings"]
    for i, cell in enumerate(nb.cells):
        for n in mid_cell_sections(cell):
            problems.append(f"cell {i}: a section heading in the middle of a markdown cell (line {n + 1}: "
                            f"{cell.source.splitlines()[n][:60]!r}), so no slide starts there")
    for i, (cell, kind) in enumerate(zip(nb.cells, slide_types(nb))):
        have = cell.metadata.get("slideshow", {}).get("slide_type")
        if have != kind:
            problems.append(f"cell {i}: slide_type {have!r}, expected {kind!r}")
    return problems


def slides(nb) -> list[list[int]]:
    """The lesson as RISE shows it: per slide, the number of cells on each of its (sub-)slides."""
    shown = []
    for kind in (c.metadata.get("slideshow", {}).get("slide_type", "-") for c in nb.cells):
        if kind == "skip":
            continue
        if kind == "slide" or not shown:
            shown.append([1])
        elif kind == "subslide":
            shown[-1].append(1)
        else:
            shown[-1][-1] += 1
    return shown


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--apply", action="store_true", help="write the slide metadata")
    mode.add_argument("--check", action="store_true", help="exit 1 where it is missing or stale")
    parser.add_argument("notebooks", nargs="*", type=pathlib.Path)
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    bad = 0
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        if args.apply:
            if apply(nb):
                nbformat.validate(nb)
                nbformat.write(nb, path)
            shape = slides(nb)
            print(f"{path.name}: {len(shape)} slides, {sum(len(s) for s in shape)} with sub-slides")
        else:
            problems = stale(nb)
            if problems:
                bad += 1
                print(f"{path.name}: slide metadata missing or stale ({len(problems)}: {problems[0]}, ...); run "
                      f"python tools/slides.py --apply {path.relative_to(ROOT) if path.is_absolute() else path}")
    if args.check and not bad:
        print(f"{len(paths)} notebooks carry up-to-date slide metadata")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
