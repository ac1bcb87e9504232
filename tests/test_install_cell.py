"""The Colab/Kaggle install cell: the same in every notebook, pinned to the release tag, and never replacing JAX."""

import builtins
import json
import pathlib
import sys
import types

import pytest
from IPython.core.inputtransformer2 import TransformerManager

import course_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import install_cell  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_the_pin_is_the_release_tag_of_this_version():
    assert install_cell.release_tag() == f"v{course_lib.__version__}"
    assert f"@v{course_lib.__version__}\"" in install_cell.source()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_has_the_install_cell_as_cell_1(path):
    cell = json.loads(path.read_text())["cells"][1]
    assert cell["cell_type"] == "code"
    assert "".join(cell["source"]) == install_cell.source(), \
        f"{path.name}: cell 1 is not the install cell; run: python tools/install_cell.py {path.relative_to(ROOT)}"


def run_cell(monkeypatch, capsys, *, colab: bool, jax_version: str | None) -> list[str]:
    """Run the install cell as IPython would; return the %pip lines it ran (none are really run)."""
    code = TransformerManager().transform_cell(install_cell.source())
    pip_lines = []
    shell = types.SimpleNamespace(run_line_magic=lambda name, line, *a: pip_lines.append(f"%{name} {line}"))
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    if colab:
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)

    def fake_version(name):
        import importlib.metadata
        if name == "jax" and jax_version is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return jax_version if name == "jax" else "0"

    monkeypatch.setattr("importlib.metadata.version", fake_version)
    exec(compile(code, "<install cell>", "exec"), {"get_ipython": lambda: shell, "__builtins__": builtins})
    return pip_lines


def test_outside_colab_and_kaggle_it_does_nothing(monkeypatch, capsys):
    assert run_cell(monkeypatch, capsys, colab=False, jax_version="0.12.0") == []
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("jax_version", ["0.11.0", "0.11.2", "0.12.0.1", "1.0.0"])
def test_with_a_recent_enough_jax_it_installs_the_tag_and_leaves_jax_alone(monkeypatch, capsys, jax_version):
    lines = run_cell(monkeypatch, capsys, colab=True, jax_version=jax_version)
    assert lines == [f'%pip install -q "course_lib @ git+{install_cell.REPOSITORY}@{install_cell.release_tag()}"']


@pytest.mark.parametrize("jax_version, shown", [("0.10.2", "0.10.2"), ("0.4.38", "0.4.38"), (None, "no JAX")])
def test_with_an_old_or_missing_jax_it_installs_nothing_and_says_how_to_fix_it(monkeypatch, capsys, jax_version,
                                                                               shown):
    assert run_cell(monkeypatch, capsys, colab=True, jax_version=jax_version) == []
    out = capsys.readouterr().out
    assert f"needs JAX >= 0.11; this runtime has {shown}" in out
    assert '%pip install -U "jax[tpu]"' in out and "restart the runtime" in out
