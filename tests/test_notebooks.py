"""The lecture notebooks as files: stored outputs fit for nbval, badges, the install cell, the course order.

nbval itself (run by the same pytest command) re-executes them and compares outputs.
"""

import json
import pathlib
import re
import tomllib

import sys

import pytest

from notebook_checks import problems

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
REPO_URL = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
REPO = REPO_URL.removeprefix("https://github.com/")
sys.path.insert(0, str(ROOT / "tools"))
import install_cell  # noqa: E402  (the install cell's one source; tests/test_install_cell.py tests what it does)


def cells(path, kind):
    nb = json.loads(path.read_text())
    return [c for c in nb["cells"] if c["cell_type"] == kind]


def source(cell):
    return "".join(cell["source"])


def test_notebooks_are_numbered_in_order():
    assert NOTEBOOKS, "no notebooks found"
    numbers = [int(re.fullmatch(r"(\d\d)_[a-z0-9_]+\.ipynb", p.name).group(1)) for p in NOTEBOOKS]
    assert numbers == list(range(len(NOTEBOOKS)))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_outputs_are_clean(path):
    assert problems(path) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_first_cell_has_title_and_colab_and_kaggle_badges(path):
    first = source(cells(path, "markdown")[0])
    assert first.startswith("# "), "the first cell is the notebook's title"
    badge = f"https://colab.research.google.com/github/{REPO}/blob/{install_cell.REF}/notebooks/{path.name}"
    assert f"({badge})" in first, f"missing Open-in-Colab badge linking to {badge}"
    kaggle = f"https://kaggle.com/kernels/welcome?src={REPO_URL}/blob/{install_cell.REF}/notebooks/{path.name}"
    assert f"({kaggle})" in first, f"missing Open-in-Kaggle badge linking to {kaggle}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_first_code_cell_installs_course_lib_only_on_hosted_platforms(path):
    first = cells(path, "code")[0]
    assert source(first) == install_cell.source(path)  # lesson 13's variant also installs its TPU compiler
    assert first["outputs"] == [], "it prints nothing outside Colab and Kaggle"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_kernel_is_python3(path):
    assert json.loads(path.read_text())["metadata"]["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("path", NOTEBOOKS[1:], ids=lambda p: p.name)
def test_multi_device_lessons_get_their_devices_first(path):
    """Before any other JAX code, so that the fallback to simulated devices can still happen."""
    code = [source(c) for c in cells(path, "code")[1:]]
    first_jax = next(i for i, s in enumerate(code) if "jax" in s)
    assert "lesson_devices(" in code[first_jax]


def test_readme_lists_every_notebook_and_badges():
    readme = (ROOT / "README.md").read_text()
    for path in NOTEBOOKS:
        assert f"notebooks/{path.name}" in readme, f"README does not link {path.name}"
    assert install_cell.binder_url() == (f"https://mybinder.org/v2/gh/{REPO}/{install_cell.REF}"
                                         "?urlpath=lab/tree/notebooks/00_setup_and_devices.ipynb")
    assert install_cell.binder_url() in readme


def test_every_link_to_the_hardware_notes_reaches_an_explicit_anchor():
    """hardware.md's sections carry explicit `<a id>` anchors, named as JupyterLab names the headings, so that a
    lesson's link reaches its section in JupyterLab, on GitHub (which lowercases heading anchors and drops their
    dots) and on the site."""
    notes = (ROOT / "notebooks" / "hardware.md").read_text()
    anchors = set(re.findall(r'^<a id="([^"]+)"></a>$', notes, flags=re.M))
    headings = {h.strip().replace(" ", "-") for h in re.findall(r"^##+ (.+)$", notes, flags=re.M)}
    assert anchors == headings, (anchors ^ headings)
    links = [(path.name, a) for path in NOTEBOOKS for c in cells(path, "markdown")
             for a in re.findall(r"hardware\.md#([^)\s]+)", source(c))]
    links += [("hardware.md", a) for a in re.findall(r"\]\(#([^)\s]+)\)", notes)]
    assert len(links) >= 10, links
    assert not [(name, a) for name, a in links if a not in anchors]
