"""The Colab/Kaggle install cell and the launch buttons: one git ref (pyproject's [tool.course] ref) for the cell of
every notebook, their badges, README's Binder badge and the website's buttons; the cell is folded, never replaces
JAX, installs lesson 13's TPU compiler in lesson 13 where it is missing, and stops the notebook with a short clear
error that says why when it cannot install (tested offline: pip really runs, against local git repositories and a
closed proxy, with its colour output forced on as a notebook kernel does, and once inside a real kernel)."""

import builtins
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import re
import runpy
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
REF = install_cell.REF
KIND = "tag" if install_cell.is_tag(REF) else "branch"
TPU_NOTEBOOK = "13_compile_for_a_tpu_pod.ipynb"


def test_the_cell_installs_from_the_one_ref_in_pyproject():
    assert REF == install_cell.PYPROJECT["tool"]["course"]["ref"]
    assert f'git+{{url}}@{REF}",\n                "course_lib from {REF}")' in install_cell.source()
    assert f'url = "{install_cell.REPOSITORY}"' in install_cell.source()
    assert install_cell.source().splitlines()[0].endswith(f"install course_lib from {REF}"), \
        "the title says which commit it installs"
    if install_cell.is_tag(REF):
        assert REF == f"v{course_lib.__version__}", "a tag ref is this version's release tag"


def test_every_launch_point_opens_the_one_ref():
    """The notebooks' Colab and Kaggle badges, README's Binder badge and the website's buttons agree with the ref
    that cell 1 installs from: a learner never runs one commit's notebook against another's course_lib unawares."""
    refs = set()
    for path in NOTEBOOKS:
        nb = json.loads(path.read_text())
        first, cell = "".join(nb["cells"][0]["source"]), "".join(nb["cells"][1]["source"])
        refs |= set(re.findall(r"colab\.research\.google\.com/github/[^/]+/[^/]+/blob/([^/]+)/", first))
        refs |= set(re.findall(r"kaggle\.com/kernels/welcome\?src=https://github\.com/[^/]+/[^/]+/blob/([^/]+)/",
                               first))
        refs |= set(re.findall(r'git\+\{url\}@([^"]+)"', cell))
        assert install_cell.badges(path.name) in first, f"{path.name}: badges; run python tools/install_cell.py"
    readme = (ROOT / "README.md").read_text()
    binder = re.findall(r"https://mybinder\.org/v2/gh/[^/]+/[^/]+/([^?\s]+)\?", readme)
    assert binder, "README has a Binder badge"
    refs |= set(binder)
    conf = runpy.run_path(str(ROOT / "tools" / "site" / "conf.py"))
    refs.add(conf["html_theme_options"]["repository_branch"])  # the site's Binder, Colab and Kaggle buttons
    assert refs == {REF}, f"launch points and install cells use {sorted(refs)}; pyproject's ref is {REF}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_has_the_install_cell_as_cell_1_tagged_for_the_site_and_folded(path):
    cell = json.loads(path.read_text())["cells"][1]
    assert cell["cell_type"] == "code"
    fix = f"run: python tools/install_cell.py --apply {path.relative_to(ROOT)}"
    assert "".join(cell["source"]) == install_cell.source(path), f"{path.name}: cell 1 is not the install cell; {fix}"
    assert "remove-cell" in cell.get("metadata", {}).get("tags", []), \
        f"{path.name}: the install cell lacks the tag that keeps it off the website; {fix}"
    assert install_cell.differs(path) is None, f"{path.name}: {install_cell.differs(path)}; {fix}"


@pytest.mark.parametrize("notebook, most", [(None, 42), (TPU_NOTEBOOK, 53)])
def test_the_cell_is_short_to_read_and_folded(notebook, most):
    lines = install_cell.source(notebook).splitlines()
    assert len(lines) <= most and max(map(len, lines)) <= 80, (len(lines), max(map(len, lines)))
    assert lines[0].startswith("# @title Colab and Kaggle only: install course_lib"), "Colab shows this line"
    assert ("libtpu" in install_cell.source(notebook)) == (notebook == TPU_NOTEBOOK), "lesson 13's variant only"
    assert install_cell.CELL_METADATA == {"jupyter": {"source_hidden": True}, "cellView": "form"}


