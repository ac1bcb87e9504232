"""The course's rule for hints and feedback, for the lessons' tests: no code from the solution.

* no normalised line (whitespace removed, >= 12 characters) of a solution's body appears in a hint or a message;
* no hint holds a backticked snippet that calls something with arguments (`f(x, y)`); an API name is fine.
"""

import inspect
import re

from course_lib.exercises import exercises


def solution_lines(id_: str) -> list[str]:
    source = inspect.getsource(exercises()[id_].solution)
    body = source.split(":\n", 1)[1] if source.lstrip().startswith("def ") else source
    lines = []
    for line in body.splitlines():
        line = line.split("#", 1)[0]
        norm = re.sub(r"\s+", "", line)
        if len(norm) >= 12:
            lines.append(norm)
    return lines


def code_from_solution(id_: str, text: str) -> list[str]:
    """The solution's lines that ``text`` contains (whitespace ignored)."""
    flat = re.sub(r"\s+", "", text)
    return [line for line in solution_lines(id_) if line in flat]


def backticked_calls(text: str) -> list[str]:
    return [s for s in re.findall(r"`([^`]*)`", text) if re.search(r"\w\([^)]+\)", s)]


def assert_hints_are_a_ladder(id_: str) -> None:
    hints = exercises()[id_].hints
    assert len(hints) >= 2, f"{id_}: a ladder needs at least two rungs"
    for h in hints:
        assert not code_from_solution(id_, h), (id_, h, code_from_solution(id_, h))
        assert not backticked_calls(h), (id_, h)
