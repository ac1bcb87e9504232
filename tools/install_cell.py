"""The Colab/Kaggle install cell and the launch buttons: one git ref, from one place, for cell 1 of every notebook,
the notebooks' Colab and Kaggle badges and README's Binder badge (the website's buttons read the same ref).

    python tools/install_cell.py --apply        # every notebooks/NN_*.ipynb: cell 1 and the badges; README's badge
    python tools/install_cell.py --apply notebooks/13_*.ipynb   # only the notebooks named (README untouched)
    python tools/install_cell.py --check        # exit 1 (naming them) if a notebook's cell 1 or badges differ
    python tools/install_cell.py --print [NOTEBOOK]   # show the cell (lesson 13's variant for lesson 13)
    python tools/install_cell.py [NOTEBOOK ...] # as --apply (the older spelling)

The ref is ``[tool.course] ref`` in pyproject.toml (``REF``): ``main`` on main, so that a notebook opened from main
installs main's course_lib; a release may set its tag ``v<version>`` (``./course.sh release-check`` then requires
the tag to exist). The cell's title names the ref, so a notebook that installs another commit's course_lib says so.
The cell installs only on Colab or Kaggle, and only where the preinstalled JAX meets the course's minimum: it never
replaces a platform's JAX, jaxlib or accelerator plugin. Lesson 13's variant (``TPU_LESSONS``) also installs, on
Linux x86-64 where it is missing, the libtpu that the runtime's JAX pins (its ``tpu`` extra; else the course's
pin): lesson 13's TPU compiler. When it cannot install it raises a short error that stops "Run All" there and says
why: JAX missing or too old, no network (on Kaggle: Internet switched off in the settings), no such branch or tag,
or else pip's own error lines. Inside a notebook kernel pip writes in colour (ipykernel sets FORCE_COLOR), so the
cell drops the colour codes before it reads pip's words.

It is at most 42 lines (lesson 13's 53) of at most 80 characters, folded where the platform can fold it: its
metadata (``CELL_METADATA``) hides the code in JupyterLab (``jupyter.source_hidden``) and in Colab (``cellView:
form``, which shows the ``@title`` line), and tags it ``remove-cell`` (``SITE_TAGS``): the course's website
(tools/site) leaves it out of the lesson pages, where it does nothing; the notebooks keep it.
"""

import argparse
import json
import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
REPOSITORY = PYPROJECT["project"]["urls"]["Repository"]  # https://github.com/<org>/<repo>
REPO = REPOSITORY.removeprefix("https://github.com/")
# The one git ref: what the install cell installs and every launch button opens.
REF = PYPROJECT["tool"]["course"]["ref"]
MIN_JAX = (0, 11)
# Lessons whose install cell also brings lesson 13's TPU compiler (by file-name prefix).
TPU_LESSONS = ("13_",)
# The course's own libtpu pin (pyproject's extra "tpu"), used where the runtime's JAX names none.
LIBTPU = next(r.split(";")[0].strip() for r in PYPROJECT["project"]["optional-dependencies"]["tpu"]
              if r.startswith("libtpu"))
# Cell tags the website reads (myst-nb): the install cell is removed from the pages, kept in the notebooks.
SITE_TAGS = ["remove-cell"]
# Folded: JupyterLab shows a collapsed input (click to open), Colab a form with the @title line.
CELL_METADATA = {"jupyter": {"source_hidden": True}, "cellView": "form"}


def is_tag(ref: str) -> bool:
    """Whether ``ref`` names a release tag (``v1.2.3``) rather than a branch."""
    return re.fullmatch(r"v\d+(\.\d+)*", ref) is not None


