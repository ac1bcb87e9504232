"""Lesson 04 in JupyterLab, as a learner sees it in a 1280-px window: no stored diagram is clipped.

A trusted notebook (``./course.sh lab`` trusts the course's notebooks) shows each diagram's SVG at its own size,
and JupyterLab cuts an SVG wider than the output area (848 px in a 1280-px window) at its right edge: lesson 04's
two ppermute diagrams were 947 px. An untrusted one (a fresh clone opened with a plain ``jupyter lab``) shows the
PNG. This opens the same stored lesson both ways in one JupyterLab (on 127.0.0.1, token auth, its own Jupyter
folders, every cell rendered) in headless Chromium and measures every diagram against its output area. It runs
nothing: the kernel that JupyterLab starts for a notebook is shut down through the server's API before the server
is stopped, and the test checks that no process it started is left.

Needs the ``chromium`` system package and the ``playwright`` Python package (it downloads no browser); without
them it skips and says so. COURSE_SCREENSHOTS=DIR keeps a screenshot of each view there.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import stop_process_group
from test_browser import CHROMIUM_FLAGS, chromium, free_port

ROOT = pathlib.Path(__file__).resolve().parent.parent
LESSON = ROOT / "notebooks" / "04_collectives.ipynb"
TOKEN = "lab-browser-test-token"


def stored_diagrams(nb: dict) -> int:
    """How many course diagrams (graphviz, DOT as text/plain) the notebook stores."""
    return sum(1 for c in nb["cells"] for o in c.get("outputs", [])
               if "image/svg+xml" in o.get("data", {}) and "".join(o["data"].get("text/plain", "")).startswith("digraph"))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab over two copies of lesson 04, ``trusted/`` (signed in this server's own notary) and
    ``untrusted/``; yields (base URL, number of stored diagrams)."""
    pytest.importorskip("jupyterlab", reason="JupyterLab (the `lab` extra) is not installed here")
    nbformat = pytest.importorskip("nbformat")
    from nbformat.sign import NotebookNotary

    tmp = tmp_path_factory.mktemp("lab")
    root, data = tmp / "root", tmp / "data"
    for kind in ("trusted", "untrusted"):
        (root / kind).mkdir(parents=True)
        shutil.copy2(LESSON, root / kind / LESSON.name)
    data.mkdir()
    notary = NotebookNotary(data_dir=str(data))
    signed = nbformat.read(root / "trusted" / LESSON.name, as_version=4)
    notary.sign(signed)
    assert notary.check_signature(signed)
    # A signature covers the notebook's content: the untrusted copy differs by a metadata entry nothing shows.
    unsigned = nbformat.read(root / "untrusted" / LESSON.name, as_version=4)
    unsigned.metadata["course_test"] = "an untrusted copy"
    nbformat.write(unsigned, root / "untrusted" / LESSON.name)
    assert not notary.check_signature(unsigned)
    # Every cell rendered (JupyterLab 4 renders cells near the window only, by default), no news or update checks.
    settings = tmp / "settings" / "@jupyterlab"
    for ext, body in {"notebook-extension/tracker": {"windowingMode": "none"},
                      "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False}}.items():
        (settings / ext).parent.mkdir(parents=True, exist_ok=True)
        (settings / f"{ext}.jupyterlab-settings").write_text(json.dumps(body))
    port = free_port()
    runtime = tmp / "runtime"
    env = {**os.environ, "JUPYTER_DATA_DIR": str(data), "JUPYTER_CONFIG_DIR": str(tmp / "config"),
           "JUPYTER_RUNTIME_DIR": str(runtime), "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"), "HOME": str(tmp), "JAX_PLATFORMS": "cpu"}
    log = tmp / "lab.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}", "--allow-root"],
        stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def api(method: str, path: str):
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
        # Token auth is on: without the token the API refuses.
        with pytest.raises(urllib.error.HTTPError) as refused:
            opener.open(f"{base}/api/contents", timeout=10)
        assert refused.value.code == 403
        yield base, stored_diagrams(json.loads(LESSON.read_text()))
    finally:
        try:
            for kernel in api("GET", "/api/kernels") or []:
                api("DELETE", f"/api/kernels/{kernel['id']}")
        except OSError:
            pass
        stop_process_group(proc, timeout=20)
        left = subprocess.run(["pgrep", "-f", str(runtime)], capture_output=True, text=True).stdout.split()
        for pid in left:  # a kernel the API did not stop (its command line names this test's runtime folder)
            os.kill(int(pid), 9)
        assert not left, f"processes left running after JupyterLab stopped: {left}"


