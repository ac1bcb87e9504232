"""Build the course's website from the notebooks' stored outputs: ``./course.sh site [--serve] [--out DIR]``.

    python tools/site/build.py                 # build into build/site/html (git-ignored)
    python tools/site/build.py --serve         # build, then serve it on http://127.0.0.1:8000 (Ctrl-C stops)
    python tools/site/build.py --serve --no-build   # serve what is already built
    python tools/site/build.py --root DIR      # build the notebooks of another checkout (the tests use this)

It executes nothing: Sphinx with myst-nb renders the outputs stored in ``notebooks/*.ipynb`` (nbval checks that
they are what the code prints today), with sphinx-book-theme. The sources are staged in ``<out>/../src``: this
folder's ``index.md`` (landing page and lesson list) and a copy of every notebook. Warnings are errors: a broken
link or cross-reference, a missing or remote image, or a notebook missing from the lesson list fails the build.
"""

import argparse
import functools
import http.server
import pathlib
import shutil
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def stage(root: pathlib.Path, src: pathlib.Path) -> list[pathlib.Path]:
    """Fill ``src`` with the landing page, a copy of every notebook of ``root`` and of the notes beside them
    (``notebooks/*.md``); return the notebooks copied."""
    if src.exists():
        shutil.rmtree(src)
    (src / "notebooks").mkdir(parents=True)
    shutil.copy2(HERE / "index.md", src / "index.md")
    notebooks = sorted((root / "notebooks").glob("*.ipynb"))
    if not notebooks:
        sys.exit(f"no notebooks in {root / 'notebooks'}")
    for nb in notebooks:
        shutil.copy2(nb, src / "notebooks" / nb.name)
    # The notes the lessons cite beside them (notebooks/hardware.md): pages of their own, reached from the
    # lessons' links. Staged as orphans (Sphinx front matter), so that they stay out of the lesson list and of
    # the previous/next chain, which runs from the landing page through the lessons only.
    for note in sorted((root / "notebooks").glob("*.md")):
        text = note.read_text()
        if text.startswith("---\n"):
            text = "---\norphan: true\n" + text[len("---\n"):]
        else:
            text = "---\norphan: true\n---\n\n" + text
        (src / "notebooks" / note.name).write_text(text)
    return notebooks


def build(root: pathlib.Path, out: pathlib.Path, quiet: bool = True) -> int:
    """Stage and build; Sphinx's exit status (0 when the site was built with no warning)."""
    work = out.parent
    src, doctrees = work / "src", work / "doctrees"
    notebooks = stage(root, src)
    for d in (out, doctrees):  # a full build every time: a warning in any page fails it, and no stale page stays
        if d.exists():
            shutil.rmtree(d)
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-c", str(HERE), "-d", str(doctrees),
           "-W", "--keep-going", "-E", "-j", "auto", *(["-q"] if quiet else []), str(src), str(out)]
    start = time.monotonic()
    r = subprocess.run(cmd)
    if r.returncode == 0:
        print(f"[site] built {len(notebooks)} lessons into {out} in {time.monotonic() - start:.0f} s", file=sys.stderr)
    else:
        print(f"[site] error: the build failed (warnings are errors: see above). Sources staged in {src}",
              file=sys.stderr)
    return r.returncode


def serve(out: pathlib.Path, port: int) -> None:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as httpd:
        print(f"[site] serving {out} on http://127.0.0.1:{httpd.server_address[1]}/ (Ctrl-C stops)", file=sys.stderr)
        try:
            httpd.serve_forever()
        except KeyboardInterrupt:
            pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=pathlib.Path, default=ROOT, help="the checkout whose notebooks/ to build")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "build" / "site" / "html",
                    help="where the HTML goes (default build/site/html; sources and doctrees go beside it)")
    ap.add_argument("--serve", action="store_true", help="after building, serve the site on 127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="the port for --serve (default 8000)")
    ap.add_argument("--no-build", action="store_true", help="with --serve: serve what is already built")
    ap.add_argument("--verbose", action="store_true", help="show Sphinx's progress")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    if args.no_build:
        if not (out / "index.html").exists():
            ap.error(f"--no-build: nothing built in {out} yet; run without --no-build first")
    else:
        status = build(args.root.resolve(), out, quiet=not args.verbose)
        if status != 0:
            return status
    if args.serve:
        serve(out, args.port)
    else:
        print(f"[site] open {out / 'index.html'}, or preview it with:\n"
              f"  python3 -m http.server --bind 127.0.0.1 --directory {out} 8000", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