def test_the_tool_writes_the_cell_and_the_tag_into_a_new_notebook_and_keeps_other_tags(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": ["# 99 · New"]},
                    {"cell_type": "code", "metadata": {"tags": ["mine"]}, "source": ["print(1)"],
                     "outputs": [], "execution_count": None}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "99_new.ipynb"
    path.write_text(json.dumps(nb))
    assert install_cell.apply(path) is True
    cells = json.loads(path.read_text())["cells"]
    cell = cells[1]
    assert "".join(cell["source"]) == install_cell.source()
    assert "".join(cells[0]["source"]) == f"# 99 · New\n\n{install_cell.badges('99_new.ipynb')}", "badges added"
    assert cell["metadata"]["tags"] == ["mine", "remove-cell"]
    assert cell["metadata"]["jupyter"] == {"source_hidden": True} and cell["metadata"]["cellView"] == "form"
    assert install_cell.apply(path) is False, "a second run changes nothing"
    nb["cells"][1] = {"cell_type": "markdown", "metadata": {}, "source": ["text"]}
    path.write_text(json.dumps(nb))
    with pytest.raises(ValueError, match="cell 1 must be the install code cell"):
        install_cell.apply(path)


def test_the_command_applies_the_cell_to_the_notebooks_named_and_checks_them(tmp_path):
    """`python tools/install_cell.py --apply notebooks/*.ipynb` rewrites cell 1 of each (and nothing else);
    `--check` fails, naming the notebook, until it has."""
    old = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": ["# 13 · New"]},
                     {"cell_type": "code", "metadata": {"tags": ["remove-cell"]}, "source": ["# the old cell\n"],
                      "outputs": [], "execution_count": None},
                     {"cell_type": "code", "metadata": {}, "source": ["x = 1"], "outputs": [], "execution_count": 3}],
           "metadata": {"kernelspec": {"name": "python3"}}, "nbformat": 4, "nbformat_minor": 5}
    paths = [tmp_path / "13_a.ipynb", tmp_path / "14_b.ipynb"]
    for p in paths:
        p.write_text(json.dumps(old))
    tool = [sys.executable, str(ROOT / "tools" / "install_cell.py")]
    check = subprocess.run([*tool, "--check", *map(str, paths)], capture_output=True, text=True)
    assert check.returncode == 1 and "13_a.ipynb: cell 1 is not the install cell" in check.stderr, check.stderr
    done = subprocess.run([*tool, "--apply", *map(str, paths)], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.count("updated ") == 2, done.stdout + done.stderr
    for p in paths:
        nb = json.loads(p.read_text())
        assert "".join(nb["cells"][1]["source"]) == install_cell.source(p)
        assert ("libtpu" in "".join(nb["cells"][1]["source"])) == p.name.startswith("13_")
        assert nb["cells"][2] == old["cells"][2] and nb["metadata"] == old["metadata"]
        assert "".join(nb["cells"][0]["source"]) == f"# 13 · New\n\n{install_cell.badges(p.name)}"
    assert subprocess.run([*tool, "--check", *map(str, paths)], capture_output=True).returncode == 0
    again = subprocess.run([*tool, "--apply", *map(str, paths)], capture_output=True, text=True)
    assert again.stdout.count("unchanged ") == 2
    bad = subprocess.run([*tool, "--apply", str(tmp_path / "missing.ipynb")], capture_output=True, text=True)
    assert bad.returncode == 2 and "no such notebook" in bad.stderr


def test_the_cell_is_plain_python_that_ipython_runs_unchanged():
    """No `%pip` magic: the magic prints pip's failure, then "you may need to restart the kernel", and carries on."""
    code = install_cell.source()
    assert "%pip install -q" not in code and "get_ipython" not in code
    assert TransformerManager().transform_cell(code).rstrip() == code.rstrip()
    compile(code, "<install cell>", "exec")


def run_cell(monkeypatch, *, platform: str | None, jax_version: str | None = "0.12.0",
             pip=None, repository: str | None = None, notebook: str | None = None):
    """Run the install cell (of ``notebook``) on a pretend platform ("colab", "kaggle" or None). ``pip`` replaces
    subprocess.run (default: record the call and succeed); ``repository`` replaces the repository URL in the cell."""
    code = install_cell.source(notebook)
    if repository is not None:
        code = code.replace(f'url = "{install_cell.REPOSITORY}"', f'url = "{repository}"')
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    if platform == "colab":
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    elif platform == "kaggle":
        monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")

    def fake_distributions(name=None, **kwargs):
        assert name == "jax", name
        return [] if jax_version is None else [types.SimpleNamespace(version=jax_version)]

    monkeypatch.setattr("importlib.metadata.distributions", fake_distributions)
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
                      f"course_lib @ git+{install_cell.REPOSITORY}@{REF}"]]
    out = capsys.readouterr().out
    assert f"installed course_lib from {REF}" in out and "restart" not in out


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


