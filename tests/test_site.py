"""The course's website (./course.sh site, tools/site): built from the stored outputs of a clean copy, offline;
every lesson a page, in order; warnings are errors (planted broken links fail the build); and, in headless
Chromium, every lesson page loads with all its pictures, the search finds it, and previous/next lead on.

The browser part needs the `chromium` system package and the `playwright` Python package (it downloads no
browser); without them it skips and says so. The build needs the `site` extra, which ./course.sh installs.
"""

import functools
import http.server
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import pytest

pytest.importorskip("myst_nb", reason="the `site` extra (Sphinx, myst-nb) is not installed; ./course.sh installs it")
pytest.importorskip("sphinx_book_theme", reason="the `site` extra is not installed; ./course.sh installs it")
bs4 = pytest.importorskip("bs4")

from conftest import stop_process_group  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUILD = ROOT / "tools" / "site" / "build.py"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
REPOSITORY = "https://github.com/spmd-jax-course/spmd-jax-course"
# Any attempt to reach the network goes to a closed port on this machine, and fails.
OFFLINE = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
           "HTTPS_PROXY": "http://127.0.0.1:9", "no_proxy": "", "NO_PROXY": ""}


def checkout_files() -> list[str]:
    """The files a clone of this checkout has (tracked, and new ones git does not ignore)."""
    r = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"not a git checkout, so there is no clean copy to build from: {r.stderr.strip()}")
    return [f for f in r.stdout.split("\0") if f and (ROOT / f).is_file()]


def build(root: pathlib.Path, out: pathlib.Path, script: pathlib.Path = BUILD) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), "--root", str(root), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, **OFFLINE})


class Site:
    def __init__(self, out: pathlib.Path, seconds: float, result: subprocess.CompletedProcess):
        self.out, self.seconds, self.result = out, seconds, result

    def page(self, nb: pathlib.Path) -> pathlib.Path:
        return self.out / "notebooks" / (nb.stem + ".html")

    def soup(self, path: pathlib.Path):
        return bs4.BeautifulSoup(path.read_text(), "html.parser")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Site:
    """The site built by the build script of a clean copy of this checkout (no .venv, no build/), offline."""
    clone = tmp_path_factory.mktemp("clone")
    for f in checkout_files():
        (clone / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, clone / f)
    out = tmp_path_factory.mktemp("site") / "html"
    start = time.monotonic()
    result = build(clone, out, script=clone / "tools" / "site" / "build.py")
    seconds = time.monotonic() - start
    assert result.returncode == 0, f"the site did not build:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    print(f"site built in {seconds:.1f} s")
    return Site(out, seconds, result)


def source(cell) -> str:
    return "".join(cell["source"])


def markdown_text(nb: pathlib.Path) -> str:
    """The prose of a notebook (markdown cells, fenced code blocks left out)."""
    cells = json.loads(nb.read_text())["cells"]
    text = "\n".join(source(c) for c in cells if c["cell_type"] == "markdown")
    return re.sub(r"```.*?```", "", text, flags=re.S)


def headings(nb: pathlib.Path) -> list[str]:
    return [re.sub(r"[`*]", "", m) for m in re.findall(r"^#{2,3} (.+)$", markdown_text(nb), flags=re.M)]


def title(nb: pathlib.Path) -> str:
    return re.search(r"^# (.+)$", markdown_text(nb), flags=re.M).group(1).replace("`", "")


def norm(s: str) -> str:
    return re.sub(r"\W+", "", s).lower()


# --- the build ------------------------------------------------------------------------------------------------

def test_the_site_builds_from_a_clean_copy_offline_with_every_lesson_a_page(site):
    assert "warning" not in site.result.stderr.lower(), site.result.stderr
    assert f"built {len(NOTEBOOKS)} lessons" in site.result.stderr
    for nb in NOTEBOOKS:
        assert site.page(nb).exists(), f"no page for {nb.name}"
    # The issue asks for under a minute on 2 cores (about 10-15 s here when the machine is quiet); the bound
    # leaves room for a machine shared with other jobs.
    assert site.seconds < 180, f"the build took {site.seconds:.0f} s"


