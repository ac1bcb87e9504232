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


def _tokens(text: str) -> list[str]:
    """Identifiers and numbers, in order: what a line of code and a sentence about it share."""
    return re.findall(r"[A-Za-z_]\w*|\d+(?:\.\d+)?", text)


def _spelled(needle: list[str], hay: list[str]) -> bool:
    k = len(needle)
    return any(hay[i:i + k] == needle for i in range(len(hay) - k + 1))


def lines_spelled_by_the_ladder(id_: str) -> list[str]:
    """The solution's lines (3 or more names and numbers) that the hints spell out, read together in any order:
    the line's names and numbers in a row, in one rung or running from one rung into the next."""
    import itertools

    hints = list(exercises()[id_].hints)
    source = inspect.getsource(exercises()[id_].solution)
    body = source.split(":\n", 1)[1] if source.lstrip().startswith("def ") else source
    lines = [_tokens(line.split("#", 1)[0]) for line in body.splitlines()]
    lines = [t for t in lines if len(t) >= 3 and t[0] not in ("def", "return") or len(t) >= 4]
    orders = itertools.permutations(hints) if len(hints) <= 4 else itertools.permutations(hints, 2)
    joined = [_tokens(" ".join(order)) for order in orders] or [[]]
    return [" ".join(t) for t in lines if any(_spelled(t, hay) for hay in joined)]


def assert_no_combination_of_rungs_spells_the_solution(id_: str) -> None:
    spelled = lines_spelled_by_the_ladder(id_)
    assert not spelled, f"{id_}: the hints, read together, spell the solution's lines {spelled}"


STEPS_WORDS = re.compile(r"^\s*(In words|The steps|Steps|Two steps)\b", re.I)
# Words that order the steps of a procedure, and verbs that give one step each: a rung with two of the first, or
# three clauses opened by the second ("bring ..., measure ..., and keep ..."), walks through the solution.
SEQUENCE = re.compile(r"\b(then|first|repeat|at each|after that|afterwards|before|finally|start (?:with|by)|"
                      r"\w+ times)\b", re.I)
IMPERATIVE = re.compile(r"(?:^|[.:;,]\s*|\band\s+|\bthen\s+)(add|average|bring|compare|divide|keep|measure|multiply|"
                        r"pass|pmap|print|read|repeat|reshape|return|send|start|store|sum|write)\b", re.I)


def rungs_that_list_the_steps(id_: str) -> list[str]:
    """Rungs that walk through the solution step by step ("In words: ...", "first ..., then ...", three imperative
    steps in a row): read with the API rung, they are the answer. A ladder ends at the API or the cell to read."""
    return [h for h in exercises()[id_].hints if STEPS_WORDS.search(h)
            or len({m.lower() for m in SEQUENCE.findall(h)}) >= 2 or len(IMPERATIVE.findall(h)) >= 3]


def assert_the_ladder_ends_at_the_api(id_: str) -> None:
    steps = rungs_that_list_the_steps(id_)
    assert not steps, f"{id_}: a rung walks through the steps of the solution: {steps}"
