"""Write binder/requirements.txt: the pins of constraints.txt that course_lib's runtime needs, and no others.

    python tools/binder_requirements.py      # run by ./course.sh lock, in the environment it resolved

Binder's base image (repo2docker) already has JupyterLab, Notebook and the Jupyter server, with versions that
fit one another (its notebook 7.4 needs jupyterlab < 4.5). Pinning our own JupyterLab there gives pip conflicts,
so Binder gets only course_lib's runtime dependencies and what they need, at the versions the stored outputs
were made with; the base image's Jupyter serves them. Run it in an environment that has constraints.txt's
versions installed: it walks the installed packages' requirements from pyproject's runtime dependencies.
"""

import importlib.metadata
import pathlib
import sys
import tomllib

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Binder's base image provides these (and their versions must fit one another there): never pin them.
BASE_IMAGE = {"jupyterlab", "notebook", "jupyter-server", "jupyterlab-server", "notebook-shim", "jupyter-lsp",
              "ipykernel", "jupyter-client", "jupyter-core", "tornado", "pyzmq", "nbformat", "nbconvert"}


def pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            out[canonicalize_name(name)] = line
    return out


def runtime_closure() -> set[str]:
    """Names of the runtime dependencies and everything they require, as installed here."""
    env = default_environment() | {"extra": ""}
    todo = [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker and not req.marker.evaluate(env)):
            continue
        seen.add(name)
        try:
            todo += [Requirement(r) for r in importlib.metadata.requires(req.name) or []]
        except importlib.metadata.PackageNotFoundError:
            sys.exit(f"{req.name} is not installed here: run this in the environment ./course.sh lock built")
    return seen


def main() -> None:
    pinned = pins()
    names = sorted((runtime_closure() - BASE_IMAGE) & set(pinned))
    print("# Binder: course_lib's runtime dependencies at the versions in constraints.txt (the Jupyter server,")
    print("# JupyterLab and Notebook are the base image's). Written by ./course.sh lock (tools/binder_requirements.py).")
    for name in names:
        print(pinned[name])


if __name__ == "__main__":
    main()
