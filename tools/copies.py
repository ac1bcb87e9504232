"""Copies of the lessons for a class, and a class's progress as one table.

    ./course.sh student DIR              the lessons as learners get them, solutions withheld
    ./course.sh instructor DIR           every stub replaced by its working solution, executed, every check ✔
    ./course.sh nbgrader DIR             nbgrader source notebooks (DIR/source/lessonNN/), one graded test each
    ./course.sh progress FILE... [--csv OUT]   a class table from learners' course_progress.json files

Student copy: each lesson notebook, its exercise cells' outputs cleared (the stubs stay: `def name(...): ...`),
plus ``course_settings.json`` holding ``{"solutions": "off"}``: a kernel started in that folder prints no
solution code (course_lib/solutions.py). Other cells keep their stored outputs, as in the course.

Instructor copy: each exercise's stub function is replaced by the reference solution under the stub's own
name (course_lib.solutions.code), then the notebook runs top to bottom in a fresh kernel (8 simulated CPU
devices, progress to a temporary file) and the copy is written with its outputs. It fails, naming the exercise,
unless every check printed ✔. ``--no-execute`` writes the copies without running them.

Every copy (student, instructor, each nbgrader source folder) also carries the course's pages that the lessons
link to (``notebooks/*.md``, e.g. hardware.md). ``nbgrader`` prints the commands that grade with its sources
(with the virtual environment activated: nbgrader runs ``alembic`` from PATH). ``progress`` reads the files
without locking them (no ``.NAME.lock`` is made), names on stderr each file it leaves out, why, and what to
do, and ``--csv`` creates the folder it writes to.

In CI the instructor form is tested for all 42 exercises without extra runs: the second nbval pass (conftest.py,
as another processor) runs each notebook's instructor form, ``assert check(...)`` in every exercise cell.
"""

from __future__ import annotations

import argparse
import ast
import csv
import io
import json
import os
import pathlib
import re
import shutil
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CHECK = re.compile(r'^check\("(\d\d\.\d+)",\s*(\w+)\)\s*$', re.M)
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def exercise_cells(nb) -> list[tuple[int, str, str]]:
    """``(cell index, exercise id, stub name)`` of every exercise cell: the cell that calls ``check("NN.k", name)``."""
    found = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            for id_, name in CHECK.findall(_source(cell)):
                found.append((i, id_, name))
    return found


def _stub(source: str, name: str) -> ast.FunctionDef:
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise ValueError(f"the exercise cell defines no function {name!r}:\n{source}")


def is_stub(source: str, name: str) -> bool:
    """Whether ``name``'s body holds no answer: only comments, ``...``/``pass``, and nested stubs (plus a
    ``return`` of a nested stub, as in ``def make_step(...): def step(...): ...; return step``)."""
    def empty(body) -> bool:
        for node in body:
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue   # ... or a docstring
            if isinstance(node, ast.Pass):
                continue
            if isinstance(node, ast.FunctionDef) and empty(node.body):
                continue
            if isinstance(node, ast.Return) and isinstance(node.value, ast.Name):
                continue
            return False
        return True
    return empty(_stub(source, name).body)


def _solution_parts(id_: str, name: str) -> tuple[list[str], list[str]]:
    """The reference solution of ``id_`` under ``name``: (its import lines, its definition's lines)."""
    from course_lib import solutions
    code = solutions.code(id_, name)
    tree = ast.parse(code)
    imports = [ast.get_source_segment(code, n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    first_def = next(n for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom)))
    return imports, code.splitlines()[first_def.lineno - 1:]


def _with_imports(lines: list[str], imports: list[str]) -> list[str]:
    """``lines`` with the ``imports`` they lack placed after the cell's own leading imports."""
    source = "\n".join(lines)
    missing = [i for i in imports if not re.search(rf"^{re.escape(i)}\s*$", source, re.M)]
    if not missing:
        return lines
    tree = ast.parse(source)
    at = 0
    for node in tree.body:
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            break
        at = node.end_lineno
    return lines[:at] + missing + lines[at:]


