"""course_lib.exercises: feedback, the building blocks of checkers, and every reference solution."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from course_lib import exercises as ex
from course_lib.exercises import Case, Mismatch, call, check, diagnose, expect_placed_on, solution

ALL = ex.exercises()


# What each lesson's issue asks for; three elsewhere.
MINIMUM_EXERCISES = {"00": 2, "04": 4, "06": 2, "07": 1, "08": 2, "09": 2, "13": 1}


def test_every_lesson_with_exercises_has_enough():
    lessons = {}
    for id_ in ALL:
        lessons.setdefault(id_.split(".")[0], []).append(id_)
    assert set(lessons) >= {"00", "01", "02", "03", "04", "05", "06", "07", "08", "09"}
    for lesson, ids in lessons.items():
        assert len(ids) >= MINIMUM_EXERCISES.get(lesson, 3), f"lesson {lesson} has only {ids}"


@pytest.mark.parametrize("id_", list(ALL))
def test_reference_solution_passes_its_checker(id_):
    feedback = check(id_, ALL[id_].solution)
    assert feedback.passed, str(feedback)
    assert str(feedback).startswith(f"[{id_}] ✔ Correct: ")


@pytest.mark.parametrize("id_", list(ALL))
def test_no_answer_yet_is_not_yet(id_):
    for placeholder in (None, ...):
        feedback = check(id_, placeholder)
        assert not feedback and "no answer yet" in feedback.message

    def unwritten(*args, **kwargs):
        ...

    feedback = check(id_, unwritten)
    assert not feedback and "returned None: write the function's body" in feedback.message


@pytest.mark.parametrize("id_", list(ALL))
def test_solution_prints_its_source(id_, capsys):
    solution(id_)
    out = capsys.readouterr().out
    assert out.startswith(f"# Exercise {id_}: {ALL[id_].title}")
    from course_lib.solutions import STUB_NAMES  # printed under the notebook stub's name, to paste as it is
    assert f"def {STUB_NAMES[id_]}(" in out


def test_unknown_exercise_lists_the_known_ones():
    with pytest.raises(KeyError, match="there is no exercise '99.9'"):
        check("99.9", lambda: None)


def test_registering_an_id_twice_is_refused():
    ex.exercise("98.1", "t", solution=lambda: None)(lambda a: "ok")
    try:
        with pytest.raises(ValueError, match="registered twice"):
            ex.exercise("98.1", "t", solution=lambda: None)(lambda a: "ok")
    finally:
        del ex._REGISTRY["98.1"]


def test_a_checker_turns_mismatch_into_feedback():
    exercise = ex.Exercise("97.1", "double", lambda f: (diagnose(f, [Case((jnp.arange(3.0),), "f(arange(3))")],
                                                                 solution=lambda x: 2 * x), "good")[1], None)
    assert exercise.check(lambda x: 2 * x).passed
    wrong = exercise.check(lambda x: x + 2)
    assert not wrong.passed and str(wrong).startswith("[97.1] ✘ Not yet: ")
    assert "f(arange(3)): expected [0, 2, 4], got [2, 3, 4]" in wrong.message


def test_call_reports_the_learners_exception_with_inputs():
    def broken(x, n):
        raise IndexError("tuple index out of range")

    with pytest.raises(Mismatch, match=r"broken\(Array float32\[4, 3\], n=2\) raised IndexError: tuple index"):
        call(broken, jnp.zeros((4, 3)), n=2)
    with pytest.raises(Mismatch, match="expected a function, got ndarray"):
        call(np.zeros(2))
    with pytest.raises(Mismatch, match=r"forgot\(Array float32\[2\]\) returned None: did it forget to `return`"):
        call(lambda x: None, jnp.zeros(2), name="forgot")

    def placeholder(x):
        ...

    with pytest.raises(Mismatch, match=r"placeholder\(Array float32\[2\]\) returned None: write the function's body"):
        call(placeholder, jnp.zeros(2))


def test_expect_placed_on_messages(devices):
    y = jax.pmap(lambda x: x)(jnp.zeros((8, 2)))
    expect_placed_on(y, devices)
    with pytest.raises(Mismatch, match=r"lives on 1 device\(s\) \(ids \[0\]\); expected the 8 devices"):
        expect_placed_on(jnp.zeros(3), devices)
    with pytest.raises(Mismatch, match="should be a jax.Array on 8 devices, got ndarray"):
        expect_placed_on(np.zeros(3), devices)
    full = jax.device_put(jnp.zeros(3), jax.sharding.NamedSharding(
        jax.sharding.Mesh(np.array(devices), ("d",)), jax.sharding.PartitionSpec()))
    with pytest.raises(Mismatch, match="full copy on every device; expected one block per device"):
        expect_placed_on(full, devices)
    expect_placed_on(full, devices, split=False)


# ---------------------------------------------------------------------------------------------
# check() never raises; hints; progress


def test_a_checker_that_breaks_on_the_answer_gives_feedback_naming_what_came_back():
    def fragile(f):
        got = call(f, jnp.arange(3.0), name="f")
        return str(got["w"] + 1)  # breaks on anything but a dict

    exercise = ex.Exercise("97.2", "fragile", fragile, None, returns="a dict {'w': array of shape (3,)}")
    feedback = exercise.check(lambda x: (x, x))
    assert not feedback.passed
    assert "f(Array float32[3]) returned tuple(Array float32[3], Array float32[3])" in feedback.message
    assert "expected a dict {'w': array of shape (3,)}" in feedback.message
    assert "TypeError" in feedback.message


def test_call_reports_an_input_changed_in_place():
    def zero_it(x):
        x[:] = 0
        return x

    with pytest.raises(Mismatch, match=r"zero_it\(ndarray float32\[3\]\) changed its input x in place: its values"):
        call(zero_it, np.ones(3, np.float32))

    def edit_dict(params):
        params["w"] = 0
        return params

    with pytest.raises(Mismatch, match="changed its input params in place: one of its items was replaced"):
        call(edit_dict, {"w": jnp.ones(2)})
    assert call(lambda x: x + 1, np.ones(2)).tolist() == [2.0, 2.0]  # reading is fine


def test_vmap_is_seen_however_the_vmapped_function_was_built():
    per_row = jax.vmap(lambda v: jnp.sum(v))
    jitted = jax.jit(per_row)
    x = jnp.ones((7, 13))
    assert ex.vmap_calls(lambda a: jax.vmap(jnp.sum)(a), x) >= 1   # built inside
    assert ex.vmap_calls(per_row, x) >= 1                          # built before
    assert ex.vmap_calls(lambda a: jitted(a), x) >= 1              # built before, behind a jit
    assert ex.vmap_calls(lambda a: jnp.sum(a, axis=1), x) == 0
    assert ex.vmap_calls(lambda a: jnp.linalg.norm(a, axis=1), x) == 0


def test_expect_pmapped_reads_the_pmap_and_the_placement():
    xs = jnp.ones((8, 3))
    devices = jax.devices()
    f = jax.pmap(lambda r, s: r * s, in_axes=(0, None), out_axes=1)
    (m,) = ex.expect_pmapped(f, f(xs, 2.0), (xs, 2.0), devices, what="f", name="f", how="one row each")
    assert len(tuple(m.params["in_specs"][1])) == 0 and len(tuple(m.params["in_specs"][0])) == 1
    with pytest.raises(Mismatch, match="lives on one device"):
        ex.expect_pmapped(lambda a: a * 2, xs * 2, (xs,), devices, what="g", name="g", how="one row each")
    spread = jax.device_put(xs, jax.sharding.NamedSharding(jax.make_mesh((8,), ("i",)), jax.P("i")))
    with pytest.raises(Mismatch, match="its program has no jax.pmap"):
        ex.expect_pmapped(lambda a: spread, spread, (xs,), devices, what="h", name="h", how="one row each")


HINTED = ex.Exercise("97.3", "hinted", lambda f: "ok", None, hints=("nudge", "key API"))


def test_hint_shows_the_next_hint_each_time_then_points_to_solution(capsys, monkeypatch):
    monkeypatch.setitem(ex._REGISTRY, "97.3", HINTED)
    monkeypatch.setattr(ex, "_hints_shown", ex.collections.Counter())
    ex.hint("97.3")
    ex.hint("97.3")
    ex.hint("97.3")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[97.3] Hint 1 of 2: nudge Run hint('97.3') again for more."
    assert out[1] == "[97.3] Hint 2 of 2: key API That was the last one: solution('97.3') is next."
    assert out[2].startswith("[97.3] No hints left (2 shown). Next step: solution('97.3')")


def test_hints_from_a_lesson_modules_HINTS_dict_follow_the_decorators(monkeypatch):
    import types

    monkeypatch.setitem(ex._REGISTRY, "97.3", HINTED)
    module = types.ModuleType("course_lib.exercises.lesson97")
    module.HINTS = {"97.3": ["third", "fourth"]}
    ex._add_hints(module)
    try:
        assert ex._REGISTRY["97.3"].hints == ("nudge", "key API", "third", "fourth")
        ex._add_hints(module)                                      # loading twice adds nothing
        assert len(ex._REGISTRY["97.3"].hints) == 4
        bad = types.ModuleType("course_lib.exercises.lesson96")
        bad.HINTS = {"96.9": ["for nothing"]}
        with pytest.raises(ValueError, match="lesson96.HINTS names exercise '96.9', which is not registered"):
            ex._add_hints(bad)
    finally:
        ex._HINTS_LOADED.discard("course_lib.exercises.lesson97")


@pytest.mark.parametrize("id_", list(ALL))
def test_every_exercise_has_graded_hints(id_):
    hints = ex.exercises()[id_].hints              # decorator hints and the lesson module's HINTS together
    assert len(hints) >= 2, f"exercise {id_} has {len(hints)} hint(s); give a nudge, then the key API"
    assert all(isinstance(h, str) and len(h) > 20 for h in hints)


@pytest.mark.parametrize("id_", [i for i in ALL if i.split(".")[0] <= "09"])
def test_every_exercise_says_what_it_returns(id_):
    assert len(ALL[id_].returns) > 10


def test_progress_counts_attempts_and_passes_per_lesson(monkeypatch):
    monkeypatch.setattr(ex, "_hints_shown", ex.collections.Counter())
    def unwritten(dispatch_ms, step_ms, k):
        ...

    check("09.1", None)                         # a placeholder is not an attempt
    check("09.1", unwritten)
    assert "· 09.1" in str(ex.progress("09"))
    check("09.1", lambda d, s, k: d * k + s)
    check("09.1", ALL["09.1"].solution)
    ex.hint("09.2")
    check("09.2", lambda ks, ms: (1.0, 2.0))
    text = str(ex.progress("09"))
    assert "Lesson 09" in text
    assert "✔ 09.1 Predict the time per step when K steps share one dispatch: passed (2 attempts)" in text
    assert "✘ 09.2 Fit the dispatch cost and the step cost to measured times: attempted (1 attempt, 1 hint)" in text
    assert text.endswith("1 of 2 exercises passed, as recorded in course_progress.json.")
    whole = str(ex.progress())
    assert "Lesson 00" in whole and "Lesson 05" in whole and "· 05.1" in whole
    with pytest.raises(KeyError, match="no exercises for lesson '42'"):
        ex.progress("42")


# ---------------------------------------------------------------------------------------------
# A battery of bad answers against every exercise: check() returns Feedback, never raises.


def _raises(*args, **kwargs):
    raise RuntimeError("boom inside the learner's code")


def _mutates(*args, **kwargs):
    for a in args:
        if isinstance(a, np.ndarray) and a.size:
            a[...] = 0
        if isinstance(a, dict):
            a.clear()
        if isinstance(a, list) and a:
            a.reverse()
    return args[0] if args else 0


BAD_ANSWERS = {
    "raises": _raises,
    "returns None": lambda *a, **k: None,
    "returns a str": lambda *a, **k: "an answer",
    "returns a dict": lambda *a, **k: {"a": 1},
    "returns a tuple": lambda *a, **k: (1, 2),
    "returns a ShapeDtypeStruct": lambda *a, **k: jax.ShapeDtypeStruct((8, 2, 3), jnp.float32),
    "returns NaNs": lambda *a, **k: jnp.full((8,), jnp.nan),
    "returns the wrong shape": lambda *a, **k: jnp.zeros((3, 3, 3)),
    "returns a list of arrays": lambda *a, **k: [jnp.zeros(2)] * 3,
    "returns a Device": lambda *a, **k: jax.devices()[0],
    "mutates its inputs": _mutates,
    "not a function": 42,
    "a string": "my answer",
}


@pytest.mark.parametrize("answer_name", list(BAD_ANSWERS))
@pytest.mark.parametrize("id_", list(ALL))
def test_bad_answers_get_feedback_not_an_exception(id_, answer_name):
    feedback = check(id_, BAD_ANSWERS[answer_name])
    assert isinstance(feedback, ex.Feedback)
    assert not feedback.passed, f"{answer_name} passed {id_}"
    assert feedback.message and str(feedback).startswith(f"[{id_}] ✘ Not yet: ")
    # Each checker names the problem itself: the framework's safety net is not needed for these.
    assert "Checking it failed with" not in feedback.message, feedback.message


# ---------------------------------------------------------------------------------------------
# The notebooks offer every exercise with check, hint and solution.

import json
import pathlib

NOTEBOOK_DIR = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
IMPORT_LINE = "from course_lib.exercises import check, hint, solution"


def _notebook(lesson):
    found = sorted(NOTEBOOK_DIR.glob(f"{lesson}_*.ipynb"))
    return json.loads(found[0].read_text()) if found else None


@pytest.mark.parametrize("id_", [i for i in ALL if _notebook(i.split(".")[0]) is not None])
def test_every_exercise_is_offered_in_its_notebook_with_hint_then_solution(id_):
    cells = _notebook(id_.split(".")[0])["cells"]
    checking = [c for c in cells if c["cell_type"] == "code" and f'check("{id_}", ' in "".join(c["source"])]
    assert checking, f"no cell of its notebook calls check({id_!r}, ...)"
    assert all(IMPORT_LINE in "".join(c["source"]) for c in checking), f"the cell checking {id_} imports {IMPORT_LINE}"
    markdown = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert f'Stuck? `hint("{id_}")` first' in markdown and f'then `solution("{id_}")`' in markdown


def test_check_prints_its_verdict_in_a_notebook_once_whatever_follows_it(capsys):
    """In IPython the verdict shows when check runs: a print after it cannot hide it, and as the last line it shows once."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.run_cell("from course_lib.exercises import check", store_history=True)
        capsys.readouterr()
        shell.run_cell("check('00.1', lambda x: x)\nprint('after')", store_history=True)
        out = capsys.readouterr().out
        assert out.count("[00.1] ✘ Not yet") == 1 and out.rstrip().endswith("after"), out
        assert max(len(line) for line in out.splitlines()) <= 100, out  # wrapped between words, not by the browser
        shell.run_cell("check('00.1', lambda x: x)", store_history=True)
        assert capsys.readouterr().out.count("[00.1] ✘ Not yet") == 1
        shell.run_cell("fb = check('00.1', lambda x: x)", store_history=True)
        capsys.readouterr()
        shell.run_cell("fb", store_history=True)  # shown again when asked for in a later cell
        assert capsys.readouterr().out.count("[00.1] ✘ Not yet") == 1
    finally:
        InteractiveShell.clear_instance()


