"""What a learner sees first, before running anything: pictures for diagrams, progress bars at their end."""

import json
import pathlib
import sys

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
sys.path.insert(0, str(ROOT / "tools"))
import refresh_notebooks  # noqa: E402


def outputs(path):
    for cell in json.loads(path.read_text())["cells"]:
        yield from cell.get("outputs", [])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_stored_diagram_has_a_png_for_untrusted_viewers(path):
    for out in outputs(path):
        data = out.get("data", {})
        if "image/svg+xml" in data:
            assert "image/png" in data, f"{path.name}: a diagram without a PNG shows as DOT text when untrusted"
            assert "".join(data["text/plain"]).lstrip().startswith("digraph"), "nbval compares the DOT source"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_progress_bars_show_their_final_state(path):
    for out in outputs(path):
        data = out.get("data", {})
        if "application/vnd.jupyter.widget-view+json" in data:
            text = "".join(data["text/plain"])
            assert "100%|██████████|" in text, f"{path.name}: a stored bar shows {text!r}"


def bar_notebook(value, total):
    """A notebook holding one tqdm bar as nbclient stores it: a widget view, a 0% text, and the widget state."""
    nb = nbformat.v4.new_notebook()
    out = nbformat.v4.new_output("display_data", data={
        "application/vnd.jupyter.widget-view+json": {"model_id": "box", "version_major": 2, "version_minor": 0},
        "text/plain": "training:   0%|          | 0/500 [00:00<?, ?it/s]"})
    nb.cells.append(nbformat.v4.new_code_cell("fit()", outputs=[out]))
    state = {
        "box": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_l", "IPY_MODEL_p", "IPY_MODEL_r"]}},
        "l": {"model_name": "HTMLModel", "state": {"value": f"training:\u2007{100 * value // total}%"}},
        "p": {"model_name": "FloatProgressModel", "state": {"value": float(value), "max": float(total)}},
        "r": {"model_name": "HTMLModel", "state": {"value": f"\u2007{value}/{total}\u2007[00:02&lt;00:00]"}},
    }
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": state}}
    return nb, out


@pytest.mark.parametrize("value, bar", [(500, "██████████"), (250, "█████     "), (0, "          ")])
def test_refresh_writes_the_bars_final_state_as_its_text(value, bar):
    nb, out = bar_notebook(value, 500)
    assert refresh_notebooks.settle_progress_bars(nb) == 1
    assert out["data"]["text/plain"] == f"training: {100 * value // 500}%|{bar}| {value}/500 [00:02<00:00]"


def test_refresh_leaves_other_widgets_alone():
    nb, out = bar_notebook(500, 500)
    nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]["box"]["model_name"] = "VBoxModel"
    assert refresh_notebooks.settle_progress_bars(nb) == 0
    assert out["data"]["text/plain"].startswith("training:   0%")


def _diagram_widths(data):
    """A stored diagram's width in CSS px: the SVG's ``width`` and ``viewBox`` (pt, 4/3 px each) and the PNG's."""
    import base64
    import re
    svg = "".join(data["image/svg+xml"])
    width = re.search(r'<svg[^>]*\swidth="([\d.]+)(pt|px)?"', svg)
    view_box = re.search(r'viewBox="[\d.\-]+ [\d.\-]+ ([\d.]+) [\d.]+"', svg)
    scale = 4 / 3 if width and width.group(2) in (None, "pt") else 1.0
    png = base64.b64decode("".join(data["image/png"])) if "image/png" in data else b""
    return {"svg width": float(width.group(1)) * scale if width else None,
            "svg viewBox": float(view_box.group(1)) * 4 / 3 if view_box else None,
            "png width": int.from_bytes(png[16:20], "big") if png.startswith(b"\x89PNG") else None}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_stored_diagram_fits_a_notebook_width(path):
    """Whole where a learner opens it: no stored diagram is wider than JupyterLab's 848-px output area (issue 37)."""
    from course_lib.diagrams import MAX_WIDTH_PX
    for k, cell in enumerate(json.loads(path.read_text())["cells"]):
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "image/svg+xml" not in data:
                continue
            widths = _diagram_widths(data)
            assert widths["svg width"] is not None, f"{path.name} cell {k}: a stored SVG without a width"
            too_wide = {what: round(w) for what, w in widths.items() if w is not None and w > MAX_WIDTH_PX + 1}
            assert not too_wide, (f"{path.name} cell {k}: a stored diagram {too_wide} px wide; diagrams must fit "
                                  f"{MAX_WIDTH_PX} px (re-run the notebook: course_lib.diagrams lays them out to fit)")


def test_refresh_drops_widget_state_that_no_output_uses():
    nb, out = bar_notebook(500, 500)
    assert not refresh_notebooks.drop_unused_widget_state(nb), "a widget view still uses it"
    del out["data"]["application/vnd.jupyter.widget-view+json"]
    assert refresh_notebooks.drop_unused_widget_state(nb) and "widgets" not in nb.metadata


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.name.startswith("05_")], ids=lambda p: p.name)
def test_lesson_05s_progress_bar_is_stored_as_text_at_its_end(path):
    """Readable untrusted, trusted, on GitHub and in an HTML export: plain text, no widget (issue 28)."""
    nb = json.loads(path.read_text())
    assert "widgets" not in nb["metadata"]
    bars = ["".join(out["data"]["text/plain"]) for out in outputs(path)
            if "training:" in "".join(out.get("data", {}).get("text/plain", ""))]
    assert bars, "lesson 05 shows fit's progress bar"
    for text in bars:
        assert "100%|██████████|" in text and "500/500" in text, text
    assert not any("application/vnd.jupyter.widget-view+json" in out.get("data", {}) for out in outputs(path))
