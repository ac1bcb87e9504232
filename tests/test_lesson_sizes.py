"""Every lesson's main path is one sitting (issue 43): tools/lesson_stats.py's limits hold for all 14 notebooks."""

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("lesson_stats", ROOT / "tools" / "lesson_stats.py")
lesson_stats = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lesson_stats)
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_every_lesson_is_counted():
    assert len(NOTEBOOKS) == 14


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_main_path_within_limits(path):
    s = lesson_stats.stats(path)
    words, code = lesson_stats.limit(s["lesson"])
    assert s["main"]["words"] <= words, f"{path.name}: {s['main']['words']} words on the main path (limit {words})"
    assert s["main"]["code_lines"] <= code, f"{path.name}: {s['main']['code_lines']} code lines (limit {code})"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_opens_with_objectives(path):
    import json
    cells = json.loads(path.read_text())["cells"]
    opening = "".join("".join(c["source"]) for c in cells[:4] if c["cell_type"] == "markdown").lower()
    assert "objective" in opening or "you will be able to" in opening or "you will" in opening, path.name


def test_counts_follow_the_definition(tmp_path):
    import json
    nb = {"cells": [
        {"cell_type": "markdown", "metadata": {}, "source": ["# Title\n", "one two three"]},
        {"cell_type": "code", "metadata": {}, "source": ["# @title install\n", "x = 1\n"], "outputs": []},
        {"cell_type": "code", "metadata": {}, "source": ["# a comment\n", "a = 1\n", "\n", "check(\"99.1\", f)\n"],
         "outputs": []},
        {"cell_type": "markdown", "metadata": {}, "source": ["## Going further\n", "four five"]},
        {"cell_type": "code", "metadata": {}, "source": ["b = 2\n"], "outputs": []},
    ], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    p = tmp_path / "99_x.ipynb"
    p.write_text(json.dumps(nb))
    s = lesson_stats.stats(p)
    assert s["main"] == {"words": 5, "code_lines": 2, "cells": 2, "exercises": 1}
    assert s["further"]["words"] == 5 and s["further"]["code_lines"] == 1
