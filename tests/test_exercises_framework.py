"""course_lib.exercises: feedback, the building blocks of checkers, and every reference solution."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from course_lib import exercises as ex
from course_lib.exercises import Mismatch, call, check, expect_array, expect_placed_on, solution

ALL = ex.exercises()


# What each lesson's issue asks for; three elsewhere.
MINIMUM_EXERCISES = {"04": 4, "06": 2, "07": 1, "08": 2}


def test_every_lesson_with_exercises_has_enough():
    lessons = {}
    for id_ in ALL:
        lessons.setdefault(id_.split(".")[0], []).append(id_)
    assert set(lessons) >= {"01", "02", "03", "04", "05", "06", "07", "08"}
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
    assert f"def {ALL[id_].solution.__name__}(" in out


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
    exercise = ex.Exercise("97.1", "double", lambda f: (expect_array(call(f, jnp.arange(3.0)),
                                                                     np.arange(3.0) * 2), "good")[1], None)
    assert exercise.check(lambda x: 2 * x).passed
    wrong = exercise.check(lambda x: x + 2)
    assert not wrong.passed and str(wrong).startswith("[97.1] ✘ Not yet: ")
    assert "2 of 3 values differ; first at index (0,): expected 0.0, got 2.0" in wrong.message


def test_call_reports_the_learners_exception_with_inputs():
    def broken(x, n):
        raise IndexError("tuple index out of range")

    with pytest.raises(Mismatch, match=r"broken\(Array float32\[4, 3\], n=int\) raised IndexError: tuple index"):
        call(broken, jnp.zeros((4, 3)), n=2)
    with pytest.raises(Mismatch, match="expected a function, got ndarray"):
        call(np.zeros(2))
    with pytest.raises(Mismatch, match=r"placeholder\(Array float32\[2\]\) returned None: write the function's body"):
        call(lambda x: None, jnp.zeros(2), name="placeholder")


def test_expect_array_messages():
    with pytest.raises(Mismatch, match=r"has shape \(4, 3\); expected \(2, 2, 3\)"):
        expect_array(jnp.zeros((4, 3)), np.zeros((2, 2, 3)))
    with pytest.raises(Mismatch, match="is None: did the function forget to `return`"):
        expect_array(None, np.zeros(2))
    with pytest.raises(Mismatch, match=r"should be an array of shape \(2,\), got object"):
        expect_array(object(), np.zeros(2))
    expect_array([1.0, 2.0], np.array([1.0, 2.0]))  # lists are fine
    with pytest.raises(Mismatch, match=r"first at index \(1, 0\): expected 5.0, got 6.0"):
        expect_array(np.array([[1.0, 2.0], [6.0, 4.0]]), np.array([[1.0, 2.0], [5.0, 4.0]]))


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
