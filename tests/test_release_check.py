"""The release check (tools/release_check.py, ./course.sh release-check): the released commit must carry the tag
v<__version__>, and the ref every notebook's install cell installs from (pyproject's [tool.course] ref) must exist:
a tag ref must be there (and be this release's), a branch ref too. CI runs it on every pushed tag."""

import json
import pathlib
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "release_check.py"


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
                   check=True, capture_output=True)


def make_repo(tmp_path, version="1.2.3", pinned=None, ref=None):
    """A repository with course_lib/__init__.py at ``version``, pyproject's install ref ``ref`` (default
    v<version>) and one notebook installing from ``pinned`` (default: the ref); its branch is main."""
    repo = tmp_path / "repo"
    (repo / "course_lib").mkdir(parents=True)
    (repo / "notebooks").mkdir()
    (repo / "course_lib" / "__init__.py").write_text(f'"""doc"""\n\n__version__ = "{version}"\n')
    ref = ref or f"v{version}"
    (repo / "pyproject.toml").write_text(f'[project]\nname = "x"\n\n[tool.course]\nref = "{ref}"\n')
    cell = f'pip_install(f"course_lib @ git+{{url}}@{pinned or ref}", "course_lib from {pinned or ref}")'
    nb = {"cells": [{"cell_type": "markdown", "source": ["# 00"]}, {"cell_type": "code", "source": [cell]}]}
    (repo / "notebooks" / "00_x.ipynb").write_text(json.dumps(nb))
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "release")
    return repo


def check(repo, *args):
    return subprocess.run([sys.executable, str(SCRIPT), "--repo", str(repo), *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("annotated", [True, False])
def test_a_commit_tagged_v_version_passes(tmp_path, annotated):
    repo = make_repo(tmp_path)
    git(repo, "tag", *(["-a", "-m", "v1.2.3"] if annotated else []), "v1.2.3")
    r = check(repo)
    assert r.returncode == 0, r.stderr
    assert "HEAD is tagged v1.2.3" in r.stdout
    assert check(repo, "--pushed-tag", "v1.2.3").returncode == 0


def test_no_tag_fails_and_says_how_to_tag(tmp_path):
    repo = make_repo(tmp_path)
    r = check(repo)
    assert r.returncode == 1
    assert "is not tagged v1.2.3" in r.stderr and "there is no tag v1.2.3" in r.stderr
    assert "git tag -a v1.2.3 -m v1.2.3" in r.stderr and "git push origin v1.2.3" in r.stderr


def test_the_tag_on_an_older_commit_fails(tmp_path):
    repo = make_repo(tmp_path)
    git(repo, "tag", "v1.2.3")
    (repo / "later.txt").write_text("x")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "later")
    r = check(repo)
    assert r.returncode == 1 and "the tag v1.2.3 exists but points at" in r.stderr
    assert check(repo, "--commit", "HEAD~1").returncode == 0, "the tagged commit itself passes"


def test_a_tag_of_another_version_fails(tmp_path):
    repo = make_repo(tmp_path)
    git(repo, "tag", "v1.2.4")
    r = check(repo, "--pushed-tag", "v1.2.4")
    assert r.returncode == 1
    assert "its tags: v1.2.4" in r.stderr
    assert "the pushed tag v1.2.4 is not v<__version__> = v1.2.3" in r.stderr


def test_notebooks_installing_another_ref_than_pyproject_says_fail(tmp_path):
    repo = make_repo(tmp_path, version="1.2.3", pinned="v1.2.2")
    git(repo, "tag", "v1.2.3")
    r = check(repo)
    assert r.returncode == 1
    assert "notebooks/00_x.ipynb: its install cell (cell 1) does not install course_lib from v1.2.3" in r.stderr
    assert "python tools/install_cell.py --apply" in r.stderr


def test_a_tag_ref_must_exist_in_the_repository(tmp_path):
    """The release's own tag is there, but the ref the notebooks install from is a tag that is not."""
    repo = make_repo(tmp_path, version="1.2.3", ref="v1.2.2")
    git(repo, "tag", "v1.2.3")
    r = check(repo)
    assert r.returncode == 1
    assert "install course_lib from the tag v1.2.2" in r.stderr and "does not exist in this repository" in r.stderr
    git(repo, "tag", "v1.2.2")
    r = check(repo)
    assert r.returncode == 1 and "not from this release v1.2.3" in r.stderr, "an older tag is another commit"


def test_a_branch_ref_passes_when_the_branch_exists(tmp_path):
    repo = make_repo(tmp_path, version="1.2.3", ref="main")
    git(repo, "tag", "v1.2.3")
    r = check(repo)
    assert r.returncode == 0, r.stderr
    assert "its notebooks install course_lib from the branch main" in r.stdout
    missing = make_repo(tmp_path / "other", version="1.2.3", ref="stable")
    git(missing, "tag", "v1.2.3")
    r = check(missing)
    assert r.returncode == 1 and "the branch stable" in r.stderr and "does not exist" in r.stderr


def test_this_repository_notebooks_install_its_ref():
    """Whatever the tags here, the notebooks of this checkout install pyproject's ref (the rest is tested above)."""
    r = check(ROOT)
    assert "install cell" not in r.stderr, r.stderr


def test_course_sh_runs_it():
    r = subprocess.run([str(ROOT / "course.sh"), "release-check", "--commit", "HEAD"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode in (0, 1)
    assert ("release check failed" in r.stderr) == (r.returncode == 1)


def test_ci_runs_it_on_tags():
    doc = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())
    jobs = [job for job in doc["jobs"].values()
            if any("release-check" in s.get("run", "") for s in job["steps"])]
    assert len(jobs) == 1, "one CI job runs ./course.sh release-check"
    job = jobs[0]
    assert "startsWith(github.ref, 'refs/tags/v')" in job["if"]
    run = " ".join(s.get("run", "") for s in job["steps"])
    assert '--pushed-tag "$GITHUB_REF_NAME"' in run
    checkout = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout"))
    assert checkout.get("with", {}).get("fetch-depth") == 0, "the tags must be fetched"
