"""The Colab/Kaggle install cell: one source for the second cell of every notebook.

    python tools/install_cell.py                       # write it into every notebook in notebooks/
    python tools/install_cell.py notebooks/NN_x.ipynb  # only these (a new notebook: its cell 1 is replaced)

The cell installs course_lib from the release tag ``v<course_lib.__version__>`` (the one place the pin lives;
tests/test_install_cell.py checks every notebook has this exact cell). It installs only on Colab or Kaggle, and
only where the preinstalled JAX meets the course's minimum: it never replaces a platform's JAX, jaxlib or
accelerator plugin. Where JAX is missing or too old, it says so and how to fix it.
"""

import json
import pathlib
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
REPOSITORY = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
MIN_JAX = (0, 11)


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
    minimum = ".".join(map(str, MIN_JAX))
    return f'''# Colab and Kaggle only: install course_lib {release_tag()}. Elsewhere ./course.sh has installed it.
# It keeps the platform's own JAX (it must be >= {minimum}) and installs only what the lessons import.
import os, sys
if "google.colab" in sys.modules or "KAGGLE_KERNEL_RUN_TYPE" in os.environ:
    from importlib.metadata import version, PackageNotFoundError
    try:
        have_jax = version("jax")
    except PackageNotFoundError:
        have_jax = None
    if have_jax is None or tuple(int(p) for p in have_jax.split(".")[:2]) < {MIN_JAX!r}:
        print(f"This course needs JAX >= {minimum}; this runtime has {{have_jax or 'no JAX'}}. Not installing, so as not to "
              "mix JAX versions with the runtime's accelerator plugin. Fix: install a JAX for this runtime, e.g. "
              '%pip install -U "jax[tpu]" (TPU) or "jax[cuda12]" (GPU) or jax (CPU), restart the runtime, run this again.')
    else:
        %pip install -q "course_lib @ git+{REPOSITORY}@{release_tag()}"'''


def apply(path: pathlib.Path) -> bool:
    """Make cell 1 of the notebook at ``path`` the install cell; True if the file changed."""
    text = path.read_text()
    nb = json.loads(text)
    cell = nb["cells"][1]
    if cell["cell_type"] != "code":
        raise ValueError(f"{path}: cell 1 must be the install code cell, found a {cell['cell_type']} cell")
    cell["source"] = source().splitlines(keepends=True)
    new = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    if new != text:
        path.write_text(new)
        return True
    return False


if __name__ == "__main__":
    paths = [pathlib.Path(p) for p in sys.argv[1:]] or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    for p in paths:
        print(("updated " if apply(p) else "unchanged ") + str(p))