def solved_source(source: str, id_: str, name: str, *, assert_check: bool = False) -> str:
    """The exercise cell with its stub replaced by the reference solution (under the stub's name).

    The solution's imports go after the cell's own; with ``assert_check`` the closing ``check(...)`` becomes
    ``assert check(...)``, so that a failing check stops the run.
    """
    node = _stub(source, name)
    lines = source.splitlines()
    imports, definition = _solution_parts(id_, name)
    start = node.lineno - 1 - len(node.decorator_list)
    text = "\n".join(_with_imports(lines[:start] + definition + lines[node.end_lineno:], imports))
    if assert_check:
        text = CHECK.sub(lambda m: f'assert {m.group(0).strip()}, "exercise {m.group(1)}: the reference solution '
                                   'did not pass its check"', text)
    return text


def instructor_notebook(nb, *, assert_check: bool = False):
    """``nb`` (a dict, changed in place) with every stub replaced by its solution; returns the exercise ids."""
    ids = []
    for i, id_, name in exercise_cells(nb):
        cell = nb["cells"][i]
        cell["source"] = solved_source(_source(cell), id_, name, assert_check=assert_check)
        cell["outputs"], cell["execution_count"] = [], None
        ids.append(id_)
    return ids


def _write_nb(nb, path: pathlib.Path) -> None:
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _lessons(names) -> list[pathlib.Path]:
    if not names:
        return LESSONS
    chosen = []
    for n in names:
        p = pathlib.Path(n)
        if not p.exists():
            matches = [q for q in LESSONS if q.name.startswith(f"{n}_") or q.name.startswith(f"{int(n):02d}_")] \
                if n.isdigit() else []
            if not matches:
                raise SystemExit(f"no lesson notebook {n!r}: name a file, or a lesson number such as 02")
            p = matches[0]
        chosen.append(p)
    return chosen


def _destination(dir_: str) -> pathlib.Path:
    dst = pathlib.Path(dir_).resolve()
    if dst == ROOT / "notebooks" or dst == ROOT:
        raise SystemExit(f"{dir_}: write the copies to another folder, not over the course itself")
    dst.mkdir(parents=True, exist_ok=True)
    return dst


SETTINGS = {"solutions": "off",
            "_about": "Read by course_lib: solution() prints no code in this folder (COURSE_SOLUTIONS=on overrides)."}


def copy_pages(dst: pathlib.Path) -> list[pathlib.Path]:
    """Copy every ``notebooks/*.md`` page (hardware.md, ...) into ``dst``: the lessons link to them by name."""
    out = []
    for page in sorted((ROOT / "notebooks").glob("*.md")):
        shutil.copy(page, dst / page.name)
        out.append(dst / page.name)
    return out


def student(dir_: str, lessons=()) -> list[pathlib.Path]:
    """Student copies in ``dir_``: exercise outputs cleared, stubs checked, solutions withheld there."""
    dst = _destination(dir_)
    written = []
    for path in _lessons(lessons):
        nb = json.loads(path.read_text(encoding="utf-8"))
        for i, id_, name in exercise_cells(nb):
            cell = nb["cells"][i]
            if not is_stub(_source(cell), name):
                raise SystemExit(f"{path.name}: exercise {id_}'s cell holds code in {name}(); the course ships stubs")
            cell["outputs"], cell["execution_count"] = [], None
        _write_nb(nb, dst / path.name)
        written.append(dst / path.name)
    (dst / "course_settings.json").write_text(json.dumps(SETTINGS, indent=1) + "\n")
    copy_pages(dst)
    print(f"wrote {len(written)} student notebooks and course_settings.json (solutions off) to {dst}")
    return written


