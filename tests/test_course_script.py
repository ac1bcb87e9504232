"""./course.sh: finding a Python, the `dot` check, idempotent set-up, and JupyterLab on localhost with a token."""

import json
import os
import pathlib
import platform
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import stop_process_group

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "course.sh"
# What the script needs from the system, and nothing else: no python3.12, no dot, no pyenv, no uv.
TOOLS = ["bash", "cat", "dirname", "ls", "sort", "sed", "uname", "mktemp", "rm", "grep", "id", "printf"]


def sandbox_path(tmp_path, fakes: dict[str, str]) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        if shutil.which(tool) and tool not in fakes:
            (bin_dir / tool).symlink_to(shutil.which(tool))
    for name, body in fakes.items():
        fake = bin_dir / name
        assert not fake.is_symlink(), "a fake is a file of its own: writing through a link would replace the tool"
        fake.write_text("#!" + shutil.which("bash") + "\n" + body + "\n")
        fake.chmod(0o755)
    return str(bin_dir)


def run_script(tmp_path, args, fakes, env=None):
    full_env = {"PATH": sandbox_path(tmp_path, fakes), "HOME": str(tmp_path), "PYENV_ROOT": str(tmp_path / "pyenv"),
                "COURSE_VENV": str(tmp_path / "venv"), **(env or {})}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=full_env, timeout=60)


OLD_PYTHON = 'echo "Python 3.11.7"; exit 1'  # a python3 that is too old: fails the version check
HAS_DOT = 'echo "dot - graphviz version 2.43.0"'


def test_no_suitable_python_stops_with_how_to_get_one(tmp_path):
    r = run_script(tmp_path, ["setup"], {"python3": OLD_PYTHON, "dot": HAS_DOT})
    assert r.returncode == 1
    assert "no Python >= 3.12 found" in r.stderr
    for way in ["pyenv install 3.12", "uv python install 3.12", "brew install python@3.12",
                "conda env create -f environment.yml", "PYTHON=/path/to/python3.12 ./course.sh setup"]:
        assert way in r.stderr
    assert not (tmp_path / "venv").exists()


def test_an_unsuitable_PYTHON_is_named(tmp_path):
    r = run_script(tmp_path, ["test"], {"python3": OLD_PYTHON, "dot": HAS_DOT},
                   env={"PYTHON": str(tmp_path / "bin" / "python3")})
    assert r.returncode == 1
    assert f"PYTHON={tmp_path / 'bin' / 'python3'} is not a Python >= 3.12" in r.stderr


def test_missing_dot_without_root_gives_the_install_line(tmp_path):
    r = run_script(tmp_path, ["setup"], {"id": 'echo 1000', "apt-get": 'exit 99'})
    assert r.returncode == 1
    assert "graphviz's `dot` binary is missing" in r.stderr
    assert "sudo apt-get install -y graphviz" in r.stderr


def test_missing_dot_as_root_installs_with_apt_or_says_it_could_not(tmp_path):
    log = tmp_path / "apt.log"
    r = run_script(tmp_path, ["setup"], {"id": 'echo 0', "apt-get": f'echo "$@" >> {log}; exit 100'})
    assert r.returncode == 1
    assert "update" in log.read_text(), "as root with apt-get it tries to install graphviz itself"
    assert "apt-get could not install graphviz; run: apt-get install -y graphviz" in r.stderr


