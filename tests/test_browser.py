"""A fresh clone opened in JupyterLab shows its stored diagrams as pictures before anything runs.

JupyterLab does not show stored SVG from an untrusted notebook, and a fresh clone is untrusted: it shows the PNG
stored beside each SVG. This opens notebook 00 of a fresh copy (untrusted: a Jupyter data dir of its own, with no
signatures) in headless Chromium, driven by Playwright, and looks at the stored device diagram before running a
cell. It needs the `chromium` system package (Debian: apt-get install chromium; .ci/run installs it as root) and
the `playwright` Python package; it downloads no browser.
"""

import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time

import pytest

from conftest import stop_process_group

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--disable-sync"]


def chromium() -> str | None:
    # chromium-browser last: on Ubuntu it may be a wrapper that only says to install the snap.
    for name in [os.environ.get("CHROMIUM", ""), "chromium", "google-chrome", "chromium-browser"]:
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fresh_lab(tmp_path):
    """JupyterLab on 127.0.0.1 over a fresh copy of the notebooks, trusting none of them; yields its URL."""
    pytest.importorskip("jupyterlab", reason="JupyterLab (the `lab` extra) is not installed here")
    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "notebooks", clone / "notebooks", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    port, token = free_port(), "browser-test-token"
    env = {**os.environ, "JUPYTER_DATA_DIR": str(tmp_path / "data"), "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "HOME": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={clone}", "--allow-root"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "lab.log", "w"), env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail("JupyterLab exited: " + (tmp_path / "lab.log").read_text()[-2000:])
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/lab/tree/notebooks/00_setup_and_devices.ipynb?token={token}"
    finally:
        stop_process_group(proc, timeout=20)


@pytest.mark.timeout(300)
def test_a_fresh_clone_shows_the_stored_diagram_as_a_picture_before_anything_runs(fresh_lab):
    sync_api = pytest.importorskip("playwright.sync_api", reason="the `playwright` package is not installed here")
    browser_path = chromium()
    if browser_path is None:
        pytest.skip("no Chromium here (Debian: apt-get install chromium; .ci/run installs it as root)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, args=CHROMIUM_FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(fresh_lab, timeout=120_000)
            # The diagram cell stores `diagrams.device_topology()`; find its output area.
            cell = page.locator(".jp-CodeCell", has_text="device_topology(").first
            cell.wait_for(timeout=120_000)
            cell.scroll_into_view_if_needed()
            output = cell.locator(".jp-OutputArea-output").first
            output.wait_for(timeout=60_000)
            # An untrusted notebook shows the stored PNG; the DOT source must not be what the learner sees.
            img = output.locator("img")
            try:
                img.first.wait_for(timeout=30_000)
            except sync_api.TimeoutError:
                pytest.fail(f"no picture in the stored diagram's output; it shows: {output.inner_text()[:300]!r}")
            assert img.first.get_attribute("src", timeout=10_000).startswith("data:image/png;base64,")
            size = img.first.evaluate("i => [i.naturalWidth, i.naturalHeight]")
            assert size[0] > 100 and size[1] > 50, f"the image did not load: {size}"
            text = output.inner_text()
            assert "digraph" not in text and "->" not in text, f"DOT text shown instead of the picture: {text[:200]}"
            # Nothing ran: the kernel has executed no cell in this page.
            assert "[*]" not in page.locator(".jp-InputPrompt").all_inner_texts()
        finally:
            browser.close()
