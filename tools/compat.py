"""./course.sh compat: does the course work on the oldest supported JAX and on the newest one?

    ./course.sh compat                  # oldest (newest 0.11.x patch) and newest JAX on the package index
    ./course.sh compat newest           # only the newest (the weekly CI job)
    ./course.sh compat 0.11.0 0.12.0    # given versions

For each JAX it builds a throwaway virtual environment under $COMPAT_DIR (default /tmp/course-compat) with that
jax and jaxlib and course_lib's other dependencies unpinned (what a learner installing today gets), runs the unit
tests and executes every notebook top to bottom on 8 simulated CPU devices. It fails on errors, not on output
differences (stored outputs were made with the pinned versions). It prints one table: a row per check, a column
per JAX version. The unit tests of ./course.sh itself and the browser test are left out (they need the course's
own environment). Exit status 1 if anything failed.
"""

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parent.parent
MIN_JAX = "0.11"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SKIPPED_TESTS = ["tests/test_course_script.py", "tests/test_browser.py"]


def env_for_run() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "PYTHONPATH", "VIRTUAL_ENV"))}
    env.update(JAX_NUM_CPU_DEVICES="8", JAX_PLATFORMS="cpu", PYDEVD_DISABLE_FILE_VALIDATION="1")
    return env


def requirement(target: str) -> list[str]:
    if target == "oldest":
        return [f"jax~={MIN_JAX}.0", f"jaxlib~={MIN_JAX}.0"]
    if target == "newest":
        return ["jax", "jaxlib"]
    return [f"jax=={target}", f"jaxlib=={target}"]


def build(target: str, base: pathlib.Path) -> pathlib.Path:
    venv = base / f"jax-{target}"
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-e", f"{ROOT}[test]",
                    *requirement(target)], check=True, cwd=ROOT)
    return py


def unit_tests(py: pathlib.Path, work: pathlib.Path) -> str:
    report = work / "junit.xml"
    cmd = [str(py), "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
           *[f"--ignore={t}" for t in SKIPPED_TESTS]]
    r = subprocess.run(cmd, cwd=ROOT, env=env_for_run(), capture_output=True, text=True, timeout=3600)
    if not report.exists():
        return f"ERROR (pytest exit {r.returncode}): {r.stdout[-300:]}{r.stderr[-300:]}"
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    n, failed = int(suite.get("tests")), int(suite.get("failures")) + int(suite.get("errors"))
    skipped = int(suite.get("skipped"))
    names = [f"{c.get('name')}" for c in suite.iter("testcase") if c.find("failure") is not None
             or c.find("error") is not None]
    text = f"{n - failed - skipped} passed, {skipped} skipped"
    return text if not failed else f"FAILED {failed}: {', '.join(names[:5])}; {text}"


def run_notebook(path: pathlib.Path) -> dict:
    """Executed inside the throwaway environment: run one notebook, report the first error."""
    import nbclient
    import nbclient.exceptions
    import nbformat
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()  # the notebook file is not written
        return {"ok": True}
    except nbclient.exceptions.CellExecutionError as e:
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        return {"ok": False, "error": (lines[-1] if lines else "cell failed")[:200]}
    except Exception as e:  # a dead kernel, a timeout
        return {"ok": False, "error": f"{type(e).__name__}: {e}"[:200]}


def notebooks(py: pathlib.Path) -> dict[str, str]:
    out = {}
    for path in NOTEBOOKS:
        r = subprocess.run([str(py), __file__, "--run-notebook", str(path)], cwd=ROOT, env=env_for_run(),
                           capture_output=True, text=True, timeout=3600)
        try:
            res = json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            res = {"ok": False, "error": f"runner exit {r.returncode}: {r.stderr.strip()[-200:]}"}
        out[path.name] = "ok" if res["ok"] else f"FAILED: {res['error']}"
        print(f"  {path.name}: {out[path.name]}", flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", default=["oldest", "newest"])
    parser.add_argument("--run-notebook", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_notebook:
        print(json.dumps(run_notebook(args.run_notebook)))
        return 0
    base = pathlib.Path(os.environ.get("COMPAT_DIR", "/tmp/course-compat"))
    base.mkdir(parents=True, exist_ok=True)
    columns = {}
    for target in args.targets:
        print(f"[compat] building an environment for JAX {target} in {base}", flush=True)
        try:
            py = build(target, base)
        except subprocess.CalledProcessError as e:
            columns[target] = {"unit tests": f"FAILED: could not install ({e})"}
            continue
        version = subprocess.run([str(py), "-c", "import jax, jaxlib; print(jax.__version__)"], env=env_for_run(),
                                 capture_output=True, text=True).stdout.strip() or target
        print(f"[compat] JAX {version}: unit tests", flush=True)
        col = {"unit tests": unit_tests(py, base / f"jax-{target}")}
        print(f"  {col['unit tests']}", flush=True)
        print(f"[compat] JAX {version}: notebooks", flush=True)
        col.update(notebooks(py))
        columns[f"{version} ({target})" if target in ("oldest", "newest") else version] = col
    rows = ["unit tests"] + [p.name for p in NOTEBOOKS]
    print()
    print("| check | " + " | ".join(f"JAX {c}" for c in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for row in rows:
        print(f"| {row} | " + " | ".join(col.get(row, "not run") for col in columns.values()) + " |")
    failed = any(not (v == "ok" or v.startswith(tuple("0123456789"))) for col in columns.values()
                 for v in col.values())
    print(f"\n[compat] {time.strftime('%Y-%m-%d')}: {'FAILED' if failed else 'all passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