def test_setup_again_installs_nothing():
    """The test run itself came through ./course.sh, so the environment is set up: a second set-up is a no-op."""
    r = subprocess.run([str(SCRIPT), "setup"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "installing" not in r.stderr and "creating" not in r.stderr
    assert re.search(r"ready: Python 3\.1[2-9]\.\d+ JAX 0\.\d+", r.stderr)


def test_help_lists_the_commands():
    r = subprocess.run([str(SCRIPT), "help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    for cmd in ["lab", "test", "refresh", "setup", "check", "tpu", "lock", "compat", "site", "release-check"]:
        assert f"./course.sh {cmd}" in r.stdout
    assert subprocess.run([str(SCRIPT), "nonsense"], capture_output=True, timeout=30).returncode == 2


def recording_venv(tmp_path) -> tuple[pathlib.Path, pathlib.Path]:
    """A virtual environment whose python records `pip install` calls (and installs nothing), and runs anything
    else with this test's Python; and the log of pip calls."""
    import sys
    venv, log = tmp_path / "venv", tmp_path / "pip.log"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(
        "#!/bin/bash\n"
        f'if [ "$1 $2" = "-m pip" ]; then echo "${{@: -1}}" >> {log}; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n')
    (venv / "bin" / "python").chmod(0o755)
    return venv, log


def test_setup_installs_the_learners_extra_only_and_test_adds_every_other(tmp_path):
    """The lean set-up: `setup` installs course_lib with the extra "lab" only; `test` adds the test tools, the
    site, lesson 13's compiler and the instructor's tools; a later `setup` removes nothing and installs nothing."""
    venv, log = recording_venv(tmp_path)
    env = {**os.environ, "COURSE_VENV": str(venv), "PYTHONPATH": str(ROOT)}

    def course(*args):
        r = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        return r

    course("setup")
    assert log.read_text().splitlines() == [".[lab]"]
    assert (venv / ".course-stamp").read_text().splitlines()[1] == "lab"
    course("setup")
    assert log.read_text().splitlines() == [".[lab]"], "a second set-up installs nothing"
    if platform.system() == "Linux" and platform.machine() == "x86_64":
        r = course("tpu")
        assert log.read_text().splitlines()[-1] == ".[lab,tpu]"
        assert "lesson 13 (TPU compiler)" in r.stdout, "then it checks the compiler"
    r = course("test", "--version")
    assert "pytest" in r.stdout + r.stderr
    assert log.read_text().splitlines()[-1] == ".[lab,test,site,tpu,instructor]"
    n = len(log.read_text().splitlines())
    course("setup")
    assert len(log.read_text().splitlines()) == n, "after test, setup keeps every extra and installs nothing"


def test_tpu_elsewhere_than_linux_x86_64_says_why_and_where_to_go(tmp_path):
    r = run_script(tmp_path, ["tpu"], {"python3": OLD_PYTHON, "dot": HAS_DOT,
                                       "uname": 'case "$1" in -s) echo Darwin;; -m) echo arm64;; esac'})
    assert r.returncode == 1
    assert "has wheels for Linux x86-64 only, and this is Darwin arm64" in r.stderr
    assert "Colab or Kaggle" in r.stderr
    assert not (tmp_path / "venv").exists(), "nothing was installed"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def non_loopback_address():
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            addr = s.getsockname()[0]
        return None if addr.startswith("127.") else addr
    except OSError:
        return None


def get(url, token=None):
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"} if token else {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
    try:
        with opener.open(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


@pytest.mark.timeout(180)
def test_lab_binds_to_localhost_with_a_token_and_opens_notebook_00(tmp_path):
    port = free_port()
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path), "BROWSER": "true"}
    proc = subprocess.Popen([str(SCRIPT), "lab", "--no-browser", f"--port={port}"], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, env=env, start_new_session=True)
    try:
        url = None
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                pytest.fail(f"jupyter lab exited with {proc.returncode}")
            m = re.search(r"(http://\S+:\d+/\S*\?token=(\w+))", line)
            if m:
                url, token = m.group(1), m.group(2)
        assert url, "jupyter lab printed no URL with a token"
        assert url.startswith(f"http://127.0.0.1:{port}/lab/tree/notebooks/00_setup_and_devices.ipynb?token=")
        assert len(token) >= 32

        base = f"http://127.0.0.1:{port}"
        nb_api = f"{base}/api/contents/notebooks/00_setup_and_devices.ipynb"
        assert get(nb_api)[0] == 403, "without the token the server refuses"
        status, body = get(nb_api, token)
        assert status == 200
        content = json.loads(body)["content"]
        assert content["cells"][0]["source"].startswith("# 00")
        assert get(f"{base}/lab/tree/notebooks/00_setup_and_devices.ipynb?token={token}")[0] == 200

        addr = non_loopback_address()
        if addr:
            with pytest.raises(OSError):
                socket.create_connection((addr, port), timeout=3).close()
    finally:
        stop_process_group(proc, timeout=30)
    assert proc.poll() is not None
