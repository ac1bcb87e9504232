"""The Colab/Kaggle install cell: one source for the second cell of every notebook, and its site tag.

    python tools/install_cell.py                       # write it into every notebook in notebooks/
    python tools/install_cell.py notebooks/NN_x.ipynb  # only these (a new notebook: its cell 1 is replaced)

The cell installs course_lib from the release tag ``v<course_lib.__version__>`` (the one place the pin lives;
tests/test_install_cell.py checks every notebook has this exact cell). It installs only on Colab or Kaggle, and
only where the preinstalled JAX meets the course's minimum: it never replaces a platform's JAX, jaxlib or
accelerator plugin. When it cannot install (JAX missing or too old, or pip failing: no network, Kaggle's Internet
switched off, a missing tag), it raises a short error that says what to do, which stops "Run All" there.

The cell also gets the tag ``remove-cell`` (``SITE_TAGS``): the course's website (tools/site) leaves it out of the
lesson pages, where it does nothing; the notebooks keep it.
"""

import json
import pathlib
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
REPOSITORY = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
MIN_JAX = (0, 11)
# Cell tags the website reads (myst-nb): the install cell is removed from the pages, kept in the notebooks.
SITE_TAGS = ["remove-cell"]

# The cell's code, with @TAG@, @REPOSITORY@, @MIN@ and @MIN_TUPLE@ filled in by source(). Plain Python, no
# `%pip` magic: the magic only prints pip's failure and carries on; this raises.
TEMPLATE = r'''# Colab and Kaggle only: install course_lib @TAG@. Elsewhere ./course.sh has installed it.
# It keeps the platform's own JAX (it must be >= @MIN@) and installs only what the lessons import.
import os, re, subprocess, sys
if "google.colab" in sys.modules or "KAGGLE_KERNEL_RUN_TYPE" in os.environ:
    from importlib.metadata import version, PackageNotFoundError
    try:
        have_jax = version("jax")
    except PackageNotFoundError:
        have_jax = None
    if have_jax is None or tuple(int(p) for p in re.findall(r"\d+", have_jax)[:2]) < @MIN_TUPLE@:
        raise RuntimeError(
            f"This course needs JAX >= @MIN@; this runtime has {have_jax or 'no JAX'}. Upgrade JAX:\n"
            '  %pip install -U "jax[cuda12]"    (GPU; "jax[tpu]" on a TPU, jax on a CPU)\n'
            "then restart the runtime (the kernel) and run this cell again.")
    print("installing course_lib @TAG@ ...")
    url = "@REPOSITORY@"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"course_lib @ git+{url}@@TAG@"],
                         capture_output=True, text=True)
    if pip.returncode != 0:
        lines = [line.strip() for line in (pip.stderr + pip.stdout).splitlines() if line.strip()]
        said = [line for line in lines if re.match(r"(fatal|error|ERROR):", line) and "exited-with" not in line]
        on_kaggle = "KAGGLE_KERNEL_RUN_TYPE" in os.environ
        raise RuntimeError(
            "pip could not install course_lib @TAG@. "
            + ("On Kaggle, turn on Internet in the notebook's settings.\n" if on_kaggle else "Check the network.\n")
            + f"If the network works, check that the release tag exists: {url}/tags\n"
            + "pip said: " + "\n  ".join(dict.fromkeys(said or lines[-2:]))
            + "\nThen run this cell again.")
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
    """Make cell 1 of the notebook at ``path`` the install cell, tagged for the site; True if the file changed."""
    text = path.read_text()
    nb = json.loads(text)
    cell = nb["cells"][1]
    if cell["cell_type"] != "code":
        raise ValueError(f"{path}: cell 1 must be the install code cell, found a {cell['cell_type']} cell")
    cell["source"] = source().splitlines(keepends=True)
    metadata = cell.setdefault("metadata", {})
    tags = metadata.get("tags", [])
    metadata["tags"] = tags + [t for t in SITE_TAGS if t not in tags]
    new = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    if new != text:
        path.write_text(new)
        return True
    return False


if __name__ == "__main__":
    paths = [pathlib.Path(p) for p in sys.argv[1:]] or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    for p in paths:
        print(("updated " if apply(p) else "unchanged ") + str(p))
