"""A learner's progress on the exercises, kept in one JSON file that every lesson's kernel shares.

``check``, ``hint`` and ``solution`` (``course_lib.exercises``) each call ``record``; ``progress()`` reads the
file back. It lives at ``./course_progress.json`` in the working directory (the folder the notebooks run in),
or wherever the environment variable ``COURSE_PROGRESS`` points. It survives kernel restarts, and a learner can
hand it in: ``./course.sh progress FILE...`` turns a class's files into one table.

The file::

    {"format": "course-progress", "version": 1, "learner": "ada",     # "learner" is optional
     "exercises": {"02.1": {"checks": 3, "passed": true, "hints": 1, "solutions": 0,
                            "first": "2026-11-29T10:02:11Z", "last": "2026-11-29T10:09:40Z"}}}

Writes are atomic (a temporary file in the same folder, then ``os.replace``) and made under a lock file
(``.<file>.lock``, next to it), so two kernels recording at once lose nothing. A file that is not JSON, or is JSON of
another kind, raises a ``ValueError`` naming the file and the fix; it is never overwritten.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import pathlib
import tempfile
import time

FORMAT = "course-progress"
VERSION = 1
EVENTS = ("check", "hint", "solution")
DEFAULT_NAME = "course_progress.json"
_COUNTS = {"check": "checks", "hint": "hints", "solution": "solutions"}


def path() -> pathlib.Path:
    """The progress file: ``$COURSE_PROGRESS`` if set, else ``./course_progress.json`` in the working directory."""
    env = os.environ.get("COURSE_PROGRESS", "").strip()
    return pathlib.Path(env).expanduser() if env else pathlib.Path.cwd() / DEFAULT_NAME


def _empty() -> dict:
    return {"format": FORMAT, "version": VERSION, "exercises": {}}


def _fix(p: pathlib.Path) -> str:
    return (f"Move it aside (e.g. rename it to {p.name}.bak) so that a new one is started, or point "
            f"COURSE_PROGRESS at another file (e.g. COURSE_PROGRESS=my_progress.json).")


def _validate(data, p: pathlib.Path) -> dict:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{p} is not a course progress file (no \"format\": \"{FORMAT}\" in it), so it was left "
                         f"as it is. {_fix(p)}")
    if data.get("version") != VERSION:
        raise ValueError(f"{p} is a course progress file of version {data.get('version')!r}; this course_lib reads "
                         f"version {VERSION}. Update course_lib, or {_fix(p)[0].lower()}{_fix(p)[1:]}")
    exercises = data.get("exercises")
    if not isinstance(exercises, dict) or not all(isinstance(v, dict) for v in exercises.values()):
        raise ValueError(f"{p}: its \"exercises\" should map exercise ids to records, got "
                         f"{type(exercises).__name__}; it was left as it is. {_fix(p)}")
    learner = data.get("learner")
    if learner is not None and not isinstance(learner, str):
        raise ValueError(f"{p}: \"learner\" should be a name (a string), got {type(learner).__name__}. Edit it, or "
                         f"remove the field.")
    return data


def load(path=None) -> dict:
    """The progress recorded in ``path`` (default ``path()``); an empty record if the file does not exist.

    Raises ``ValueError`` naming the file and the fix if it is not JSON or not a course progress file.
    """
    p = pathlib.Path(path) if path is not None else globals()["path"]()
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return _empty()
    except IsADirectoryError:
        raise ValueError(f"{p} is a folder, not a progress file. Point COURSE_PROGRESS at a file, e.g. "
                         f"COURSE_PROGRESS={p / DEFAULT_NAME}.") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{p} is not valid JSON ({e.msg} at line {e.lineno}), so it was left as it is. "
                         f"{_fix(p)}") from None
    return _validate(data, p)


@contextlib.contextmanager
def _locked(p: pathlib.Path, timeout: float = 30.0):
    """Hold ``<p>.lock`` while the block runs: an exclusive OS lock (fcntl, or msvcrt on Windows)."""
    lock_path = p.with_name("." + p.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if os.name == "nt":
                    import msvcrt
                    msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
                else:
                    import fcntl
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another process has held {lock_path} for over {timeout:.0f} s; if no "
                                       "kernel is writing progress, delete that lock file.") from None
                time.sleep(0.01)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _write(p: pathlib.Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=p.name + ".", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def record(exercise_id: str, event: str, passed: bool | None = None, path=None) -> None:
    """Add one event for ``exercise_id`` to the progress file: a ``"check"`` (with ``passed``), ``"hint"`` or
    ``"solution"``. Atomic, and safe with several kernels writing at once."""
    if event not in EVENTS:
        raise ValueError(f"record(event={event!r}): event should be one of {', '.join(EVENTS)}.")
    if not isinstance(exercise_id, str) or not exercise_id:
        raise ValueError(f"record(exercise_id={exercise_id!r}): pass an exercise id such as \"02.1\".")
    p = pathlib.Path(path) if path is not None else globals()["path"]()
    if not p.parent.is_dir():
        raise ValueError(f"cannot record progress in {p}: the folder {p.parent} does not exist. Create it, or set "
                         f"COURSE_PROGRESS to a file in an existing folder.")
    with _locked(p):
        data = load(p)
        entry = data["exercises"].setdefault(exercise_id, {"checks": 0, "passed": False, "hints": 0,
                                                           "solutions": 0, "first": _now()})
        key = _COUNTS[event]
        entry[key] = int(entry.get(key, 0)) + 1
        if event == "check" and passed:
            entry["passed"] = True
        entry["last"] = _now()
        _write(p, data)


def set_learner(name: str, path=None) -> None:
    """Write the optional ``learner`` field (a name for the class table; otherwise the file's name is used)."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"set_learner(name={name!r}): pass a non-empty name, e.g. set_learner(\"ada\").")
    p = pathlib.Path(path) if path is not None else globals()["path"]()
    with _locked(p):
        data = load(p)
        data["learner"] = name.strip()
        _write(p, data)


# ----------------------------------------------------------------------------------------------------
# The report a learner reads: progress() in course_lib.exercises


@dataclasses.dataclass(frozen=True)
class Progress:
    """Per lesson, each exercise's state as the progress file records it. Prints as text, or as a table."""

    rows: tuple[tuple[str, str, str, int, int], ...]  # (id, title, state, attempts, hints shown)
    source: str = "course_progress.json"  # the progress file's name (no folder: outputs hold no machine paths)
    learner: str | None = None

    def __str__(self) -> str:
        lines, lesson = [], None
        for id_, title, state, attempts, hints in self.rows:
            if id_.split(".")[0] != lesson:
                lesson = id_.split(".")[0]
                lines.append(f"Lesson {lesson}")
            mark = {"passed": "✔", "attempted": "✘", "not tried": "·"}[state]
            extra = f" ({attempts} attempt{'s' * (attempts != 1)}" + (f", {hints} hint{'s' * (hints != 1)}"
                                                                      if hints else "") + ")" if attempts else ""
            lines.append(f"  {mark} {id_} {title}: {state}{extra}")
        passed = sum(r[2] == "passed" for r in self.rows)
        who = f" by {self.learner}" if self.learner else ""
        lines.append(f"{passed} of {len(self.rows)} exercises passed{who}, as recorded in {self.source}.")
        return "\n".join(lines)

    def _repr_pretty_(self, printer, cycle):
        printer.text(str(self))


class NoSuchLesson(ValueError, KeyError):
    """``progress(lesson)`` named a lesson that has no exercises (a ValueError; a KeyError too, as it was before)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def _lesson_key(lesson) -> str:
    """``9``, ``"9"``, ``"09"`` and ``"09.1"`` all name lesson ``"09"``; anything else is a clear error."""
    if isinstance(lesson, bool) or not isinstance(lesson, (int, str)):
        raise NoSuchLesson(f"progress(lesson={lesson!r}): lesson should be a lesson number like 9 or \"09\", got "
                           f"{type(lesson).__name__}. Pass e.g. progress(\"09\"), or progress() for every lesson.")
    text = str(lesson).strip()
    head = text.split(".")[0] if text.count(".") == 1 and text.split(".")[1].isdigit() else text
    if not head.isdigit():
        raise NoSuchLesson(f"progress(lesson={lesson!r}): lesson should be a lesson number like 9 or \"09\". "
                           "Pass e.g. progress(\"09\"), or progress() for every lesson.")
    return f"{int(head):02d}"


def report(lesson: str | int | None = None) -> Progress:
    """``course_lib.exercises.progress``: which exercises you have attempted and passed, per lesson, in every lesson's kernel and across restarts:
    read from the progress file (``./course_progress.json``, or ``$COURSE_PROGRESS``; see course_lib/progress.py).

    ``lesson`` picks one lesson: ``"02"``, ``"2"`` or ``2`` (or an exercise id, ``"02.1"``, for its lesson).
    """
    from course_lib.exercises import exercises
    key = None if lesson is None else _lesson_key(lesson)
    file = path()
    data = load(file)  # a corrupt or foreign file: ValueError naming it and the fix
    recorded = data["exercises"]
    rows = []
    for id_, ex in exercises().items():
        if key is not None and id_.split(".")[0] != key:
            continue
        entry = recorded.get(id_, {})
        checks, hints = int(entry.get("checks", 0)), int(entry.get("hints", 0))
        state = "passed" if entry.get("passed") else "attempted" if checks else "not tried"
        rows.append((id_, ex.title, state, checks, hints))
    if not rows:
        lessons = sorted({id_.split(".")[0] for id_ in exercises()})
        raise NoSuchLesson(f"there are no exercises for lesson {key!r} (progress(lesson={lesson!r})); the lessons "
                           f"with exercises are {', '.join(lessons)}. Pass one of them, or progress() for all.")
    return Progress(tuple(rows), file.name, data.get("learner"))
