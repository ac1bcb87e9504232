"""The Colab/Kaggle install cell: the same in every notebook, pinned to the release tag, never replacing JAX, and
stopping the notebook with a short clear error when it cannot install (tested offline: pip really runs, against
local git repositories)."""

import builtins
import json
import pathlib
import subprocess
import sys
import types

import pytest
from IPython.core.inputtransformer2 import TransformerManager

import course_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import install_cell  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
TAG = install_cell.release_tag()


def test_the_pin_is_the_release_tag_of_this_version():
    assert TAG == f"v{course_lib.__version__}"
    assert f'git+{{url}}@v{course_lib.__version__}"' in install_cell.source()
    assert f'url = "{install_cell.REPOSITORY}"' in install_cell.source()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_has_the_install_cell_as_cell_1_tagged_for_the_site(path):
    cell = json.loads(path.read_text())["cells"][1]
    assert cell["cell_type"] == "code"
    fix = f"run: python tools/install_cell.py {path.relative_to(ROOT)}"
    assert "".join(cell["source"]) == install_cell.source(), f"{path.name}: cell 1 is not the install cell; {fix}"
    assert "remove-cell" in cell.get("metadata", {}).get("tags", []), \
        f"{path.name}: the install cell lacks the tag that keeps it off the website; {fix}"


