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
    """The runtime dependencies and every extra (lab, test): what ./course.sh installs."""
    reqs = list(PYPROJECT["project"]["dependencies"])
    for extra in PYPROJECT["project"]["optional-dependencies"].values():
        reqs += extra
    return [Requirement(r) for r in reqs]


def runtime_names() -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in PYPROJECT["project"]["dependencies"]}


# What the notebooks and course_lib do not import: never a runtime dependency (Colab and Kaggle get only those).
# (PyYAML is in the test extra for the workflow check, but orbax-checkpoint needs it at run time too.)
NOT_RUNTIME = {"jupyterlab", "notebook", "jupyter-server", "nbval", "nbclient", "pytest", "pytest-timeout", "pytest-xdist", "execnet",
               "hypothesis", "coverage", "playwright", "setuptools", "sphinx", "myst-nb", "myst-parser",
               "sphinx-book-theme", "pydata-sphinx-theme", "docutils", "jupyter-cache", "latex2mathml"}


def test_runtime_dependencies_are_what_the_lessons_import_with_lower_bounds_only():
    assert not runtime_names() & NOT_RUNTIME, f"not needed at run time: {sorted(runtime_names() & NOT_RUNTIME)}"
    assert {"jax", "jaxlib", "optax", "graphviz", "tqdm", "ipywidgets", "matplotlib"} <= runtime_names()
    for r in map(Requirement, PYPROJECT["project"]["dependencies"]):
        # Only a minimum: an installed version that meets it (Colab's JAX, ipywidgets 7) is kept.
        assert all(spec.operator == ">=" for spec in r.specifier), f"{r}: lower bounds only"
    jax = next(Requirement(r) for r in PYPROJECT["project"]["dependencies"] if r.startswith("jax>"))
    assert jax.specifier.contains("0.11.0") and not jax.specifier.contains("0.10.2")
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert {canonicalize_name(Requirement(r).name) for r in extras["lab"]} == {"jupyterlab", "jupyterlab-rise"}
    assert {"nbval", "pytest"} <= {canonicalize_name(Requirement(r).name) for r in extras["test"]}
    # The website's tools (./course.sh site) are an extra of their own, installed by ./course.sh only.
    assert {canonicalize_name(Requirement(r).name) for r in extras["site"]} == {"sphinx", "myst-nb",
                                                                               "sphinx-book-theme", "latex2mathml"}


def shell_value(script: str, name: str) -> str:
    return re.search(rf'^{name}="([^"]*)"$', script, re.M).group(1)


def test_course_sh_installs_the_learners_extra_for_lessons_and_every_extra_for_tests_and_lock():
    """setup and lab: the runtime and "lab" only (what lessons 00-12 need); test and refresh: every extra; lock
    resolves every extra; site and tpu add their own."""
    script = (ROOT / "course.sh").read_text()
    extras = list(PYPROJECT["project"]["optional-dependencies"])
    assert sorted(shell_value(script, "ALL_EXTRAS").split(",")) == sorted(extras)
    assert shell_value(script, "LEARNER_EXTRAS") == "lab"
    assert script.count('-e ".[$ALL_EXTRAS]"') == 1, "lock resolves every extra"
    assert script.count('-e ".[$need]"') == 1, "ensure_venv installs the union of what it had and what is asked"
    cases = dict(re.findall(r"^  ([a-z-]+)\)\n(.*?)\n    ;;", script, re.M | re.S))
    assert re.search(r"^    setup$", cases["setup"], re.M) and re.search(r"^    setup$", cases["lab"], re.M)
    for cmd in ["test", "refresh"]:
        assert 'setup "$ALL_EXTRAS"' in cases[cmd], cmd
    assert "ensure_venv site" in cases["site"]
    assert 'setup "$LEARNER_EXTRAS,tpu"' in cases["tpu"]
    assert "course_lib.setup_check" in cases["check"] and "ensure_dot" not in cases["check"]


def conda_dependencies() -> dict[str, str]:
    """environment.yml's packages by name: conda-forge's, and those its `pip:` list installs from PyPI (libtpu,
    which conda-forge lacks), course_lib's own `--editable .` aside."""
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    names = {}
    for dep in env["dependencies"]:
        for entry in dep.get("pip", []) if isinstance(dep, dict) else [dep]:
            if isinstance(entry, str) and not entry.startswith("-"):
                name = re.split(r"[<>=!; ]", entry, maxsplit=1)[0]
                names[name] = entry
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


def test_binder_pins_the_runtime_at_the_constraints_versions_and_leaves_jupyter_to_the_base_image():
    lines = [ln for ln in (ROOT / "binder/requirements.txt").read_text().splitlines() if ln and ln[0] != "#"]
    constraint_lines = set((ROOT / "constraints.txt").read_text().splitlines())
    assert set(lines) <= constraint_lines, f"not as in constraints.txt: {sorted(set(lines) - constraint_lines)}"
    names = {canonicalize_name(ln.split("==")[0]) for ln in lines}
    assert runtime_names() <= names, f"runtime dependencies missing on Binder: {sorted(runtime_names() - names)}"
    # repo2docker's base image has its own JupyterLab, Notebook and server, which must fit one another.
    base = {"jupyterlab", "notebook", "jupyter-server", "jupyterlab-server", "ipykernel", "tornado"}
    assert not names & (base | NOT_RUNTIME), f"Binder must not pin {sorted(names & (base | NOT_RUNTIME))}"
    assert (ROOT / "binder/runtime.txt").read_text().strip() == "python-3.12"
    assert "graphviz" in (ROOT / "binder/apt.txt").read_text().split()


def test_binder_scripts_install_course_lib_and_set_8_devices():
    post_build = (ROOT / "binder/postBuild").read_text()
    start = (ROOT / "binder/start").read_text()
    assert "pip install --no-deps -e ." in post_build
    assert "jupyter trust notebooks/" in post_build, "stored diagrams show as SVG only in trusted notebooks"
    assert "export JAX_NUM_CPU_DEVICES=8" in start and 'exec "$@"' in start
    # The choice measured in INSTRUCTORS.md: the image leaves lesson 13's 639 MB compiler out.
    commands = [ln for ln in post_build.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert [ln for ln in commands if "pip install" in ln] == ["python -m pip install --no-deps -e ."], commands
    for script in ["postBuild", "start"]:
        assert os.access(ROOT / "binder" / script, os.X_OK), f"binder/{script} must be executable"


@pytest.mark.skipif(sys.prefix == os.environ.get("CONDA_PREFIX"), reason="conda environments pin their own builds")
@pytest.mark.skipif(not (pathlib.Path(sys.prefix) / ".course-stamp").exists(),
                    reason="this environment was not built by ./course.sh, so it need not have the pinned versions "
                           "(nbval may then report output differences); ./course.sh test builds one that has them")
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
