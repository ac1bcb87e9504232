"""The course's website (./course.sh site, tools/site): built from the stored outputs of a clean copy, offline;
every lesson a page, in order (every notebooks/NN_*.ipynb: the lesson list is a glob, kept by no hand);
warnings are errors (planted broken links fail the build); and, in headless Chromium, every lesson page loads
with all its pictures, the search finds it, and previous/next lead on. At 390, 1024 and 1280 px the ☰ (lessons)
and ☷ (contents) buttons open their panels; at 1280 px the code and outputs of lessons 04, 10 and 12 fit their
column (a line over LINE_LIMIT characters scrolls inside its box), the landing page's code block is whole and
there is one search box; on a 390-px phone no page is wider than the screen; a search result opens at the match;
the contents list highlights the section being read; no page logs an error or misses a file (the favicon).

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
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(site.out))
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
    # net::ERR_ABORTED is a request the browser cancelled because the test moved on to the next page (the favicon,
    # fetched after "load", on a busy machine); a missing file still shows as its 404 response below.
    page.on("requestfailed", lambda req: req.failure == "net::ERR_ABORTED"
            or failed.append(f"{req.url} ({req.failure})"))
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


# --- the layout a learner sees, at a phone's, a small laptop's and a laptop's width ---------------------------

# The course keeps its own lines within about 100 characters (GUIDE.md); at 1280 px the column shows 130 of the
# site's monospace. A line longer than this scrolls inside its own box, deliberately; it is reported, not cut.
LINE_LIMIT = 120
WIDE_LESSONS = ["04_collectives", "10_sharded_state", "12_capstone_transformer"]

VISIBLE = """e => { const r = e.getBoundingClientRect(), s = getComputedStyle(e);
                   return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none'; }"""


def visible(page, selector: str):
    """The elements matching ``selector`` that a learner can see (laid out, not hidden)."""
    return [h for h in page.query_selector_all(selector) if h.evaluate(VISIBLE)]


def new_page(browser, width: int, errors: list):
    phone = width < 576
    context = browser.new_context(viewport={"width": width, "height": 860}, is_mobile=phone, has_touch=phone,
                                  device_scale_factor=2 if phone else 1)
    page = context.new_page()
    page.on("console", lambda m: m.type == "error" and errors.append(f"console: {m.text}"))
    page.on("pageerror", lambda e: errors.append(f"script error: {e}"))
    page.on("response", lambda r: r.status >= 400 and errors.append(f"{r.status} {r.url}"))
    return page


SIDEBAR_SHOWN = "() => getComputedStyle(document.getElementById('pst-primary-sidebar')).visibility === 'visible'"


def sidebar_shown(page) -> bool:
    """Whether the lesson list is beside the lesson (from 992 px; below, it is a dialog)."""
    page.wait_for_timeout(400)   # the fold is animated
    return page.evaluate(SIDEBAR_SHOWN)


def wait_sidebar(page, shown: bool) -> None:
    page.wait_for_function(SIDEBAR_SHOWN if shown else f"() => !({SIDEBAR_SHOWN})()", timeout=5000)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("width", [390, 1024, 1280])
def test_in_a_browser_the_lesson_list_and_contents_buttons_open_their_panels(site, served, browser, width):
    """Both themes bind the ☰ and ☷ handlers to a hidden duplicate of each button (course.js passes the click
    on): below 992 px each opens its panel as a dialog; from 992 px ☰ folds the lesson list away and back (it
    starts folded below 1280 px)."""
    errors = []
    page = new_page(browser, width, errors)
    try:
        page.goto(f"{served}notebooks/12_capstone_transformer.html", wait_until="load")
        lessons = visible(page, ".primary-toggle")
        contents = visible(page, ".secondary-toggle")
        assert len(lessons) == 1 and len(contents) == 1, f"{width} px: {len(lessons)} ☰ and {len(contents)} ☷ shown"
        sidebar = page.locator("#pst-primary-sidebar")
        if width < 992:
            assert not sidebar.evaluate(VISIBLE), "the lesson list shows before ☰ is pressed"
            lessons[0].click()
            dialog = page.locator("#pst-primary-sidebar-modal")
            dialog.locator("a", has_text="00 · Setup").wait_for(state="visible", timeout=5000)
            assert dialog.evaluate("d => d.open"), "☰ did not open the lesson list"
            dialog.locator("a", has_text="11 · ").click()            # and a lesson in it opens
            page.wait_for_url("**/11_checkpoints_and_profiles.html")
            page.go_back(wait_until="load")
        else:
            # From 1280 px the lesson list starts beside the lesson; below, folded (the code needs the room).
            # ☰ folds it away and back either way.
            shown_first = width >= 1280
            assert sidebar_shown(page) == shown_first, f"{width} px: the lesson list starts " + \
                ("folded" if shown_first else "beside the lesson")
            lessons[0].click()
            wait_sidebar(page, not shown_first)
            visible(page, ".primary-toggle")[0].click()
            wait_sidebar(page, shown_first)
        # ☷: the page's contents, as a dialog (below 1600 px they are not beside the lesson: the code needs the room)
        visible(page, ".secondary-toggle")[0].click()
        toc = page.locator("#pst-secondary-sidebar-modal")
        toc.locator("a", has_text="The decision rule").wait_for(state="visible", timeout=5000)
        toc.locator("a", has_text="The decision rule").click()
        page.wait_for_function("() => location.hash.includes('decision')", timeout=5000)
        assert not toc.evaluate("d => d.open"), "choosing a section closes the contents"
        heading = page.locator("h2", has_text="The decision rule")
        top = heading.evaluate("h => h.getBoundingClientRect().top")
        assert 0 <= top < 300, f"the section is not on screen after choosing it ({top:.0f} px)"
        # The page itself never scrolls sideways: wide code scrolls inside its own box.
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"at {width} px the page is {overflow} px wider than the screen"
        assert errors == [], errors
    finally:
        page.context.close()


CELL_WIDTHS = """() => {
  const column = document.querySelector('article.bd-article').getBoundingClientRect();
  const longest = e => Math.max(...e.textContent.split('\\n').map(l => l.length));
  return [...document.querySelectorAll('div.cell_input pre, div.cell_output pre')].map(p => {
    const box = p.getBoundingClientRect();
    return {kind: p.closest('.cell_input') ? 'code' : 'output', longest: longest(p), start: p.textContent.slice(0, 50),
            left: box.left - column.left, right: box.right - column.right, hidden: p.scrollWidth - p.clientWidth,
            scrolls: ['auto', 'scroll'].includes(getComputedStyle(p).overflowX)};
  });
}"""


@pytest.mark.timeout(300)
def test_in_a_browser_code_and_outputs_fit_the_column_at_1280_px_and_the_phone_page_fits_390_px(site, served,
                                                                                                 browser):
    errors, report = [], []
    page = new_page(browser, 1280, errors)
    try:
        column = None
        for name in WIDE_LESSONS:
            page.goto(f"{served}notebooks/{name}.html", wait_until="load")
            column = page.evaluate("document.querySelector('article.bd-article').clientWidth")
            cells = page.evaluate(CELL_WIDTHS)
            assert len(cells) > 20, f"{name}: only {len(cells)} code cells and outputs found"
            for c in cells:
                where = f"{name}: {c['kind']} {c['start']!r}"
                assert c["left"] >= -1 and c["right"] <= 1, f"{where} is wider than its column: {c}"
                if c["longest"] <= LINE_LIMIT:
                    assert c["hidden"] <= 1, f"{where}: {c['hidden']} px cut at the right at 1280 px (column " \
                                             f"{column} px, longest line {c['longest']} characters)"
                else:
                    assert c["scrolls"], f"{where}: a {c['longest']}-character line, not scrollable"
                    report.append(f"{name}: {c['kind']} with a {c['longest']}-character line scrolls: "
                                  f"{c['start']!r}")
        assert column >= 900, f"the lesson column is {column} px at 1280 px"
        # The landing page's code block is whole too.
        page.goto(f"{served}index.html", wait_until="load")
        hidden = page.evaluate("Math.max(...[...document.querySelectorAll('article pre')]"
                               ".map(p => p.scrollWidth - p.clientWidth))")
        assert hidden <= 1, f"the landing page's code block is cut by {hidden} px"
        # One search box, not two.
        assert len(visible(page, ".search-button, .search-button-field")) == 1
        assert errors == [], errors
    finally:
        page.context.close()
    print("\n".join(report) or "no line longer than the limit")
    errors = []
    phone = new_page(browser, 390, errors)
    try:
        for nb in NOTEBOOKS:
            phone.goto(f"{served}notebooks/{nb.stem}.html", wait_until="load")
            width = phone.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, f"{nb.name}: on a 390-px phone the page is {width} px wide"
            # Code keeps its lines on a phone and scrolls inside its box.
            assert phone.evaluate("[...document.querySelectorAll('div.cell_input pre')].every("
                                  "p => getComputedStyle(p).whiteSpace === 'pre' && "
                                  "getComputedStyle(p).overflowX === 'auto')"), nb.name
        assert errors == [], errors
    finally:
        phone.context.close()


@pytest.mark.timeout(300)
def test_in_a_browser_a_search_result_opens_at_the_match_and_the_contents_follow_the_reading(site, served,
                                                                                              browser):
    errors = []
    page = new_page(browser, 1680, errors)
    try:
        page.goto(f"{served}search.html?q=all_gather", wait_until="load")
        result = page.locator("#search-results ul.search li a", has_text="12 ·").first   # far down the page
        result.wait_for(timeout=60_000)
        result.click()
        page.wait_for_url("**/12_capstone_transformer.html*")
        match = page.locator("article span.highlighted").first
        match.wait_for(timeout=10_000)
        page.wait_for_function("() => { const m = document.querySelector('article span.highlighted');"
                               "const r = m.getBoundingClientRect(); return r.top >= 0 && r.bottom <= innerHeight; }",
                               timeout=10_000)
        assert page.evaluate("window.scrollY") > 500, "the page stayed at its top"
        # The contents list (beside the lesson at 1680 px) highlights the section being read: with section A's
        # heading just above the reading line and the next heading B in the top third of the window, A.
        page.goto(f"{served}notebooks/12_capstone_transformer.html", wait_until="load")
        links = page.locator("#pst-page-toc-nav a.nav-link")
        assert links.count() > 5 and links.first.evaluate(VISIBLE)
        sections = page.evaluate("""() => [...document.querySelectorAll('#pst-page-toc-nav > ul > li > a')]
            .map(a => document.getElementById(decodeURIComponent(a.getAttribute('href').slice(1))))
            .map(s => s.querySelector('h2'))
            .map(h => [h.textContent.replace('#', '').trim(), h.getBoundingClientRect().top + scrollY])""")
        checked = 0
        for k, ((a, top_a), (b, top_b)) in enumerate(zip(sections, sections[1:])):
            if top_b - top_a < 400:
                continue
            # B's heading 200 px below the top of the window: A's text (or one of its subsections) fills the
            # screen above it. The highlighted entry is A or one of A's subsections, not B.
            page.evaluate(f"window.scrollTo(0, {top_b - 200})")
            page.wait_for_timeout(400)
            active = page.locator("#pst-page-toc-nav a.nav-link.active").all_inner_texts()
            inside = page.evaluate(f"""() => {{ const li = document.querySelectorAll('#pst-page-toc-nav > ul > li')[{k}];
                return [...document.querySelectorAll('#pst-page-toc-nav a.nav-link.active')].every(a => li.contains(a)); }}""")
            assert active and inside, f"reading {a!r} (and {b!r} below), it highlights {active}"
            checked += 1
        assert checked >= 3
        assert errors == [], errors
    finally:
        page.context.close()


# --- reading width on a tablet and a small laptop (issue 43): no code cell cut -----------------------------------

# Each code box and text output on the page: whether it hides anything at its right (scrollWidth over
# clientWidth), how it wraps, its longest line, and how many characters of the code font fit on one line.
READING = """() => {
  const pres = [...document.querySelectorAll('div.cell_input pre, div.cell_output pre')];
  const longest = e => Math.max(...e.textContent.split('\\n').map(l => l.length));
  const first = document.querySelector('div.cell_input pre');
  const probe = document.createElement('span');
  probe.textContent = 'x'.repeat(100);
  first.appendChild(probe);
  const charWidth = probe.getBoundingClientRect().width / 100;
  probe.remove();
  const cs = getComputedStyle(first);
  const inner = first.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
  return {
    column: document.querySelector('article.bd-article').clientWidth,
    fits: Math.floor(inner / charWidth),
    cells: pres.map(p => ({kind: p.closest('.cell_input') ? 'code' : 'output', start: p.textContent.slice(0, 50),
                           hidden: p.scrollWidth - p.clientWidth, longest: longest(p),
                           wraps: getComputedStyle(p).whiteSpace === 'pre-wrap'})),
  };
}"""

# Characters of code a box shows on one line, unwrapped, at 768 and 1024 px (measured: 100 at 768 px, where the
# theme's font is a little smaller, and 119 at 1024 px with the lesson list folded). The lessons keep their
# code lines within 80 (a tablet in portrait, JupyterLab with its file browser open), well inside it.
CODE_FITS = 100


@pytest.mark.timeout(600)
@pytest.mark.parametrize("width", [768, 1024])
def test_in_a_browser_no_code_cell_or_output_is_cut_at_768_and_1024_px(site, served, browser, width):
    """On a tablet (768 px) and a small laptop (1024 px, where the lesson list starts folded) no code cell and no
    output of any lesson hides text at its right edge: a line longer than its box wraps (prose outputs at
    spaces), and a box holds at least CODE_FITS characters of code on one line. Lines that wrap are listed."""
    errors, report = [], []
    page = new_page(browser, width, errors)
    try:
        for nb in NOTEBOOKS:
            page.goto(f"{served}notebooks/{nb.stem}.html", wait_until="load")
            page.wait_for_timeout(400)   # the lesson list's fold is animated
            got = page.evaluate(READING)
            assert got["fits"] >= CODE_FITS, f"{nb.name} at {width} px: a code box holds {got['fits']} " \
                                             f"characters on a line (column {got['column']} px)"
            assert len(got["cells"]) > 5, f"{nb.name}: only {len(got['cells'])} code cells and outputs found"
            for c in got["cells"]:
                where = f"{nb.name} at {width} px: {c['kind']} {c['start']!r}"
                assert c["hidden"] <= 1, f"{where} is cut: {c['hidden']} px hidden at its right"
                if c["longest"] > got["fits"]:
                    assert c["wraps"], f"{where}: a {c['longest']}-character line does not wrap"
                    report.append(f"{where}: a {c['longest']}-character line wraps (a line holds {got['fits']})")
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, f"{nb.name}: at {width} px the page is {overflow} px wider than the screen"
        assert errors == [], errors
    finally:
        page.context.close()
    print("\n".join(report) or f"at {width} px no line wraps")


@pytest.mark.timeout(300)
def test_in_a_browser_the_lesson_lists_fold_at_1024_px_is_remembered_from_lesson_to_lesson(site, served, browser):
    errors = []
    page = new_page(browser, 1024, errors)
    try:
        page.goto(f"{served}notebooks/{NOTEBOOKS[0].stem}.html", wait_until="load")
        assert not sidebar_shown(page), "at 1024 px the lesson list does not start folded"
        folded_column = page.evaluate("document.querySelector('article.bd-article').clientWidth")
        assert folded_column >= 900, f"folded, the column is only {folded_column} px"
        visible(page, ".primary-toggle")[0].click()
        wait_sidebar(page, True)
        page.locator("a.right-next").click()                        # the next lesson keeps it shown
        page.wait_for_load_state("load")
        assert sidebar_shown(page), "the lesson list shown with ☰ folded again on the next lesson"
        visible(page, ".primary-toggle")[0].click()
        wait_sidebar(page, False)
        page.locator("a.right-next").click()                        # and folded again, folded
        page.wait_for_load_state("load")
        assert not sidebar_shown(page), "the lesson list folded with ☰ came back on the next lesson"
        assert errors == [], errors
    finally:
        page.context.close()
