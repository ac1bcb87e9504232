"""Every exercise's hints form a ladder that stops short of the code, and feedback names mistakes without the code.

The rule (the developers' guide): a nudge first, then the API or the lesson cell to read; code only in ``solution()``.
So no hint, and no feedback to a wrong answer, holds a line of the reference solution, and no hint holds a code
snippet that is a call with its arguments (naming an API, ``jax.lax.psum_scatter``, is fine).
"""

import inspect
import re
import textwrap

import pytest

from course_lib import exercises as ex

ALL = ex.exercises()


def _squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


def solution_lines(id_: str) -> list[str]:
    """The solution's code lines, whitespace removed, that are long enough to be code rather than a name."""
    source = textwrap.dedent(inspect.getsource(ALL[id_].solution))
    body = source.split("\n", 1)[1] if source.lstrip().startswith("def ") else source
    body = re.sub(r'(?s)("""|\'\'\').*?\1', "", body)  # docstrings
    lines = []
    for line in body.splitlines():
        code = line.split("#", 1)[0].strip()
        if code.startswith("def "):
            continue
        code = code.removeprefix("return ").removeprefix("yield ")
        code = re.sub(r"^[\w., ]+ = ", "", code)  # the right-hand side of an assignment is the code to find
        squeezed = _squeeze(code)
        if len(squeezed) >= 12 and re.search(r"[(\[*+/%-]", squeezed):  # code, not a tuple of names
            lines.append(squeezed)
    return lines


def _arguments(text: str, open_at: int) -> str:
    """What stands between the bracket at ``open_at`` and its match (to the end if unmatched)."""
    depth = 0
    for i in range(open_at, len(text)):
        depth += text[i] in "([{"
        depth -= text[i] in ")]}"
        if depth == 0:
            return text[open_at + 1:i]
    return text[open_at + 1:]


def written_code(text: str) -> list[str]:
    """Code written out in ``text``: calls with their arguments, indexing with arithmetic, lambdas, assignments.

    ``jax.lax.psum_scatter`` or ``jax.devices()`` name an API and pass; ``jax.device_put(x, d)``,
    ``x[i * size:]``, ``lambda b: ...`` and ``mean = ...`` write the code out and are reported.
    """
    found = []
    for m in re.finditer(r"[A-Za-z_][\w.]*\(", text):
        inside = _arguments(text, m.end() - 1)
        signature = "." not in m.group(0) and re.fullmatch(r"\s*\w+(\s*,\s*\w+)*\s*", inside)
        if signature:  # a function's signature in words, slice(start, stop), is not an API call written out
            continue
        if any(c in inside for c in ",=([") or len(inside) > 16:
            found.append(m.group(0) + inside[:40] + ")")
    for m in re.finditer(r"[A-Za-z_]\w*\[", text):
        inside = _arguments(text, m.end() - 1)
        if re.search(r"[*+:/-]|\w\(", inside):
            found.append(m.group(0) + inside[:40] + "]")
    found += re.findall(r"\blambda\s+\w[^:]*:", text)
    # a keyword argument with a value written out, in_axes=(None, 0); naming an option, tiled=True, is fine
    found += [kw for kw in re.findall(r"\b[a-z_]\w*=[\w'\"(\[{][^\s,;]*", text)
              if not re.fullmatch(r"\w+=(True|False|None)[).,;:]*", kw)]
    found += re.findall(r"\b[A-Za-z_]\w*\s=\s[A-Za-z_][\w.]*[(\[]", text)
    return found


@pytest.mark.parametrize("id_", list(ALL))
def test_no_hint_holds_a_line_of_the_solution(id_):
    hints = [_squeeze(h) for h in ALL[id_].hints]
    for line in solution_lines(id_):
        for i, hint in enumerate(hints, 1):
            assert line not in hint, f"hint {i} of {id_} holds the solution's line {line!r}"


@pytest.mark.parametrize("id_", list(ALL))
def test_hints_are_a_ladder_without_code(id_):
    hints = ALL[id_].hints
    assert len(hints) >= 2, f"{id_} has {len(hints)} hint(s): a nudge, then the API or the cell to read"
    for i, hint in enumerate(hints, 1):
        assert "```" not in hint, f"hint {i} of {id_} holds a code block"
        assert not written_code(hint), f"hint {i} of {id_} writes code out: {written_code(hint)}"


def _raises(*args, **kwargs):
    raise ValueError("not written yet")