# The outputs of the notebook on show (JupyterLab keeps the other tab's, hidden, in the page).
OUTPUTS = "[...document.querySelectorAll('.jp-OutputArea-output')].filter(o => o.getBoundingClientRect().width > 0)"
MEASURE = """() => """ + OUTPUTS + """
  .filter(o => o.querySelector('img, svg'))
  .map(o => {
    const pic = o.querySelector('img, svg'), box = o.getBoundingClientRect(), r = pic.getBoundingClientRect();
    return {kind: pic.tagName === 'IMG' ? (pic.getAttribute('src') || '').slice(0, 20) : 'inline svg',
            mime: o.getAttribute('data-mime-type'), area: Math.round(box.width), pic: Math.round(r.width),
            natural: pic.naturalWidth || null, overflowRight: Math.round(r.right - box.right),
            hidden: o.scrollWidth - o.clientWidth,
            loaded: pic.tagName !== 'IMG' || (pic.complete && pic.naturalWidth > 0)};
  })"""


@pytest.mark.timeout(300)
def test_lesson_04s_diagrams_are_not_clipped_in_jupyterlab_trusted_or_not(lab, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="the `playwright` package is not installed here")
    browser_path = chromium()
    if browser_path is None:
        pytest.skip("no Chromium here (Debian: apt-get install chromium; .ci/run installs it as root)")
    base, n_diagrams = lab
    assert n_diagrams >= 6, f"lesson 04 stores {n_diagrams} diagrams"
    shots = os.environ.get("COURSE_SCREENSHOTS")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, args=CHROMIUM_FLAGS, headless=True)
        try:
            for kind in ("trusted", "untrusted"):
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(f"{base}/lab/tree/{kind}/{LESSON.name}?reset&token={TOKEN}", timeout=120_000)
                page.locator(".jp-OutputArea-output img, .jp-OutputArea-output svg").first.wait_for(timeout=120_000)
                page.wait_for_function(f"{OUTPUTS}.length > 20 && "
                                       f"{OUTPUTS}.filter(o => o.querySelector('img, svg')).length >= {n_diagrams}",
                                       timeout=60_000)
                page.wait_for_timeout(500)
                pictures = page.evaluate(MEASURE)
                diagrams = [d for d in pictures if d["mime"] in ("image/svg+xml", "image/png") and d["area"] > 0]
                assert len(diagrams) >= n_diagrams, f"{kind}: {len(diagrams)} pictures shown, {n_diagrams} stored"
                want = "image/svg+xml" if kind == "trusted" else "image/png"
                shown_as = [d["mime"] for d in diagrams]
                assert shown_as.count(want) >= n_diagrams, f"{kind}: the diagrams show as {shown_as}"
                for d in diagrams:
                    assert d["loaded"], f"{kind}: a picture did not load: {d}"
                    assert d["overflowRight"] <= 1 and d["hidden"] <= 1, (
                        f"{kind}: a diagram {d['pic']} px wide is clipped in its {d['area']}-px output area: {d}")
                if shots:
                    pathlib.Path(shots).mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(pathlib.Path(shots) / f"lab_04_{kind}_top.png"))
                    cell = page.locator(".jp-CodeCell", has_text="perm=ring").last
                    cell.scroll_into_view_if_needed()
                    page.screenshot(path=str(pathlib.Path(shots) / f"lab_04_{kind}.png"))
                page.close()
        finally:
            browser.close()
