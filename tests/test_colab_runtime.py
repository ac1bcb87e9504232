"""A simulated Colab runtime runs the first cells of lessons 00 and 13: their install cell installs course_lib from
the one git ref (of a local clone), and lesson 13's also installs its TPU compiler, which then compiles for TPUs.

The simulation, offline and cheap (about 30 s here):
- Colab's preinstalled packages: this environment's site-packages without course_lib and libtpu, as a folder of
  links that a fresh virtual environment sees through a .pth file (nothing is copied or downloaded);
- Colab itself: a `google.colab` module, imported before the cells run, as Colab's kernel has it;
- GitHub: a local git repository holding this checkout's course_lib (pyproject, README, the package) on a branch
  (or tag) named as the ref, which the cell's URL is pointed at, `git+file://`;
- PyPI: pip runs with no index and a local folder of wheels. libtpu is a 220 MB download and 640 MB installed, so
  the folder holds a stand-in wheel of the same name and version whose module is this environment's real libtpu
  (its ``libtpu.so``): the cell's decision (Linux x86-64, missing, the version this JAX pins) and pip's install
  are real, and so is the compile for TPU chips that lesson 13's third code cell makes with it.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import zipfile
import importlib.metadata
import importlib.util

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import install_cell  # noqa: E402

NOTEBOOKS = ROOT / "notebooks"
LESSON_00 = NOTEBOOKS / "00_setup_and_devices.ipynb"
LESSON_13 = NOTEBOOKS / "13_compile_for_a_tpu_pod.ipynb"

DRIVER = r'''
import json, sys
import google.colab  # Colab's kernel has imported it before the first cell
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance(colors="NoColor")
path, n, url = sys.argv[1], int(sys.argv[2]), sys.argv[3]
code = [c for c in json.load(open(path))["cells"] if c["cell_type"] == "code"][:n]
for i, cell in enumerate(code):
    source = "".join(cell["source"]).replace('url = "@REPOSITORY@"', f'url = "{url}"')
    print(f"--- code cell {i}", flush=True)
    if not shell.run_cell(source).success:
        sys.exit(f"code cell {i} of {path} failed")
'''.replace("@REPOSITORY@", install_cell.REPOSITORY)


def preinstalled(tmp_path) -> pathlib.Path:
    """Links to this environment's installed packages, less course_lib and libtpu."""
    farm = tmp_path / "preinstalled"
    farm.mkdir()
    for entry in pathlib.Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name.lower()
        if name.startswith(("course_lib", "course-lib", "__editable__", "libtpu", "__pycache__")) or name.endswith(
                ".pth"):
            continue
        (farm / entry.name).symlink_to(entry)
    return farm


def colab_venv(tmp_path, farm) -> pathlib.Path:
    venv = tmp_path / "colab"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    stub = tmp_path / "stub"
    (stub / "google" / "colab").mkdir(parents=True)  # `google` stays a namespace package (protobuf's is one too)
    (stub / "google" / "colab" / "__init__.py").write_text('"""A stand-in for Colab\'s module."""\n')
    # JAX's debugger imports google.colab.output when it sees google.colab (it uses it only when called).
    (stub / "google" / "colab" / "output.py").write_text('"""A stand-in for Colab\'s output module."""\n')
    site = pathlib.Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; "
                                        "print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True,
                                       check=True).stdout.strip())
    (site / "colab_preinstalled.pth").write_text(f"{stub}\n{farm}\n")
    return venv


def local_github(tmp_path) -> str:
    """A git repository with this checkout's course_lib at the ref the notebooks install from; its URL."""
    repo = tmp_path / "github"
    repo.mkdir()
    for name in ["pyproject.toml", "README.md", "LICENSE"]:
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, repo / name)
    shutil.copytree(ROOT / "course_lib", repo / "course_lib", ignore=shutil.ignore_patterns("__pycache__"))
    ref = install_cell.REF
    git = ["git", "-C", str(repo), "-c", "user.email=t@example.com", "-c", "user.name=t"]
    branch = "trunk" if install_cell.is_tag(ref) else ref
    subprocess.run(["git", "init", "-q", "-b", branch, str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "course_lib"], check=True)
    if install_cell.is_tag(ref):
        subprocess.run([*git, "tag", ref], check=True)
    return f"file://localhost{repo}"