WRONG_ANSWERS = {
    "raises": _raises,
    "returns zero": lambda *args, **kwargs: 0,
    "returns its first input": lambda *args, **kwargs: args[0] if args else 0,
}


@pytest.mark.parametrize("id_", list(ALL))
@pytest.mark.parametrize("kind", list(WRONG_ANSWERS))
def test_feedback_to_a_wrong_answer_holds_no_line_of_the_solution(id_, kind):
    feedback = ex.check(id_, WRONG_ANSWERS[kind])
    if feedback.passed:  # an identity can be right for an exercise; nothing to judge here
        return
    message = _squeeze(feedback.message)
    for line in solution_lines(id_):
        assert line not in message, f"feedback to {kind!r} in {id_} holds the solution's line {line!r}"


@pytest.mark.parametrize("code", [
    "jax.device_put(x, jax.devices()[3]) copies x to device 3",
    "Slice x[i * size:(i + 1) * size] and place it",
    "in_axes=(None, 0) broadcasts the whole params dict",
    "jax.pmap(lambda row: 2.0 * row, out_axes=1)(xs)",
    "mean = jax.lax.pmean(jnp.mean(x), axis_name); then the variance",
    "jax.lax.psum_scatter(grads, 'data', tiled=True) / n",
])
def test_the_rule_finds_code_written_out(code):
    assert written_code(code)


@pytest.mark.parametrize("prose", [
    "jax.devices() lists the devices; the one you want is at index 3.",
    "Read section 4 (Collectives), then jax.lax.psum_scatter with tiled=True.",
    "Python's built-in slice(start, stop) selects rows start to stop - 1.",
    "Each device gets B // n consecutive rows: work out where piece i starts and ends.",
])
def test_the_rule_lets_names_and_prose_through(prose):
    assert not written_code(prose)


@pytest.mark.parametrize("id_", list(ALL))
def test_no_combination_of_rungs_spells_the_solution(id_):
    import sys
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from hint_rules import assert_no_combination_of_rungs_spells_the_solution
    assert_no_combination_of_rungs_spells_the_solution(id_)


def test_the_combination_rule_finds_a_line_spelled_across_rungs(monkeypatch):
    import sys
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    import hint_rules

    def solution(x, axis_name):
        n = jax_lax_axis_size(axis_name)  # noqa: F821
        return n

    fake = {"99.9": ex.Exercise("99.9", "t", None, solution, hints=(
        "Compute n jax_lax_axis_size", "axis_name is the axis."))}
    monkeypatch.setattr(hint_rules, "exercises", lambda: fake)
    assert hint_rules.lines_spelled_by_the_ladder("99.9") == ["n jax_lax_axis_size axis_name"]
    fake["99.9"] = ex.Exercise("99.9", "t", None, solution, hints=("Ask the axis for its size.", "Return it."))
    assert hint_rules.lines_spelled_by_the_ladder("99.9") == []


# The exercises whose last rung used to walk through the solution in words (issue 44): their ladders end at the
# API or the cell to read.
NO_STEPS = [id_ for id_ in ALL if id_ < "07"]


@pytest.mark.parametrize("id_", NO_STEPS)
def test_the_ladder_ends_at_the_api_not_the_steps(id_):
    from hint_rules import assert_the_ladder_ends_at_the_api

    assert_the_ladder_ends_at_the_api(id_)


def test_the_steps_rule_finds_a_rung_in_words(monkeypatch):
    import hint_rules

    class Fake:
        hints = ["A nudge.", "In words: reshape x and return it."]

    monkeypatch.setattr(hint_rules, "exercises", lambda: {"99.9": Fake()})
    assert hint_rules.rungs_that_list_the_steps("99.9") == ["In words: reshape x and return it."]


@pytest.mark.parametrize("rung", [
    "Two steps: first the global mean; then the deviations from it.",
    "Keep a running total. Repeat n - 1 times: pass the value one hop, then add what arrived.",
    "For every leaf: bring each copy to the host, measure its distance, and keep the largest.",
    "Start with an array of zeros; at each hop, store what arrives in its row.",
])
def test_the_steps_rule_finds_steps_however_they_begin(monkeypatch, rung):
    import hint_rules

    class Fake:
        hints = ["A nudge.", rung]

    monkeypatch.setattr(hint_rules, "exercises", lambda: {"99.9": Fake()})
    assert hint_rules.rungs_that_list_the_steps("99.9") == [rung]
