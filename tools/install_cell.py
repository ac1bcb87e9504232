"""The Colab/Kaggle install cell: one source for cell 1 of every notebook, its site tag and its folded display.

    python tools/install_cell.py --apply notebooks/*.ipynb   # make cell 1 of these notebooks the install cell
    python tools/install_cell.py --apply                     # the same, for every notebooks/NN_*.ipynb
    python tools/install_cell.py --check                     # exit 1 (naming them) if a notebook's cell 1 differs
    python tools/install_cell.py --print                     # show the cell
    python tools/install_cell.py [NOTEBOOK ...]              # as --apply (the older spelling)

The cell installs course_lib from the release tag ``v<course_lib.__version__>`` (the one place the pin lives;
tests/test_install_cell.py checks every notebook has this exact cell). It installs only on Colab or Kaggle, and
only where the preinstalled JAX meets the course's minimum: it never replaces a platform's JAX, jaxlib or
accelerator plugin. When it cannot install it raises a short error that stops "Run All" there and says why:
JAX missing or too old, no network (on Kaggle: Internet switched off in the settings), no such release tag, or
else pip's own error lines. Inside a notebook kernel pip writes in colour (ipykernel sets FORCE_COLOR), so the
cell drops the colour codes before it reads pip's words.

It is 27 lines of at most 100 characters, folded where the platform can fold it: its metadata
(``CELL_METADATA``) hides the code in JupyterLab (``jupyter.source_hidden``) and in Colab (``cellView: form``,
which shows the ``@title`` line), and tags it ``remove-cell`` (``SITE_TAGS``): the course's website (tools/site) leaves it out of the
lesson pages, where it does nothing; the notebooks keep it.
"""

import argparse
import json
import pathlib
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
REPOSITORY = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
MIN_JAX = (0, 11)
# Cell tags the website reads (myst-nb): the install cell is removed from the pages, kept in the notebooks.
SITE_TAGS = ["remove-cell"]
# Folded: JupyterLab shows a collapsed input (click to open), Colab a form with the @title line.
CELL_METADATA = {"jupyter": {"source_hidden": True}, "cellView": "form"}

# The cell's code, with @TAG@, @REPOSITORY@, @MIN@ and @MIN_TUPLE@ filled in by source(). Plain Python, no
# `%pip` magic: the magic only prints pip's failure and carries on; this raises.
TEMPLATE = r'''# @title Colab and Kaggle only: install course_lib @TAG@ (elsewhere ./course.sh has installed it)
# It keeps the platform's JAX (the course needs >= @MIN@). When it cannot install, it says why.
import os, re, subprocess, sys
from importlib.metadata import distributions
if "google.colab" in sys.modules or "KAGGLE_KERNEL_RUN_TYPE" in os.environ:
    jax = next((d.version for d in distributions(name="jax")), "no JAX")
    if tuple(int(p) for p in re.findall(r"\d+", jax)[:2]) < @MIN_TUPLE@:
        raise RuntimeError(f"This course needs JAX >= @MIN@; this runtime has {jax}. Upgrade JAX:\n"
                           '  %pip install -U "jax[cuda12]"  (GPU; "jax[tpu]": TPU; jax: CPU)\n'
                           "then restart the runtime (the kernel) and run this cell again.")
    print("installing course_lib @TAG@ ...")
    url = "@REPOSITORY@"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                          f"course_lib @ git+{url}@@TAG@"], capture_output=True, text=True)
    if pip.returncode != 0:
        said = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", pip.stderr + pip.stdout)  # no colour codes
        why = "pip failed"
        if re.search("unable to access|resolve host|connect to", said):
            on_kaggle = "KAGGLE_KERNEL_RUN_TYPE" in os.environ
            why = "no network" + (": turn Internet on in the notebook's settings" * on_kaggle)
        if "did not match any" in said:
            why = f"there is no release tag @TAG@ (see {url}/tags)"
        cause = [s.strip() for s in said.splitlines() if re.match(r"\s*(fatal|error|ERROR):", s)]
        cause = [s for s in cause if "subprocess-exited" not in s] or said.strip().splitlines()[-2:]
        raise RuntimeError(f"Could not install course_lib @TAG@: {why}.\npip said: "
                           + "\n  ".join(dict.fromkeys(cause)) + "\nThen run this cell again.")
    print("installed course_lib @TAG@")'''