def test_the_tool_writes_the_cell_and_the_tag_into_a_new_notebook_and_keeps_other_tags(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": ["# 99 · New"]},
                    {"cell_type": "code", "metadata": {"tags": ["mine"]}, "source": ["print(1)"],
                     "outputs": [], "execution_count": None}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "99_new.ipynb"
    path.write_text(json.dumps(nb))
    assert install_cell.apply(path) is True
    cell = json.loads(path.read_text())["cells"][1]
    assert "".join(cell["source"]) == install_cell.source()
    assert cell["metadata"]["tags"] == ["mine", "remove-cell"]
    assert install_cell.apply(path) is False, "a second run changes nothing"
    nb["cells"][1] = {"cell_type": "markdown", "metadata": {}, "source": ["text"]}
    path.write_text(json.dumps(nb))
    with pytest.raises(ValueError, match="cell 1 must be the install code cell"):
        install_cell.apply(path)


def test_the_cell_is_plain_python_that_ipython_runs_unchanged():
    """No `%pip` magic: the magic prints pip's failure, then "you may need to restart the kernel", and carries on."""
    code = install_cell.source()
    assert "%pip install -q" not in code and "get_ipython" not in code
    assert TransformerManager().transform_cell(code).rstrip() == code.rstrip()
    compile(code, "<install cell>", "exec")


def run_cell(monkeypatch, *, platform: str | None, jax_version: str | None = "0.12.0",
             pip=None, repository: str | None = None):
    """Run the install cell on a pretend platform ("colab", "kaggle" or None). ``pip`` replaces subprocess.run
    (default: record the call and succeed); ``repository`` replaces the repository URL in the cell."""
    code = install_cell.source()
    if repository is not None:
        code = code.replace(f'url = "{install_cell.REPOSITORY}"', f'url = "{repository}"')
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    if platform == "colab":
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    elif platform == "kaggle":
        monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")

    def fake_version(name):
        import importlib.metadata
        if name == "jax" and jax_version is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return jax_version if name == "jax" else "0"

    monkeypatch.setattr("importlib.metadata.version", fake_version)
    calls = []

    def record(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", pip or record)
    exec(compile(code, "<install cell>", "exec"), {"__builtins__": builtins})
    return calls


def test_outside_colab_and_kaggle_it_does_nothing(monkeypatch, capsys):
    assert run_cell(monkeypatch, platform=None) == []
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("platform", ["colab", "kaggle"])
@pytest.mark.parametrize("jax_version", ["0.11.0", "0.11.2", "0.12.0.1", "0.13.0.dev20261101", "1.0.0"])
def test_with_a_recent_enough_jax_it_installs_the_tag_and_leaves_jax_alone(monkeypatch, capsys, platform,
                                                                           jax_version):
    calls = run_cell(monkeypatch, platform=platform, jax_version=jax_version)
    assert calls == [[sys.executable, "-m", "pip", "install", "-q",
                      f"course_lib @ git+{install_cell.REPOSITORY}@{TAG}"]]
    out = capsys.readouterr().out
    assert f"installed course_lib {TAG}" in out and "restart" not in out


@pytest.mark.parametrize("jax_version, shown", [("0.10.2", "0.10.2"), ("0.4.38", "0.4.38"), (None, "no JAX")])
def test_with_an_old_or_missing_jax_it_stops_with_a_short_error_saying_how_to_upgrade(monkeypatch, capsys,
                                                                                      jax_version, shown):
    with pytest.raises(RuntimeError) as err:
        run_cell(monkeypatch, platform="colab", jax_version=jax_version,
                 pip=lambda *a, **k: pytest.fail("pip must not run with an old JAX"))
    msg = str(err.value)
    assert msg.startswith(f"This course needs JAX >= 0.11; this runtime has {shown}.")
    assert '%pip install -U "jax[cuda12]"' in msg and "jax[tpu]" in msg and "restart the runtime" in msg
    assert max(map(len, msg.splitlines())) <= 100, "short lines, not one 330-character line"
    assert capsys.readouterr().out == ""


def local_repo(tmp_path, tag: str | None) -> str:
    """A git repository on disk holding a tiny installable course_lib; tagged ``tag`` if given; its file URL."""
    repo = tmp_path / "repo"
    (repo / "course_lib").mkdir(parents=True)
    (repo / "course_lib" / "__init__.py").write_text("")
    (repo / "pyproject.toml").write_text('[project]\nname = "course_lib"\nversion = "0.0.1"\n')
    git = ["git", "-C", str(repo), "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    if tag:
        subprocess.run([*git, "tag", tag], check=True)
    return f"file://localhost{repo}"


REAL_RUN = subprocess.run


def real_pip_dry_run(cmd, **kwargs):
    """pip really runs (clones, checks out the tag) but installs nothing into this environment."""
    return REAL_RUN([*cmd[:4], "--dry-run", "--no-deps", "--no-build-isolation", *cmd[4:]], **kwargs)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("platform", ["colab", "kaggle"])
def test_a_missing_tag_stops_the_notebook_with_what_pip_said(monkeypatch, capsys, tmp_path, platform):
    url = local_repo(tmp_path, tag=None)
    with pytest.raises(RuntimeError) as err:
        run_cell(monkeypatch, platform=platform, pip=real_pip_dry_run, repository=url)
    msg = str(err.value)
    assert msg.startswith(f"pip could not install course_lib {TAG}.")
    assert f"check that the release tag exists: {url}/tags" in msg
    assert f"pathspec '{TAG}' did not match" in msg, msg
    assert ("turn on Internet" in msg) == (platform == "kaggle")
    assert "restart the kernel" not in msg + capsys.readouterr().out
    assert len(msg.splitlines()) <= 5


@pytest.mark.timeout(120)
def test_an_unreachable_repository_stops_the_notebook(monkeypatch, tmp_path):
    with pytest.raises(RuntimeError) as err:
        run_cell(monkeypatch, platform="colab", pip=real_pip_dry_run,
                 repository=f"file://localhost{tmp_path}/no_such_repository")
    msg = str(err.value)
    assert "pip could not install course_lib" in msg and "Check the network." in msg
    assert "fatal:" in msg and "no_such_repository" in msg, msg


@pytest.mark.timeout(120)
def test_the_real_pip_path_succeeds_against_a_repository_that_has_the_tag(monkeypatch, capsys, tmp_path):
    """The same cell and the same pip call succeed once the tag is there (a dry run: nothing is installed)."""
    run_cell(monkeypatch, platform="kaggle", pip=real_pip_dry_run, repository=local_repo(tmp_path, tag=TAG))
    assert f"installed course_lib {TAG}" in capsys.readouterr().out


def test_kaggle_without_internet_says_to_turn_it_on(monkeypatch):
    """What pip prints on a Kaggle kernel with Internet off (git cannot resolve github.com)."""
    stderr = ("  error: subprocess-exited-with-error\n\n  × git clone --filter=blob:none --quiet "
              f"{install_cell.REPOSITORY} /tmp/pip-install-x/course-lib did not run successfully.\n"
              "  │ exit code: 128\n  ╰─> [1 lines of output]\n"
              f"      fatal: unable to access '{install_cell.REPOSITORY}/': Could not resolve host: github.com\n"
              "      [end of output]\n\n  note: This error originates from a subprocess, and is likely not a problem "
              "with pip.\nerror: subprocess-exited-with-error\n")
    with pytest.raises(RuntimeError) as err:
        run_cell(monkeypatch, platform="kaggle",
                 pip=lambda cmd, **k: subprocess.CompletedProcess(cmd, 1, "", stderr))
    msg = str(err.value)
    assert msg.splitlines()[0] == (f"pip could not install course_lib {TAG}. "
                                   "On Kaggle, turn on Internet in the notebook's settings.")
    assert "pip said: fatal: unable to access" in msg and "Could not resolve host: github.com" in msg
    assert "subprocess-exited" not in msg and msg.endswith("Then run this cell again.")
