"""The release check: the commit being released must carry the tag ``v<course_lib.__version__>``, and the git ref
that its notebooks install course_lib from must exist in the repository.

    python3 tools/release_check.py                    # is HEAD tagged v<version>?   (./course.sh release-check)
    python3 tools/release_check.py --commit REF       # another commit
    python3 tools/release_check.py --pushed-tag v0.2.0  # CI, on a tag push: that tag must be v<version> too

Every notebook's install cell (tools/install_cell.py) installs course_lib, on Colab and Kaggle, from one git ref:
``[tool.course] ref`` in pyproject.toml, which every launch button opens too. ``main`` on main; a release may set
its own tag ``v<version>`` there, so that its notebooks install its own course_lib. A ref that does not exist
breaks the first cell of every lesson there, so: a tag ref must exist (and be this release's tag), a branch ref
must exist, and every notebook's cell 1 must install that ref. To release: set ``__version__`` in
course_lib/__init__.py (and, to pin the release's notebooks to it, ``ref = "v<version>"``), run ``python
tools/install_cell.py --apply``, commit, then ``git tag -a v<version> -m v<version>`` and ``git push origin
v<version>``. CI runs this on every pushed tag. Exit status 0 when all holds, 1 (with what to do) when not.
Standard library only.
"""

import argparse
import json
import pathlib
import re
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def version(repo: pathlib.Path) -> str:
    """course_lib's ``__version__``, read from the source of ``repo`` (without importing it)."""
    for line in (repo / "course_lib" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise SystemExit(f"{repo / 'course_lib' / '__init__.py'} has no __version__ line")


def install_ref(repo: pathlib.Path) -> str:
    """The git ref the notebooks install course_lib from: pyproject.toml's ``[tool.course] ref``."""
    try:
        return tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["course"]["ref"]
    except (FileNotFoundError, KeyError) as e:
        raise SystemExit(f"{repo / 'pyproject.toml'} has no [tool.course] ref (the notebooks' install ref): {e}")


def is_tag(ref: str) -> bool:
    return re.fullmatch(r"v\d+(\.\d+)*", ref) is not None


def git(repo: pathlib.Path, *args: str) -> str:
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"release check: git {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout.strip()


def problems(repo: pathlib.Path, commit: str = "HEAD", pushed_tag: str | None = None) -> list[str]:
    """Why ``commit`` of ``repo`` is not a release of its own version; empty when it is."""
    want = f"v{version(repo)}"
    sha = git(repo, "rev-parse", "--verify", f"{commit}^{{commit}}")
    tags = git(repo, "tag", "--points-at", sha).split()
    found = []
    if want not in tags:
        elsewhere = git(repo, "tag", "--list", want)
        where = (f"the tag {want} exists but points at {git(repo, 'rev-parse', '--short', want + '^{commit}')}"
                 if elsewhere else f"there is no tag {want}")
        found.append(f"{commit} ({sha[:12]}) is not tagged {want}, the version in course_lib/__init__.py: {where}"
                     + (f"; its tags: {', '.join(tags)}" if tags else "")
                     + f". Tag it: git tag -a {want} -m {want} {sha[:12]} && git push origin {want}")
    ref = install_ref(repo)
    fix = "set [tool.course] ref in pyproject.toml, run python tools/install_cell.py --apply, and commit"
    if is_tag(ref):
        if not git(repo, "tag", "--list", ref):
            found.append(f"the notebooks install course_lib from the tag {ref} (pyproject.toml's [tool.course] "
                         f"ref), which does not exist in this repository: every lesson's first cell would fail "
                         f"on Colab and Kaggle. Create it, or {fix}")
        elif ref != want:
            found.append(f"the notebooks install course_lib from the tag {ref}, not from this release {want}: "
                         f"{fix} (ref = \"{want}\", or \"main\")")
    elif not git(repo, "for-each-ref", "--format=%(refname)", f"refs/heads/{ref}", f"refs/remotes/*/{ref}"):
        found.append(f"the notebooks install course_lib from the branch {ref} (pyproject.toml's [tool.course] "
                     f"ref), which does not exist in this repository (fetch it, or {fix})")
    for nb in sorted((repo / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        if len(cells) < 2 or f'@{ref}"' not in "".join(cells[1]["source"]):
            found.append(f"notebooks/{nb.name}: its install cell (cell 1) does not install course_lib from {ref}: "
                         "run python tools/install_cell.py --apply and commit")
    if pushed_tag is not None and pushed_tag != want:
        found.append(f"the pushed tag {pushed_tag} is not v<__version__> = {want}: set __version__ in "
                     f"course_lib/__init__.py, run python tools/install_cell.py, commit, and tag that commit {want}")
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=pathlib.Path, default=ROOT, help="the checkout to check (default: this one)")
    ap.add_argument("--commit", default="HEAD", help="the commit being released (default HEAD)")
    ap.add_argument("--pushed-tag", help="the tag whose push started this run (CI: $GITHUB_REF_NAME)")
    args = ap.parse_args(argv)
    found = problems(args.repo, args.commit, args.pushed_tag)
    for p in found:
        print(f"release check failed: {p}", file=sys.stderr)
    if not found:
        ref = install_ref(args.repo)
        print(f"release check: {args.commit} is tagged v{version(args.repo)}; its notebooks install course_lib "
              f"from {'the tag' if is_tag(ref) else 'the branch'} {ref}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