def execute(path: pathlib.Path, timeout: int = 900) -> None:
    """Run ``path`` top to bottom in a fresh kernel of this environment (as the course's tests do) and store it."""
    import conftest  # noqa: F401  (8 simulated devices, progress to a temporary file: as under nbval)
    import nbclient
    import nbformat
    from jupyter_client import KernelManager
    from nbval.kernel import CURRENT_ENV_KERNEL_NAME, NbvalKernelspecManager
    conftest.fresh_progress_file()
    nb = nbformat.read(path, as_version=4)
    km = KernelManager(kernel_name=CURRENT_ENV_KERNEL_NAME, kernel_spec_manager=NbvalKernelspecManager())
    nbclient.NotebookClient(nb, km=km, timeout=timeout, record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(nb, path)


def passed_checks(nb) -> dict[str, bool]:
    """Per exercise cell, whether its stored output shows ``[id] ✔ Correct``."""
    out = {}
    for i, id_, _ in exercise_cells(nb):
        text = "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                       for o in nb["cells"][i].get("outputs", []))
        out[id_] = f"[{id_}] ✔ Correct" in text
    return out


def instructor(dir_: str, lessons=(), run: bool = True) -> int:
    """Instructor copies in ``dir_``; executed and verified unless ``run`` is False. Returns an exit status."""
    dst = _destination(dir_)
    copy_pages(dst)
    failed = []
    total = 0
    for path in _lessons(lessons):
        nb = json.loads(path.read_text(encoding="utf-8"))
        ids = instructor_notebook(nb)
        out = dst / path.name
        _write_nb(nb, out)
        total += len(ids)
        if not run:
            print(f"{path.name}: {len(ids)} exercise cells filled")
            continue
        start = time.perf_counter()
        try:
            execute(out)
        except Exception as e:  # a cell raised: name it, go on with the other lessons
            failed.append(f"{path.name}: a cell failed: {str(e)[:1500]}")
            print(failed[-1])
            continue
        verdicts = passed_checks(json.loads(out.read_text(encoding="utf-8")))
        bad = [i for i, ok in verdicts.items() if not ok]
        failed += [f"{path.name}: exercise {i} did not print ✔" for i in bad]
        print(f"{path.name}: {sum(verdicts.values())} of {len(verdicts)} checks ✔, "
              f"{time.perf_counter() - start:.0f} s", flush=True)
    if run:
        print(f"{total - sum(1 for f in failed if 'exercise' in f)} of {total} exercises ✔ in {dst}"
              if not failed else "FAILED:\n  " + "\n  ".join(failed))
    else:
        print(f"wrote {total} solved exercise cells (not executed) to {dst}")
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------
# nbgrader


def _nb_cell(kind: str, source: str, **meta):
    import nbformat
    cell = nbformat.v4.new_code_cell(source) if kind == "code" else nbformat.v4.new_markdown_cell(source)
    if meta:
        cell.metadata["nbgrader"] = {"schema_version": 3, "task": False, **meta}
    return cell


def nbgrader_notebook(path: pathlib.Path):
    """The lesson as an nbgrader source notebook: each exercise cell's stub body holds the reference solution
    between ``### BEGIN SOLUTION`` and ``### END SOLUTION``, and a locked, graded test cell follows it:
    ``assert check("NN.k", name)`` (1 point)."""
    import nbformat
    from course_lib import solutions
    nb = nbformat.read(path, as_version=4)
    cells = []
    for i, cell in enumerate(nb.cells):
        found = CHECK.findall(cell.source) if cell.cell_type == "code" else []
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        if not found:
            cells.append(cell)
            continue
        (id_, name), = found
        source = CHECK.sub("", cell.source).rstrip() + "\n"
        node = _stub(source, name)
        lines = source.splitlines()
        imports, definition = _solution_parts(id_, name)
        sol = ast.parse("\n".join(definition)).body[0]
        body = definition[sol.body[0].lineno - 1:sol.end_lineno]
        indent = re.match(r"\s*", body[0]).group(0)
        start = node.lineno - 1 - len(node.decorator_list)
        header = lines[start:node.body[0].lineno - 1]   # the stub's def line (and comments), as the notebook has it
        new = _with_imports(lines[:start] + header + [f"{indent}### BEGIN SOLUTION"] + body
                            + [f"{indent}### END SOLUTION"] + lines[node.end_lineno:], imports)
        key = id_.replace(".", "_")
        cells.append(_nb_cell("code", "\n".join(new).rstrip(), grade=False, grade_id=f"answer_{key}",
                              locked=False, solution=True))
        cells.append(_nb_cell("code", f'assert check("{id_}", {name})', grade=True, grade_id=f"test_{key}",
                              locked=True, points=1, solution=False))
    nb.cells = cells
    return nb


NBGRADER_CONFIG = '''\
# nbgrader configuration written by ./course.sh nbgrader. Run nbgrader from this folder:
#   nbgrader generate_assignment lesson02      (release/lesson02: solutions replaced by "raise NotImplementedError()")
#   nbgrader autograde lesson02                (after collecting submissions into submitted/<student>/lesson02/)
# Kernels need the course's 8 simulated devices: export JAX_NUM_CPU_DEVICES=8 JAX_PLATFORMS=cpu first.
c = get_config()  # noqa: F821
c.CourseDirectory.root = "."
c.Execute.timeout = 900              # seconds per cell: the longest lesson cells take minutes on a laptop
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\\nraise NotImplementedError()"}
'''


def next_steps(dst: pathlib.Path, assignments: list[str]) -> str:
    """The commands that grade with these sources. nbgrader runs ``alembic`` (its database tool) from PATH, so
    the course's virtual environment must be activated: ``.venv/bin/nbgrader`` alone fails on FileNotFoundError."""
    venv = pathlib.Path(sys.prefix)
    one = assignments[0] if assignments else "lesson02"
    return "\n".join([
        "Next, in a shell (nbgrader finds its tools on PATH, so activate the environment first):",
        f"  source {venv / 'bin' / 'activate'}",
        f"  cd {dst}",
        "  export JAX_NUM_CPU_DEVICES=8 JAX_PLATFORMS=cpu",
        f"  nbgrader generate_assignment {one}     # release/{one}: the notebook to hand out",
        f"  # collect each learner's notebook into submitted/<learner>/{one}/, then:",
        f"  nbgrader autograde {one}",
        "  nbgrader export                        # grades.csv"])


def nbgrader_sources(dir_: str, lessons=()) -> list[pathlib.Path]:
    import nbformat
    dst = _destination(dir_)
    written = []
    for path in _lessons(lessons):
        folder = dst / "source" / f"lesson{path.name[:2]}"
        folder.mkdir(parents=True, exist_ok=True)
        nbformat.write(nbgrader_notebook(path), folder / path.name)
        (folder / "course_settings.json").write_text(json.dumps(SETTINGS, indent=1) + "\n")
        # nbgrader copies every file of the source folder into release/lessonNN: the links work there too.
        copy_pages(folder)
        written.append(folder / path.name)
    (dst / "nbgrader_config.py").write_text(NBGRADER_CONFIG)
    print(f"wrote {len(written)} nbgrader source notebooks under {dst / 'source'} and {dst / 'nbgrader_config.py'}")
    print(next_steps(dst, [p.parent.name for p in written]))
    return written


# ---------------------------------------------------------------------------------------------
# The class table


def class_table(files) -> tuple[list[dict], list[str]]:
    """One row per readable progress file: learner, file, and per lesson passed/tried/hints; plus the problems."""
    from course_lib import progress
    from course_lib.exercises import exercises
    lessons = sorted({i.split(".")[0] for i in exercises()})
    rows, problems = [], []
    for f in files:
        try:
            data = progress.load(pathlib.Path(f)) if pathlib.Path(f).is_file() else None
        except ValueError:
            problems.append(_why_skipped(pathlib.Path(f)))
            continue
        if data is None:
            problems.append(f"{f}: left out of the table: there is no such file. Check the name on the command line "
                            "(a learner's file is course_progress.json unless you renamed it).")
            continue
        row = {"learner": data.get("learner") or pathlib.Path(f).stem, "file": pathlib.Path(f).name}
        for lesson in lessons:
            entries = [v for k, v in data["exercises"].items() if k.split(".")[0] == lesson]
            row[lesson] = (sum(bool(v.get("passed")) for v in entries), sum(int(v.get("checks", 0)) > 0
                                                                           for v in entries),
                           sum(int(v.get("hints", 0)) for v in entries))
        rows.append(row)
    return rows, problems


ASK = ("Ask that learner for their course_progress.json again (it sits in the folder their notebooks run in, "
       "or where their COURSE_PROGRESS points), or leave this file off the command line.")


def _why_skipped(f: pathlib.Path) -> str:
    """Why a file handed in is not in the class table, and what the instructor can do: for the instructor."""
    from course_lib import progress
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return f"{f}: left out of the table: it is not JSON (damaged, cut short, or another kind of file). {ASK}"
    if not isinstance(data, dict) or data.get("format") != progress.FORMAT:
        return f"{f}: left out of the table: it is JSON but not a course progress file (no \"format\": " \
               f"\"{progress.FORMAT}\"), so perhaps the wrong file was handed in. {ASK}"
    if data.get("version") != progress.VERSION:
        return (f"{f}: left out of the table: a progress file of version {data.get('version')!r}, and this "
                f"course_lib reads version {progress.VERSION}. Run the table with the course_lib the learner used, "
                "or update yours (git pull, then ./course.sh setup).")
    return (f"{f}: left out of the table: a course progress file whose contents are damaged (its \"exercises\" or "
            f"\"learner\" field is not what course_lib writes). {ASK}")


def format_table(rows) -> str:
    if not rows:
        return "(no readable progress files)"
    lessons = [k for k in rows[0] if k not in ("learner", "file")]
    from course_lib.exercises import exercises
    counts = {ls: sum(i.startswith(ls + ".") for i in exercises()) for ls in lessons}
    head = ["learner"] + [f"{ls} ({counts[ls]})" for ls in lessons] + ["passed"]
    body = [[r["learner"]] + ["{}/{}/{}".format(*r[ls]) for ls in lessons] + [str(sum(r[ls][0] for ls in lessons))]
            for r in rows]
    widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join(["each lesson: passed/tried/hints (exercises in the lesson)", line(head)]
                     + [line(b) for b in body])


def write_csv(rows, out) -> None:
    """Write the table as CSV to ``out``, creating its folder if needed."""
    out = pathlib.Path(out)
    if out.is_dir():
        raise SystemExit(f"--csv {out}: that is a folder; give a file name, e.g. --csv {out / 'class.csv'}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"--csv {out}: cannot create the folder {out.parent} ({e.strerror}); give a path in a "
                         "folder you can write to, e.g. --csv class.csv") from None
    lessons = [k for k in rows[0] if k not in ("learner", "file")] if rows else []
    with open(out, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["learner", "file"] + [f"{ls}_{what}" for ls in lessons for what in ("passed", "tried", "hints")])
        for r in rows:
            w.writerow([r["learner"], r["file"]] + [n for ls in lessons for n in r[ls]])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name, text in [("student", "student copies (solutions withheld)"),
                       ("instructor", "instructor copies (solutions in place, executed, every check ✔)"),
                       ("nbgrader", "nbgrader source notebooks under DIR/source/lessonNN")]:
        p = sub.add_parser(name, help=text)
        p.add_argument("dir", metavar="DIR")
        p.add_argument("lessons", nargs="*", help="lesson numbers or notebooks (default: all 14)")
        if name == "instructor":
            p.add_argument("--no-execute", action="store_true", help="write the copies without running them")
    p = sub.add_parser("progress", help="a class table from learners' progress files")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--csv", metavar="OUT", help="also write the table as CSV to OUT")
    args = parser.parse_args(argv)
    if args.cmd == "student":
        student(args.dir, args.lessons)
    elif args.cmd == "instructor":
        return instructor(args.dir, args.lessons, run=not args.no_execute)
    elif args.cmd == "nbgrader":
        nbgrader_sources(args.dir, args.lessons)
    else:
        rows, problems = class_table(args.files)
        print(format_table(rows))
        if args.csv:
            write_csv(rows, args.csv)
            print(f"wrote {args.csv}")
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
