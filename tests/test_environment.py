"""The environment files agree: pyproject.toml, environment.yml, constraints.txt and binder/."""

import importlib.metadata
import os
import pathlib
import re
import sys
import tomllib

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# conda-forge names that differ from the PyPI names; `graphviz` on conda-forge is the `dot` program itself.
CONDA_TO_PYPI = {"python-graphviz": "graphviz"}
CONDA_ONLY = {"python", "pip", "graphviz"}


def pyproject_requirements() -> list[Requirement]:
    reqs = PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"]["test"]
    return [Requirement(r) for r in reqs]


def conda_dependencies() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    names = {}
    for dep in env["dependencies"]:
        if isinstance(dep, str):
            name = re.split(r"[<>=! ]", dep, maxsplit=1)[0]
            names[name] = dep
    return names


def pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            out[canonicalize_name(name)] = version
    return out


def test_environment_yml_names_the_same_packages_as_pyproject():
    conda = conda_dependencies()
    from_conda = {canonicalize_name(CONDA_TO_PYPI.get(n, n)) for n in conda if n not in CONDA_ONLY}
    from_pyproject = {canonicalize_name(r.name) for r in pyproject_requirements()}
    assert from_conda == from_pyproject, (
        f"only in environment.yml: {sorted(from_conda - from_pyproject)}; "
        f"only in pyproject.toml: {sorted(from_pyproject - from_conda)}")
    assert {"python", "graphviz", "python-graphviz", "pip"} <= set(conda), "graphviz brings `dot`"


def test_environment_yml_lower_bounds_match_pyproject():
    conda = conda_dependencies()
    for req in pyproject_requirements():
        conda_name = {v: k for k, v in CONDA_TO_PYPI.items()}.get(req.name, req.name)
        bound = str(req.specifier)
        assert bound in conda[conda_name].replace(" ", ""), f"{conda_name}: pyproject says {bound}"
    assert conda["python"] == "python>=3.12"
    assert PYPROJECT["project"]["requires-python"] == ">=3.12"


def test_constraints_pin_every_dependency_within_its_range():
    pinned = pins()
    for req in pyproject_requirements():
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req.name} is not pinned in constraints.txt: run ./course.sh lock"
        assert req.specifier.contains(pinned[name]), f"{req.name}=={pinned[name]} is outside {req.specifier}"
    assert tuple(int(p) for p in pinned["jax"].split(".")[:2]) >= (0, 11)


def test_binder_uses_the_same_pins_and_python_3_12():
    assert (ROOT / "binder/requirements.txt").read_text() == (ROOT / "constraints.txt").read_text(), \
        "binder/requirements.txt must be a copy of constraints.txt: run ./course.sh lock"
    assert (ROOT / "binder/runtime.txt").read_text().strip() == "python-3.12"
    assert "graphviz" in (ROOT / "binder/apt.txt").read_text().split()


def test_binder_scripts_install_course_lib_and_set_8_devices():
    post_build = (ROOT / "binder/postBuild").read_text()
    start = (ROOT / "binder/start").read_text()
    assert "pip install --no-deps -e ." in post_build
    assert "export JAX_NUM_CPU_DEVICES=8" in start and 'exec "$@"' in start
    for script in ["postBuild", "start"]:
        assert os.access(ROOT / "binder" / script, os.X_OK), f"binder/{script} must be executable"


@pytest.mark.skipif(sys.prefix == os.environ.get("CONDA_PREFIX"), reason="conda environments pin their own builds")
def test_this_environment_has_the_pinned_versions():
    wrong = {}
    for name, version in pins().items():
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # platform-specific packages (e.g. appnope on macOS) may be absent elsewhere
        if have != version:
            wrong[name] = (have, version)
    assert not wrong, f"installed vs pinned: {wrong}. Stored outputs assume the pins: use ./course.sh test"
