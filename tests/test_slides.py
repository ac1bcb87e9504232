"""Slides (tools/slides.py): every lesson carries slideshow metadata by the rule, and RISE shows lesson 02 as
that many slides.

The browser test starts JupyterLab (127.0.0.1, token auth, its own Jupyter folders) over a copy of lesson 02,
opens it in RISE (jupyterlab-rise, the `lab` extra) in headless Chromium at 1280 × 720, and counts the
reveal.js slides and sub-slides. It runs no cell: the kernel JupyterLab starts is shut down through the API, and
the test checks that no process it started is left. Needs `chromium`, `playwright` and jupyterlab-rise; skips
otherwise, saying which is missing.
"""

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import urllib.request

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("slides", ROOT / "tools" / "slides.py")
slides = importlib.util.module_from_spec(spec)
spec.loader.exec_module(slides)
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
TOKEN = "rise-browser-test-token"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name[:2])
def test_every_lesson_carries_its_slide_metadata(path):
    nb = nbformat.read(path, as_version=4)
    assert slides.stale(nb) == [], f"run: python tools/slides.py --apply {path.relative_to(ROOT)}"
    kinds = [c.metadata["slideshow"]["slide_type"] for c in nb.cells]
    assert kinds[0] == "slide" and kinds.count("slide") >= 4
    for cell, kind in zip(nb.cells, kinds):
        if slides.is_install_cell(cell):
            assert kind == "skip"
        head = slides._heading(cell)
        if head and head.startswith("## "):
            assert kind == "slide", head
        if head and "going further" in head.lower():
            assert kind == "slide", head


def test_the_size_rule_splits_a_long_section_into_sub_slides_that_fit():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Title"), nbformat.v4.new_markdown_cell("## A section")]
    nb.cells += [nbformat.v4.new_markdown_cell("word " * 60) for _ in range(12)]   # 12 paragraphs of 4 lines
    nb.cells.append(nbformat.v4.new_markdown_cell("## Going further (optional)"))
    slides.apply(nb)
    kinds = [c.metadata["slideshow"]["slide_type"] for c in nb.cells]
    assert kinds[-1] == "slide" and kinds[:2] == ["slide", "slide"]
    assert kinds[2:-1].count("subslide") >= 2
    # every (sub-)slide that holds more than one cell fits the budget
    used, sizes = 0, []
    for cell, kind in zip(nb.cells, kinds):
        if kind in ("slide", "subslide"):
            sizes.append(used)
            used = 0
        used += slides.height(cell)
    sizes.append(used)
    assert max(sizes) <= slides.BUDGET
    assert slides.stale(nb) == []
    nb.cells[3].metadata["slideshow"]["slide_type"] = "slide"
    assert slides.stale(nb) and "cell 3" in slides.stale(nb)[0]


def test_apply_splits_markdown_cells_at_mid_cell_sections_and_never_code():
    md = nbformat.v4.new_markdown_cell
    nb = nbformat.v4.new_notebook()
    fenced = "Some code:\n\n```python\n## not a heading: inside a fence\n```\n\nmore"
    nb.cells = [md("# Title"), md("## 1. First\n\nText."),
                md("Stuck? `hint(\"01.1\")`.\n\n## Common errors\n\nAn error.\n\n## Summary\n\n- a point"),
                nbformat.v4.new_code_cell("x = 1\n## a comment, not a heading\ny = 2"), md(fenced)]
    nb.cells[2].metadata["tags"] = ["keep-me"]
    before = [c.id for c in nb.cells]
    assert [bool(slides.mid_cell_sections(c)) for c in nb.cells] == [False, False, True, False, False]
    problems = slides.stale(nb)
    assert any("cell 2: a section heading in the middle" in p and "Common errors" in p for p in problems)
    assert slides.apply(nb)
    nbformat.validate(nb)                                   # nbformat 4.5: every cell has a unique id
    sources = [c.source for c in nb.cells]
    assert sources[2:5] == ["Stuck? `hint(\"01.1\")`.", "## Common errors\n\nAn error.", "## Summary\n\n- a point"]
    assert sources[5] == "x = 1\n## a comment, not a heading\ny = 2" and sources[6] == fenced
    ids = [c.id for c in nb.cells]
    assert len(set(ids)) == len(ids) and ids[2] == before[2] and not {ids[3], ids[4]} & set(before)
    assert nb.cells[3].metadata["tags"] == ["keep-me"]
    kinds = [c.metadata["slideshow"]["slide_type"] for c in nb.cells]
    assert kinds[3] == kinds[4] == "slide"
    assert slides.stale(nb) == [] and not slides.apply(nb)   # a second --apply changes nothing