def version() -> str:
    """course_lib's version, read from its source (without importing it)."""
    for line in (ROOT / "course_lib" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise RuntimeError("course_lib/__init__.py has no __version__ line")


def release_tag() -> str:
    """The git tag the install cell installs from: ``v`` + course_lib's version."""
    return f"v{version()}"


def source() -> str:
    """The cell's code."""
    return (TEMPLATE.replace("@TAG@", release_tag()).replace("@REPOSITORY@", REPOSITORY)
            .replace("@MIN_TUPLE@", repr(MIN_JAX)).replace("@MIN@", ".".join(map(str, MIN_JAX))))


def apply(path: pathlib.Path) -> bool:
    """Make cell 1 of the notebook at ``path`` the install cell, tagged for the site and folded; True if the file
    changed. Only cell 1 changes (its source, tags and folding); the rest of the file is kept as it is."""
    text = path.read_text()
    nb = json.loads(text)
    cells = nb.get("cells", [])
    if len(cells) < 2 or cells[1]["cell_type"] != "code":
        found = f"a {cells[1]['cell_type']} cell" if len(cells) >= 2 else f"{len(cells)} cell(s) in all"
        raise ValueError(f"{path}: cell 1 must be the install code cell (cell 0 the title), found {found}; "
                         "insert an empty code cell after the title, then run this again")
    cell = cells[1]
    cell["source"] = source().splitlines(keepends=True)
    metadata = cell.setdefault("metadata", {})
    tags = metadata.get("tags", [])
    metadata["tags"] = tags + [t for t in SITE_TAGS if t not in tags]
    for key, value in CELL_METADATA.items():
        metadata[key] = {**metadata.get(key, {}), **value} if isinstance(value, dict) else value
    new = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    if new != text:
        path.write_text(new)
        return True
    return False


def differs(path: pathlib.Path) -> str | None:
    """What is wrong with cell 1 of the notebook at ``path`` (None when it is the install cell as applied)."""
    cells = json.loads(path.read_text()).get("cells", [])
    if len(cells) < 2 or cells[1]["cell_type"] != "code":
        return "cell 1 is not a code cell"
    cell = cells[1]
    metadata = cell.get("metadata", {})
    if "".join(cell["source"]) != source():
        return "cell 1 is not the install cell"
    if not set(SITE_TAGS) <= set(metadata.get("tags", [])):
        return "the install cell lacks the tag that keeps it off the website"
    if any(metadata.get(k) != v and not (isinstance(v, dict) and v.items() <= metadata.get(k, {}).items())
           for k, v in CELL_METADATA.items()):
        return "the install cell is not folded"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--apply", action="store_true", help="write the cell into the notebooks (the default)")
    what.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook's cell differs")
    what.add_argument("--print", action="store_true", help="print the cell's code")
    ap.add_argument("notebooks", nargs="*", type=pathlib.Path,
                    help="default: every notebooks/NN_*.ipynb of this checkout")
    args = ap.parse_args(argv)
    if args.print:
        print(source())
        return 0
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        ap.error(f"no such notebook: {', '.join(missing)}")
    if args.check:
        wrong = [(p, why) for p in paths if (why := differs(p))]
        for p, why in wrong:
            print(f"{p}: {why}; run: python tools/install_cell.py --apply {p}", file=sys.stderr)
        return 1 if wrong else 0
    for p in paths:
        print(("updated " if apply(p) else "unchanged ") + str(p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
