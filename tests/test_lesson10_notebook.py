"""Lesson 10's stored notebook: its diagram fits a notebook's width, its numbers show, and its steps keep the
vma checker on and donate their state."""

import json
import pathlib
import re

NOTEBOOK = pathlib.Path(__file__).resolve().parent.parent / "notebooks" / "10_sharded_state.ipynb"


def _cells():
    return json.loads(NOTEBOOK.read_text())["cells"]


def test_every_stored_svg_fits_about_1000_px():
    widths = []
    for cell in _cells():
        for out in cell.get("outputs", []):
            svg = "".join(out.get("data", {}).get("image/svg+xml", ""))
            if svg:
                m = re.search(r'<svg width="([\d.]+)pt"', svg)
                assert m, svg[:200]
                widths.append(float(m.group(1)) * 4 / 3)          # pt -> px
    assert widths and max(widths) <= 1000, widths


def test_no_stored_number_rounds_to_zero_in_its_unit():
    text = "".join("".join(o.get("text", "")) for c in _cells() for o in c.get("outputs", []))
    assert not re.search(r"\b0\.0+ (GiB|MiB|KiB)\b", text), re.findall(r".{40}\b0\.0+ (?:GiB|MiB|KiB).{10}", text)


def test_the_lessons_steps_keep_the_vma_checker_on_and_donate():
    code = ["".join(c["source"]) for c in _cells() if c["cell_type"] == "code"]
    assert not any("check_vma=False" in c for c in code)
    jitted = [(m.group(1), c[m.start():m.start() + 400]) for c in code
              for m in re.finditer(r"jax\.jit\(jax\.shard_map\((\w*step\w*)", c)]
    assert len(jitted) >= 4, jitted
    undonated = [name for name, text in jitted if "donate_argnums" not in text.split("\n\n")[0]]
    assert not undonated, undonated