def test_the_landing_page_says_what_who_and_how_and_lists_every_lesson_in_order(site):
    soup = site.soup(site.out / "index.html")
    text = soup.get_text()
    for words in ["Who it is for", "How to run it", "./course.sh lab", "./course.sh test", "Binder", "Colab",
                  "Kaggle", "8 simulated CPU devices"]:
        assert words in text, f"the landing page does not say {words!r}"
    article = soup.select_one("article")
    lessons = [a["href"] for a in article.select(".toctree-wrapper a.reference.internal")]
    assert lessons == [f"notebooks/{nb.stem}.html" for nb in NOTEBOOKS]
    assert f'href="{REPOSITORY}"' in str(article), "the repository link follows pyproject's URL"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_each_lesson_page_has_its_headings_launch_buttons_download_and_pictures(site, nb):
    soup = site.soup(site.page(nb))
    toc = norm(soup.select_one("#pst-page-toc-nav").get_text(" "))
    missing = [h for h in headings(nb) if norm(h) not in toc]
    assert not missing, f"{nb.name}: headings missing from the page's table of contents: {missing}"
    links = {a.get("href") for a in soup.select("a")}
    path = f"notebooks/{nb.name}"
    for url in [f"https://mybinder.org/v2/gh/spmd-jax-course/spmd-jax-course/main?urlpath=lab/tree/{path}",
                f"https://colab.research.google.com/github/spmd-jax-course/spmd-jax-course/blob/main/{path}",
                f"https://kaggle.com/kernels/welcome?src={REPOSITORY}/blob/main/{path}"]:
        assert url in links, f"{nb.name}: no launch button to {url}"
    download = site.out / "_sources" / "notebooks" / nb.name
    assert f"../_sources/notebooks/{nb.name}" in links and download.read_bytes() == nb.read_bytes()
    # The install cell is hidden on the page (a cell tag), kept in the notebook that the button downloads.
    assert "Colab and Kaggle only: install course_lib" not in soup.get_text()
    assert "Colab and Kaggle only: install course_lib" in download.read_text()
    # Every stored picture is shown as a picture, from a file of the site; no remote picture (the badges).
    cells = json.loads(nb.read_text())["cells"]
    pictures = sum(1 for c in cells if c["cell_type"] == "code" for o in c["outputs"]
                   if {"image/svg+xml", "image/png"} & set(o.get("data", {})))
    images = [img["src"] for img in soup.select("article img")]
    assert len(images) >= pictures, f"{nb.name}: {pictures} stored pictures, {len(images)} on the page"
    for src in images:
        assert "://" not in src and (site.page(nb).parent / src).resolve().is_file(), f"{nb.name}: {src}"