# The cell's code, with @REF@, @KIND@, @LIST@, @REPOSITORY@, @MIN@, @MIN_TUPLE@ and @TPU@ filled in by source().
# Plain Python, no `%pip` magic: the magic only prints pip's failure and carries on; this raises.
TEMPLATE = r'''# @title Colab and Kaggle only: install course_lib from @REF@
# Elsewhere ./course.sh installs it. This cell keeps the platform's JAX (the
# course needs >= @MIN@); when it cannot install, it says why.
import os, re, subprocess, sys
from importlib.metadata import distributions
on_kaggle = "KAGGLE_KERNEL_RUN_TYPE" in os.environ
if "google.colab" in sys.modules or on_kaggle:
    jax = next((d.version for d in distributions(name="jax")), "no JAX")
    if tuple(int(p) for p in re.findall(r"\d+", jax)[:2]) < @MIN_TUPLE@:
        raise RuntimeError(
            f"This course needs JAX >= @MIN@; this runtime has {jax}.\n"
            'Upgrade JAX: %pip install -U "jax[cuda12]" (GPU; "jax[tpu]":'
            " TPU; jax: CPU),\nthen restart the runtime and run this cell"
            " again.")
    url = "@REPOSITORY@"
    def pip_install(what, name):
        print(f"installing {name} ...")
        pip = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", what],
            capture_output=True, text=True)
        # no colour codes
        said = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", pip.stderr + pip.stdout)
        why = "pip failed"
        if re.search("unable to access|resolve host|connect to", said):
            why = "no network" + on_kaggle * (
                ": turn Internet on in the notebook's settings")
        if "did not match any" in said:
            why = f"there is no @KIND@ @REF@ (see {url}/@LIST@)"
        lines = said.strip().splitlines()
        cause = [s.strip() for s in lines
                 if re.match(r"\s*(fatal|error|ERROR):", s)
                 and "subprocess-exited" not in s] or lines[-2:]
        if pip.returncode != 0:
            raise RuntimeError(
                f"Could not install {name}: {why}.\npip said: "
                + "\n  ".join(dict.fromkeys(cause))
                + "\nThen run this cell again.")
        print(f"installed {name}")
    pip_install(f"course_lib @ git+{url}@@REF@",
                "course_lib from @REF@")@TPU@'''

# Lesson 13's variant adds this: on Linux x86-64 (Colab, Kaggle), the TPU compiler where it is missing.
TPU_PART = r'''
    import platform
    from importlib.metadata import requires
    from importlib.util import find_spec
    if (sys.platform == "linux" and platform.machine() == "x86_64"
            and not find_spec("libtpu")):
        # lesson 13's compiler: the libtpu this JAX pins (its extra
        # "tpu"), else the course's pin
        pin = [r.split(";")[0] for r in requires("jax") or []
               if re.match(r"libtpu\W.*tpu", r)]
        tpu = (pin + ["@LIBTPU@"])[0].replace(" ", "")
        pip_install(tpu, f"{tpu} (lesson 13's TPU compiler)")'''


def version() -> str:
    """course_lib's version, read from its source (without importing it)."""
    for line in (ROOT / "course_lib" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise RuntimeError("course_lib/__init__.py has no __version__ line")


def release_tag() -> str:
    """The git tag a release of this version carries: ``v`` + course_lib's version."""
    return f"v{version()}"


def wants_tpu(notebook: pathlib.Path | str | None) -> bool:
    """Whether the notebook's install cell is lesson 13's variant (it installs the TPU compiler too)."""
    return notebook is not None and pathlib.Path(notebook).name.startswith(TPU_LESSONS)


def source(notebook: pathlib.Path | str | None = None, ref: str = REF) -> str:
    """The cell's code for ``notebook`` (a path or file name; lesson 13 gets the TPU variant)."""
    kind, listing = ("tag", "tags") if is_tag(ref) else ("branch", "branches")
    return (TEMPLATE.replace("@TPU@", TPU_PART.replace("@LIBTPU@", LIBTPU) if wants_tpu(notebook) else "")
            .replace("@REF@", ref).replace("@KIND@", kind).replace("@LIST@", listing)
            .replace("@REPOSITORY@", REPOSITORY)
            .replace("@MIN_TUPLE@", repr(MIN_JAX)).replace("@MIN@", ".".join(map(str, MIN_JAX))))


def colab_url(name: str, ref: str = REF) -> str:
    return f"https://colab.research.google.com/github/{REPO}/blob/{ref}/notebooks/{name}"


def kaggle_url(name: str, ref: str = REF) -> str:
    return f"https://kaggle.com/kernels/welcome?src={REPOSITORY}/blob/{ref}/notebooks/{name}"


def binder_url(path: str = "notebooks/00_setup_and_devices.ipynb", ref: str = REF) -> str:
    return f"https://mybinder.org/v2/gh/{REPO}/{ref}?urlpath=lab/tree/{path}"


def badges(name: str, ref: str = REF) -> str:
    """The Colab and Kaggle badges of notebook ``name``, as one markdown line."""
    return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(name, ref)}) "
            f"[![Open In Kaggle](https://kaggle.com/static/images/open-in-kaggle.svg)]({kaggle_url(name, ref)})")