def libtpu_stand_in(wheels: pathlib.Path) -> str:
    """A wheel named libtpu, at the installed libtpu's version, whose module is the installed one; its version."""
    real = pathlib.Path(importlib.util.find_spec("libtpu").origin).parent
    version = importlib.metadata.version("libtpu")
    wheels.mkdir()
    module = (f'"""A test stand-in: the libtpu installed at {real}."""\nimport os\n'
              f"__path__ = [{str(real)!r}]\n__version__ = {version!r}\n\n"
              "def get_library_path():\n    return os.path.join(__path__[0], 'libtpu.so')\n\n"
              "def configure_library_path():\n    os.environ.setdefault('TPU_LIBRARY_PATH', get_library_path())\n\n"
              "configure_library_path()\n")
    info = f"libtpu-{version}.dist-info"
    files = {"libtpu/__init__.py": module,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: libtpu\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(wheels / f"libtpu-{version}-py3-none-any.whl", "w") as whl:
        for name, text in files.items():
            whl.writestr(name, text)
    return version


def run_cells(venv, notebook, n, url, env, cwd):
    return subprocess.run([str(venv / "bin" / "python"), "-c", DRIVER, str(notebook), str(n), url],
                          capture_output=True, text=True, env=env, timeout=400, cwd=cwd)


@pytest.mark.timeout(600)
def test_a_simulated_colab_runtime_runs_the_first_cells_of_lessons_00_and_13(tmp_path):
    farm = preinstalled(tmp_path)
    venv = colab_venv(tmp_path, farm)
    url = local_github(tmp_path)
    has_libtpu = importlib.util.find_spec("libtpu") is not None
    version = libtpu_stand_in(tmp_path / "wheels") if has_libtpu else None
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "wheels"),
           "PIP_NO_BUILD_ISOLATION": "0",  # pip's spelling of --no-build-isolation: Colab's setuptools builds it
           "PIP_CACHE_DIR": str(tmp_path / "pip-cache"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env["MPLCONFIGDIR"] = str(tmp_path / "mpl")
    venv_python = str(venv / "bin" / "python")
    probe = "import importlib.util as u; print(u.find_spec('course_lib'), u.find_spec('libtpu'))"
    content = tmp_path / "content"  # Colab's working directory
    content.mkdir()
    assert subprocess.run([venv_python, "-c", probe], capture_output=True, text=True, env=env, cwd=content,
                          check=True).stdout.split() == ["None", "None"], "the runtime starts without them"

    r = run_cells(venv, LESSON_00, 3, url, env, content)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ref = install_cell.REF
    assert f"installing course_lib from {ref} ...\ninstalled course_lib from {ref}" in r.stdout
    assert "Using 8 simulated CPU devices" in r.stdout, r.stdout
    assert "libtpu" not in r.stdout, "lesson 00's cell installs course_lib only"
    where = subprocess.run([venv_python, "-c", "import course_lib; print(course_lib.__file__)"],
                           capture_output=True, text=True, env=env, cwd=content, check=True).stdout
    assert where.startswith(str(venv)), f"course_lib came from {where}, not from the install cell"

    r = run_cells(venv, LESSON_13, 3, url, env, content)
    out = r.stdout
    assert r.returncode == 0, out[-3000:] + r.stderr[-3000:]
    if has_libtpu:
        assert "installed libtpu==" in out and "(lesson 13's TPU compiler)" in out, out
        assert f"TPU compiler: libtpu {version}; v5e:2x4 gives 8 compile-only" in out, out
        assert "skipped" not in out
    else:  # this machine cannot hold libtpu (the cell skips it on anything but Linux x86-64)
        assert "TPU compiler" not in out or "skipped" in out