def test_check_prints_its_verdict_once_in_a_plain_python_script(tmp_path):
    """A learner's script (no IPython) sees each verdict once, without wrapping check in print()."""
    import os
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "answers.py"
    script.write_text(textwrap.dedent("""
        import jax
        from course_lib.exercises import check

        check("00.1", lambda x: x)
        check("00.1", lambda x: jax.device_put(x, jax.devices()[3]))
        print("after")
    """))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root, JAX_NUM_CPU_DEVICES="8", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.count("[00.1] ✘ Not yet") == 1 and out.count("[00.1] ✔ Correct") == 1, out
    assert out.index("✘ Not yet") < out.index("✔ Correct") < out.index("after"), out
    assert max(len(line) for line in out.splitlines()) <= 100, out


def test_check_returns_the_verdict_it_printed(capsys):
    from course_lib.exercises import check

    feedback = check("00.1", lambda x: x)
    assert not feedback and capsys.readouterr().out == feedback.wrapped() + "\n"


def test_a_failing_call_shows_small_arguments_by_value():
    def split(x, n):
        raise ValueError("no")

    with pytest.raises(Mismatch, match=r"split\(Array float32\[4\], 4\) raised ValueError"):
        call(split, jnp.zeros(4), 4)


def test_a_learners_error_is_quoted_without_file_paths_or_a_dangling_colon():
    def fails(x):
        raise ValueError("the shapes disagree:\n(4,) against (8,)\nThis error occurs at source: /home/me/nb.py:12")

    def fails_with_path(x):
        raise TypeError("bad input in /tmp/ipykernel_123/456.py:7 here")

    with pytest.raises(Mismatch) as info:
        call(fails, 1)
    assert "the shapes disagree: (4,) against (8,)" in str(info.value) and "/home" not in str(info.value)
    with pytest.raises(Mismatch) as info:
        call(fails_with_path, 1)
    assert "bad input in <file> here" in str(info.value) and "/tmp" not in str(info.value)