def local_repo(tmp_path, ref: str | None) -> str:
    """A git repository on disk holding a tiny installable course_lib, with the branch or tag ``ref`` if given
    (its only branch is otherwise "trunk"); its file URL."""
    repo = tmp_path / "repo"
    (repo / "course_lib").mkdir(parents=True)
    (repo / "course_lib" / "__init__.py").write_text("")
    (repo / "pyproject.toml").write_text('[project]\nname = "course_lib"\nversion = "0.0.1"\n')
    git = ["git", "-C", str(repo), "-c", "user.email=t@example.com", "-c", "user.name=t"]
    branch = ref if ref and not install_cell.is_tag(ref) else "trunk"
    subprocess.run(["git", "init", "-q", "-b", branch, str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    if ref and install_cell.is_tag(ref):
        subprocess.run([*git, "tag", ref], check=True)
    return f"file://localhost{repo}"


REAL_RUN = subprocess.run


def real_pip_dry_run(cmd, **kwargs):
    """pip really runs (clones, checks out the tag) but installs nothing into this environment."""
    return REAL_RUN([*cmd[:4], "--dry-run", "--no-deps", "--no-build-isolation", *cmd[4:]], **kwargs)


# A proxy on a closed port of this machine: git's https fetch fails at once, as it does with no network.
NO_NETWORK = {"https_proxy": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "no_proxy": "",
              "NO_PROXY": ""}


@pytest.fixture(params=["colour forced on", "colour off"])
def colour(request, monkeypatch):
    """pip's colour as a notebook kernel has it (ipykernel sets FORCE_COLOR=1), and as a terminal script has it."""
    if request.param == "colour forced on":
        monkeypatch.setenv("FORCE_COLOR", "1")
    else:
        monkeypatch.delenv("FORCE_COLOR", raising=False)
    return request.param


@pytest.mark.timeout(120)
@pytest.mark.parametrize("platform", ["colab", "kaggle"])
def test_a_missing_ref_stops_the_notebook_saying_so_with_what_git_said(monkeypatch, capsys, tmp_path, platform,
                                                                       colour):
    url = local_repo(tmp_path, ref=None)
    with pytest.raises(RuntimeError) as err:
        run_cell(monkeypatch, platform=platform, pip=real_pip_dry_run, repository=url)
    msg = str(err.value)
    listing = "tags" if KIND == "tag" else "branches"
    assert msg.startswith(f"Could not install course_lib from {REF}: there is no {KIND} {REF} (see {url}/{listing}).")
    assert f"pip said: error: pathspec '{REF}' did not match any file(s) known to git" in msg, msg
    assert "\x1b" not in msg and "See above" not in msg, msg
    assert "Internet" not in msg and "network" not in msg
    assert "restart the kernel" not in msg + capsys.readouterr().out
    assert len(msg.splitlines()) <= 4 and msg.endswith("Then run this cell again.")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("platform", ["colab", "kaggle"])
def test_no_network_stops_the_notebook_saying_so_with_what_git_said(monkeypatch, platform, colour):
    for k, v in NO_NETWORK.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(RuntimeError) as err:
        run_cell(monkeypatch, platform=platform, pip=real_pip_dry_run)
    msg = str(err.value)
    first = msg.splitlines()[0]
    assert first == (f"Could not install course_lib from {REF}: no network"
                     + (": turn Internet on in the notebook's settings." if platform == "kaggle" else "."))
    assert f"pip said: fatal: unable to access '{install_cell.REPOSITORY}/'" in msg, msg
    assert "\x1b" not in msg and "See above" not in msg and f"there is no {KIND}" not in msg, msg


@pytest.mark.timeout(120)
def test_an_unreachable_repository_stops_the_notebook_with_what_git_said(monkeypatch, tmp_path):
    with pytest.raises(RuntimeError) as err:
        run_cell(monkeypatch, platform="colab", pip=real_pip_dry_run,
                 repository=f"file://localhost{tmp_path}/no_such_repository")
    msg = str(err.value)
    assert msg.startswith(f"Could not install course_lib from {REF}: pip failed.")
    assert "fatal:" in msg and "no_such_repository" in msg, msg


@pytest.mark.timeout(180)
def test_inside_a_notebook_kernel_with_colour_on_the_two_failures_say_why(tmp_path):
    """What the review saw: in a kernel pip writes in colour, and the cell showed "See above for output" for
    both failures. Here the cell runs in a real ipykernel (FORCE_COLOR=1, as ipykernel sets it), pip really
    runs (a dry run, so nothing is installed): once against a repository without the tag, once with no network."""
    jupyter_client = pytest.importorskip("jupyter_client")
    url = local_repo(tmp_path, ref=None)
    preamble = ("import subprocess, sys, types\n"
                "sys.modules['google.colab'] = types.ModuleType('google.colab')\n"
                "_run = subprocess.run\n"
                "subprocess.run = lambda cmd, **kw: _run([*cmd[:4], '--dry-run', '--no-deps', "
                "'--no-build-isolation', *cmd[4:]], **kw)\n"
                "import os; print('FORCE_COLOR', os.environ.get('FORCE_COLOR'))")
    cell = install_cell.source()
    km = jupyter_client.KernelManager(kernel_name="python3")
    km.start_kernel(env={**os.environ, **NO_NETWORK, "FORCE_COLOR": "1"}, cwd=str(tmp_path))
    try:
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)

        def run(code):
            outputs = []
            kc.execute_interactive(code, timeout=90, output_hook=lambda m: outputs.append(m))
            return {"text": "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream"),
                    "error": next((m["content"] for m in outputs if m["msg_type"] == "error"), None)}

        assert "FORCE_COLOR 1" in run(preamble)["text"]
        no_tag = run(cell.replace(f'url = "{install_cell.REPOSITORY}"', f'url = "{url}"'))["error"]
        no_network = run(cell)["error"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert no_tag and no_network, "the cell did not stop the notebook"
    assert no_tag["ename"] == no_network["ename"] == "RuntimeError"
    assert no_tag["evalue"].startswith(f"Could not install course_lib from {REF}: there is no {KIND} {REF}")
    assert f"error: pathspec '{REF}' did not match" in no_tag["evalue"], no_tag["evalue"]
    assert no_network["evalue"].startswith(f"Could not install course_lib from {REF}: no network.")
    assert "fatal: unable to access" in no_network["evalue"], no_network["evalue"]
    for e in (no_tag, no_network):
        assert "\x1b" not in e["evalue"] and "See above" not in e["evalue"], e["evalue"]


@pytest.mark.timeout(120)
def test_the_real_pip_path_succeeds_against_a_repository_that_has_the_ref(monkeypatch, capsys, tmp_path):
    """The same cell and the same pip call succeed once the ref is there (a dry run: nothing is installed)."""
    run_cell(monkeypatch, platform="kaggle", pip=real_pip_dry_run, repository=local_repo(tmp_path, ref=REF))
    assert f"installed course_lib from {REF}" in capsys.readouterr().out


def test_kaggle_without_internet_says_to_turn_it_on(monkeypatch):
    """What pip prints on a Kaggle kernel with Internet off (git cannot resolve github.com), in colour."""
    red, bold, end = "\x1b[1;31m", "\x1b[1m", "\x1b[0m"
    stderr = (f"  {red}error{end}: {bold}subprocess-exited-with-error{end}\n\n  × git clone --filter=blob:none --quiet "
              f"{install_cell.REPOSITORY} /tmp/pip-install-x/course-lib did not run successfully.\n"
              "  │ exit code: 128\n  ╰─> [1 lines of output]\n"
              f"  \x1b[31m   {end} fatal: unable to access '{install_cell.REPOSITORY}/': Could not resolve host: "
              "github.com\n      [end of output]\n\n  \x1b[1;35mnote\x1b[0m: This error originates from a subprocess, and "
              f"is likely not a problem with pip.\n{red}error{end}: {bold}subprocess-exited-with-error{end}\n")
    with pytest.raises(RuntimeError) as err:
        run_cell(monkeypatch, platform="kaggle",
                 pip=lambda cmd, **k: subprocess.CompletedProcess(cmd, 1, "", stderr))
    msg = str(err.value)
    assert msg.splitlines()[0] == (f"Could not install course_lib from {REF}: no network: "
                                   "turn Internet on in the notebook's settings.")
    assert "pip said: fatal: unable to access" in msg and "Could not resolve host: github.com" in msg
    assert "subprocess-exited" not in msg and "\x1b" not in msg and msg.endswith("Then run this cell again.")


JAX_REQUIRES = ["jaxlib<=0.12.0.1,>=0.12.0.1", 'jaxlib<=0.12.0.1,>=0.12.0.1; extra == "tpu"',
                'libtpu==0.0.50.*; extra == "tpu"', 'requests; extra == "tpu"']


@pytest.mark.parametrize("requires, has_libtpu, machine, wanted", [
    (JAX_REQUIRES, False, "x86_64", "libtpu==0.0.50.*"),              # the libtpu this JAX pins
    (JAX_REQUIRES[:1], False, "x86_64", install_cell.LIBTPU),          # a JAX that names none: the course's pin
    (JAX_REQUIRES, True, "x86_64", None),                               # already there
    (JAX_REQUIRES, False, "aarch64", None),                             # no wheels for this machine
])
def test_lesson_13s_cell_installs_the_tpu_compiler_where_it_is_missing(monkeypatch, capsys, requires, has_libtpu,
                                                                        machine, wanted):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.metadata, "requires", lambda name: requires if name == "jax" else None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        (object() if has_libtpu else None) if name == "libtpu" else real_find_spec(name, *a)))
    monkeypatch.setattr("platform.machine", lambda: machine)
    calls = run_cell(monkeypatch, platform="colab", notebook=TPU_NOTEBOOK)
    assert calls[0][-1] == f"course_lib @ git+{install_cell.REPOSITORY}@{REF}"
    assert [c[-1] for c in calls[1:]] == ([wanted] if wanted else [])
    out = capsys.readouterr().out
    assert (f"installed {wanted} (lesson 13's TPU compiler)" in out) == bool(wanted), out
    assert run_cell(monkeypatch, platform=None, notebook=TPU_NOTEBOOK) == [], "elsewhere it does nothing"


def test_a_failed_libtpu_install_stops_lesson_13_saying_why(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "requires", lambda name: JAX_REQUIRES)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "libtpu" else real_find_spec(name, *a))
    monkeypatch.setattr("platform.machine", lambda: "x86_64")

    def pip(cmd, **kwargs):
        if cmd[-1].startswith("libtpu"):
            return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for libtpu\n")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    with pytest.raises(RuntimeError) as err:
        run_cell(monkeypatch, platform="kaggle", pip=pip, notebook=TPU_NOTEBOOK)
    msg = str(err.value)
    assert msg.startswith("Could not install libtpu==0.0.50.* (lesson 13's TPU compiler): pip failed.")
    assert "No matching distribution found for libtpu" in msg and msg.endswith("Then run this cell again.")