def with_badges(text: str, name: str) -> str:
    """The first markdown cell's text with its badge line as ``badges(name)`` (added after the title if none)."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if "colab-badge.svg" in line or "open-in-kaggle.svg" in line:
            lines[i] = badges(name)
            return "\n".join(lines)
    return "\n".join([lines[0], "", badges(name), *([""] if len(lines) > 1 and lines[1] else []), *lines[1:]])


BINDER_BADGE = re.compile(r"https://mybinder\.org/v2/gh/[^/\s]+/[^/\s]+/[^?\s]+\?urlpath=")


def readme_with_binder_ref(text: str) -> str:
    """README's text with every Binder link opening ``REF``."""
    return BINDER_BADGE.sub(f"https://mybinder.org/v2/gh/{REPO}/{REF}?urlpath=", text)


def apply(path: pathlib.Path) -> bool:
    """Make cell 1 of the notebook at ``path`` the install cell, tagged for the site and folded, and its first cell's
    badge line ``badges()``; True if the file changed. Only those change: the rest of the file is kept as it is."""
    text = path.read_text()
    nb = json.loads(text)
    cells = nb.get("cells", [])
    if len(cells) < 2 or cells[1]["cell_type"] != "code":
        found = f"a {cells[1]['cell_type']} cell" if len(cells) >= 2 else f"{len(cells)} cell(s) in all"
        raise ValueError(f"{path}: cell 1 must be the install code cell (cell 0 the title), found {found}; "
                         "insert an empty code cell after the title, then run this again")
    cell = cells[1]
    cell["source"] = source(path).splitlines(keepends=True)
    metadata = cell.setdefault("metadata", {})
    tags = metadata.get("tags", [])
    metadata["tags"] = tags + [t for t in SITE_TAGS if t not in tags]
    for key, value in CELL_METADATA.items():
        metadata[key] = {**metadata.get(key, {}), **value} if isinstance(value, dict) else value
    if cells[0]["cell_type"] == "markdown":
        title = "".join(cells[0]["source"])
        cells[0]["source"] = with_badges(title, path.name).splitlines(keepends=True)
    new = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    if new != text:
        path.write_text(new)
        return True
    return False


def apply_readme(path: pathlib.Path = ROOT / "README.md") -> bool:
    """Make README's Binder badge open ``REF``; True if the file changed."""
    text = path.read_text()
    new = readme_with_binder_ref(text)
    if new != text:
        path.write_text(new)
        return True
    return False


def differs(path: pathlib.Path) -> str | None:
    """What is wrong with cell 1 or the badges of the notebook at ``path`` (None when they are as applied)."""
    cells = json.loads(path.read_text()).get("cells", [])
    if len(cells) < 2 or cells[1]["cell_type"] != "code":
        return "cell 1 is not a code cell"
    cell = cells[1]
    metadata = cell.get("metadata", {})
    if "".join(cell["source"]) != source(path):
        return "cell 1 is not the install cell"
    if not set(SITE_TAGS) <= set(metadata.get("tags", [])):
        return "the install cell lacks the tag that keeps it off the website"
    if any(metadata.get(k) != v and not (isinstance(v, dict) and v.items() <= metadata.get(k, {}).items())
           for k, v in CELL_METADATA.items()):
        return "the install cell is not folded"
    if cells[0]["cell_type"] != "markdown" or badges(path.name) not in "".join(cells[0]["source"]):
        return f"the first cell lacks the Colab and Kaggle badges opening {REF}"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--apply", action="store_true", help="write the cell and badges (the default)")
    what.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook's cell differs")
    what.add_argument("--print", action="store_true", help="print the cell's code (for the notebook named)")
    ap.add_argument("notebooks", nargs="*", type=pathlib.Path,
                    help="default: every notebooks/NN_*.ipynb of this checkout")
    args = ap.parse_args(argv)
    if args.print:
        print(source(args.notebooks[0] if args.notebooks else None))
        return 0
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        ap.error(f"no such notebook: {', '.join(missing)}")
    readme = ROOT / "README.md" if not args.notebooks else None  # README's badge: only with every notebook
    if args.check:
        wrong = [(p, why) for p in paths if (why := differs(p))]
        if readme and readme.is_file() and readme_with_binder_ref(readme.read_text()) != readme.read_text():
            wrong.append((readme, f"its Binder badge does not open {REF}"))
        for p, why in wrong:
            print(f"{p}: {why}; run: python tools/install_cell.py --apply", file=sys.stderr)
        return 1 if wrong else 0
    for p in paths:
        print(("updated " if apply(p) else "unchanged ") + str(p))
    if readme and readme.is_file() and apply_readme(readme):
        print(f"updated {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
