"""The wheel of course_lib: what Colab or Kaggle get from the install cell.

It must keep a preinstalled JAX >= 0.11 (only lower bounds) and must not pull in JupyterLab, nbval or the
test tools (those are extras). The wheel is built here, offline, from a copy of the sources.
"""

import email.parser
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def metadata(tmp_path_factory):
    pytest.importorskip("setuptools", reason="setuptools (in the test extra) builds the wheel offline")
    src = tmp_path_factory.mktemp("src")
    for name in ["pyproject.toml", "README.md", "LICENSE"]:
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "course_lib", src / "course_lib", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "--disable-pip-version-check", "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (wheel,) = out.glob("course_lib-*.whl")
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(z.read(name).decode())


def requirements(metadata, extra=None) -> dict[str, Requirement]:
    out = {}
    for line in metadata.get_all("Requires-Dist"):
        req = Requirement(line)
        in_extra = req.marker is not None and "extra" in str(req.marker)
        if (extra is None and not in_extra) or (extra is not None and req.marker
                                                and req.marker.evaluate({"extra": extra}) and in_extra):
            out[canonicalize_name(req.name)] = req
    return out


def test_the_wheel_installs_no_jupyterlab_nbval_or_test_tools(metadata):
    runtime = requirements(metadata)
    for name in ["jupyterlab", "notebook", "nbval", "nbclient", "pytest", "hypothesis", "coverage", "playwright"]:
        assert name not in runtime, f"{name} is a runtime requirement of the wheel: {runtime[name]}"
    assert {"jax", "jaxlib", "optax"} <= set(runtime)
    assert "jupyterlab" in requirements(metadata, "lab")
    assert {"nbval", "pytest"} <= set(requirements(metadata, "test"))


@pytest.mark.parametrize("name, present", [("jax", "0.11.0"), ("jax", "0.11.2"), ("jaxlib", "0.11.2"),
                                           ("jax", "0.12.0.1"), ("ipywidgets", "7.7.1")])
def test_the_wheel_accepts_an_installed_version_that_meets_the_minimum(metadata, name, present):
    """pip keeps an installed package that satisfies the requirement: Colab's JAX and ipywidgets stay."""
    req = requirements(metadata)[name]
    assert req.specifier.contains(present), f"{req} would replace an installed {name} {present}"


def test_the_wheel_does_not_accept_a_jax_below_the_minimum(metadata):
    assert not requirements(metadata)["jax"].specifier.contains("0.10.2")
    assert metadata["Requires-Python"] == ">=3.12"