def test_apply_on_copies_of_the_lessons_leaves_no_mid_cell_section_and_keeps_text_code_and_outputs(tmp_path):
    for path in LESSONS:
        shutil.copy2(path, tmp_path / path.name)
    assert slides.main(["--apply", *map(str, sorted(tmp_path.glob("*.ipynb")))]) == 0
    assert slides.main(["--check", *map(str, sorted(tmp_path.glob("*.ipynb")))]) == 0
    for path in LESSONS:
        old, new = nbformat.read(path, as_version=4), nbformat.read(tmp_path / path.name, as_version=4)
        nbformat.validate(new)
        assert not any(slides.mid_cell_sections(c) for c in new.cells)
        words = lambda nb: " ".join(c.source for c in nb.cells if c.cell_type == "markdown").split()
        assert words(new) == words(old)
        code = lambda nb: [(c.source, c.outputs) for c in nb.cells if c.cell_type == "code"]
        assert code(new) == code(old)


@pytest.mark.timeout(300)
def test_rise_shows_lesson_02_as_its_slides(tmp_path):
    pytest.importorskip("jupyterlab", reason="JupyterLab (the `lab` extra) is not installed here")
    if importlib.util.find_spec("jupyterlab_rise") is None:
        pytest.skip("jupyterlab-rise (the `lab` extra) is not installed here")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the `playwright` package is not installed here")
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import stop_process_group
    from test_browser import CHROMIUM_FLAGS, chromium, free_port
    browser_path = chromium()
    if browser_path is None:
        pytest.skip("no Chromium here (Debian: apt-get install chromium; .ci/run installs it as root)")
    lesson = ROOT / "notebooks" / "02_pmap_basics.ipynb"
    shape = slides.slides(nbformat.read(lesson, as_version=4))
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy2(lesson, root / lesson.name)
    port = free_port()
    runtime = tmp_path / "runtime"
    env = {**os.environ, "JUPYTER_DATA_DIR": str(tmp_path / "data"), "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "JUPYTER_RUNTIME_DIR": str(runtime), "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"), "HOME": str(tmp_path), "JAX_PLATFORMS": "cpu"}
    log = tmp_path / "lab.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}", "--allow-root"],
        stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def api(method, path):
        req = urllib.request.Request(f"{base}{path}", method=method, headers={"Authorization": f"token {TOKEN}"})
        with opener.open(req, timeout=10) as resp:
            body = resp.read()
            return json.loads(body) if body else None

    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                api("GET", "/api/status")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("JupyterLab did not start: " + log.read_text()[-2000:])
                time.sleep(0.5)
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=browser_path, args=CHROMIUM_FLAGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 720})
                page.goto(f"{base}/rise/{lesson.name}?token={TOKEN}", timeout=120_000)
                page.locator(".reveal .slides > section").first.wait_for(timeout=120_000)
                page.wait_for_timeout(1000)
                counted = page.evaluate("""() => [...document.querySelectorAll('.reveal .slides > section')]
                    .map(s => Math.max(1, s.querySelectorAll(':scope > section').length))""")
                if os.environ.get("COURSE_SCREENSHOTS"):
                    page.screenshot(path=str(pathlib.Path(os.environ["COURSE_SCREENSHOTS"]) / "rise_02.png"))
            finally:
                browser.close()
        assert len(counted) == len(shape), (counted, [len(s) for s in shape])
        assert counted == [len(s) for s in shape]
        assert len(counted) >= 6 and sum(counted) > len(counted)
    finally:
        try:
            for kernel in api("GET", "/api/kernels") or []:
                api("DELETE", f"/api/kernels/{kernel['id']}")
        except OSError:
            pass
        stop_process_group(proc, timeout=20)
        left = subprocess.run(["pgrep", "-f", str(runtime)], capture_output=True, text=True).stdout.split()
        for pid in left:
            os.kill(int(pid), 9)
        assert not left, f"processes left running after JupyterLab stopped: {left}"