def tiny_notebook(title: str, body: str) -> dict:
    """A small lesson notebook as the course writes them: title, install cell (tagged), a section, an output."""
    code = lambda src, out=(), tags=(): {"cell_type": "code", "execution_count": 1, "metadata": {"tags": list(tags)},
                                         "outputs": list(out), "source": [src]}
    return {"cells": [
        {"cell_type": "markdown", "metadata": {}, "source": [f"# {title}\n\n[![Open In Colab](https://colab.research"
                                                             ".google.com/assets/colab-badge.svg)](https://colab.rese"
                                                             "arch.google.com/github/o/r/blob/main/x.ipynb)"]},
        code("# install cell", tags=["remove-cell"]),
        {"cell_type": "markdown", "metadata": {}, "source": [f"## 1. Section one\n\n{body}"]},
        code("print('wide ' * 60)", out=[{"output_type": "stream", "name": "stdout", "text": ["wide " * 60]}])],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                     "language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}


def tiny_site(tmp_path, plant: str = "", extra: dict | None = None) -> subprocess.CompletedProcess:
    """Build two tiny lessons that link to each other correctly, with ``plant`` added to the second one's prose
    and ``extra`` notebooks beside them."""
    root = tmp_path / "root"
    (root / "notebooks").mkdir(parents=True)
    notebooks = {"00_first.ipynb": tiny_notebook("00 · First", "Text. [Section one](#1.-Section-one)."),
                 "01_second.ipynb": tiny_notebook("01 · Second", f"See [lesson 00](00_first.ipynb), [its section 1](00_first.ipynb#1.-Section-one). {plant}"),
                 **(extra or {})}
    for name, nb in notebooks.items():
        (root / "notebooks" / name).write_text(json.dumps(nb))
    return build(root, tmp_path / "out" / "html")


# Each planted fault, and the words the build's error output must name it by.
# Heading links use JupyterLab's anchors (the heading's text, spaces as hyphens), as the notebooks do.
PLANTS = {"a link to a heading that does not exist": ("[see](#No-such-section)", "No-such-section"),
          "a link to a heading of another lesson that does not exist": ("[see](00_first.ipynb#2.-Nothing)",
                                                                        "2.-Nothing"),
          "a link to a lesson that does not exist": ("[next lesson](02_missing.ipynb)", "02_missing"),
          "a missing image": ("![the diagram](missing_diagram.png)", "missing_diagram.png"),
          "a remote image": ("![remote](https://example.com/picture.png)", "remote image"),
          "a notebook missing from the lesson list": ("", "scratch")}


def test_planted_faults_fail_the_build_each_named_and_correct_links_pass(tmp_path):
    """One build of two tiny lessons with every fault planted (Sphinx goes on after the first warning and reports
    them all): it fails, names each fault, and says nothing about the correct links beside them."""
    plants = " ".join(plant for plant, _ in PLANTS.values())
    r = tiny_site(tmp_path, plants, {"scratch.ipynb": tiny_notebook("Scratch", "Not a lesson.")})
    assert r.returncode != 0, "the build passed with faults planted"
    assert "[site] error: the build failed" in r.stderr
    for fault, (_, says) in PLANTS.items():
        assert says in r.stderr, f"{fault} is not reported:\n{r.stderr}"
    assert "1.-Section-one" not in r.stderr and "'00_first.ipynb'" not in r.stderr, "a correct link was reported"
    warnings = [line for line in r.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    assert len(warnings) == len(PLANTS), "one warning per fault, none for the rest:\n" + "\n".join(warnings)


def test_course_sh_site_is_wired_and_serves_on_localhost_only(site):
    r = subprocess.run([str(ROOT / "course.sh"), "site", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--serve" in r.stdout, r.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(BUILD), "--out", str(site.out), "--serve", "--no-build",
                             "--port", str(port)], stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stderr.readline()
        assert f"http://127.0.0.1:{port}/" in line
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://127.0.0.1:{port}/notebooks/{NOTEBOOKS[0].stem}.html", timeout=10) as resp:
            assert resp.status == 200
        from test_course_script import non_loopback_address
        addr = non_loopback_address()
        if addr:
            with pytest.raises(OSError):
                socket.create_connection((addr, port), timeout=3).close()
    finally:
        stop_process_group(proc, timeout=10)


# --- in a browser ---------------------------------------------------------------------------------------------

def search_terms() -> dict[str, str]:
    """For each lesson, a word of its prose that no other lesson (nor the landing page) uses: the search for it
    must find that lesson. The lesson's most frequent such word."""
    words = {nb.name: re.findall(r"[A-Za-z]{7,}", markdown_text(nb).lower()) for nb in NOTEBOOKS}
    everything = {nb.name: nb.read_text().lower() for nb in NOTEBOOKS}
    landing = (ROOT / "tools" / "site" / "index.md").read_text().lower()
    terms = {}
    for name, ws in words.items():
        unique = [w for w in ws if w not in landing and all(w not in t for n, t in everything.items() if n != name)]
        assert unique, f"{name}: no word of its own to search for"
        terms[name] = max(set(unique), key=lambda w: (unique.count(w), w))
    return terms


@pytest.fixture(scope="module")
def served(site):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site.out))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="the `playwright` package is not installed here")
    from test_browser import CHROMIUM_FLAGS, chromium
    path = chromium()
    if path is None:
        pytest.skip("no Chromium here (Debian: apt-get install chromium; .ci/run installs it as root)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=CHROMIUM_FLAGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.mark.timeout(600)
def test_in_a_browser_every_lesson_loads_with_its_pictures_is_found_by_search_and_links_on(site, served,
                                                                                           browser):
    terms = search_terms()
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    failed, foreign = [], []
    page.on("requestfailed", lambda req: failed.append(f"{req.url} ({req.failure})"))
    page.on("response", lambda resp: resp.status >= 400 and failed.append(f"{resp.url} ({resp.status})"))
    page.on("request", lambda req: req.url.startswith(served) or req.url.startswith("data:")
            or foreign.append(req.url))
    pages = [served + "index.html"] + [f"{served}notebooks/{nb.stem}.html" for nb in NOTEBOOKS]
    try:
        for i, nb in enumerate(NOTEBOOKS, start=1):
            url = pages[i]
            resp = page.goto(url, wait_until="load")
            assert resp.status == 200, url
            assert norm(page.locator("article h1").first.inner_text()) == norm(title(nb))
            # Every picture loads (lazy ones are asked for now).
            broken = page.evaluate("""async () => {
                const imgs = [...document.images];
                imgs.forEach(i => { i.loading = "eager"; });
                await Promise.all(imgs.map(i => i.complete ? null : new Promise(r => { i.onload = i.onerror = r; })));
                return imgs.filter(i => !(i.naturalWidth > 0)).map(i => i.getAttribute("src"));
            }""")
            assert broken == [], f"{nb.name}: pictures that did not load: {broken}"
            # Wide outputs scroll inside their box: the page itself never scrolls sideways.
            overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert overflow <= 0, f"{nb.name}: the page is {overflow} px wider than the window"
            # Previous and next lead to the neighbouring lessons (the first lesson's previous is the landing page);
            # each lesson's own title is checked when it is visited, so the chain is checked end to end.
            prev = page.locator("a.left-prev")
            assert urllib.parse.urljoin(url, prev.get_attribute("href")) == pages[i - 1], f"{nb.name}: previous"
            nxt = page.locator("a.right-next")
            if i + 1 < len(pages):
                assert urllib.parse.urljoin(url, nxt.get_attribute("href")) == pages[i + 1], f"{nb.name}: next"
            else:
                assert nxt.count() == 0, "the last lesson has no next page"
            if i == 1:  # and a click follows them
                nxt.click()
                page.wait_for_load_state("load")
                assert page.url == pages[2] and norm(page.locator("article h1").first.inner_text()) == \
                    norm(title(NOTEBOOKS[1]))
                page.locator("a.left-prev").click()
                page.wait_for_load_state("load")
                assert page.url == pages[1]
            # The search finds this lesson from a word only it uses.
            term = terms[nb.name]
            page.goto(f"{served}search.html?q={urllib.parse.quote(term)}", wait_until="load")
            page.locator("#search-results .search-summary").wait_for(timeout=60_000)
            found = [urllib.parse.urljoin(page.url, a.get_attribute("href")).split("?")[0].split("#")[0]
                     for a in page.locator("#search-results ul.search li a").all()]
            assert url in found, f"searching {term!r} (a word only {nb.name} uses) found {found}"
        assert failed == [], f"requests that failed: {failed[:10]}"
        assert foreign == [], f"the site asked another host for: {sorted(set(foreign))[:10]}"
    finally:
        page.close()
