"""Lesson 09 checkers: the formula and the fit, checked on made-up numbers (no timing)."""

import numpy as np

from course_lib.exercises import check
from course_lib.exercises.lesson09 import MISTAKES_09_1, MISTAKES_09_2, solution_fit_dispatch_and_step, \
    solution_ms_per_step
from hint_rules import assert_hints_are_a_ladder, code_from_solution


def wrong(id_, answer):
    fb = check(id_, answer)
    assert not fb and fb.started, fb.message
    return fb.message


def test_09_1_every_declared_mistake_is_named_by_its_own_feedback():
    for m in MISTAKES_09_1:
        assert m.feedback in wrong("09.1", m.fn), m.name


def test_09_1_other_forms_and_shapes():
    assert check("09.1", solution_ms_per_step)
    assert check("09.1", lambda d, s, k: np.float32(d / k + s)), "float32 is precise enough"
    assert "ZeroDivisionError" in wrong("09.1", lambda d, s, k: d / (k - 1) + s)
    assert "got tuple(float, float)" in wrong("09.1", lambda d, s, k: (d / k, s))
    assert "shape (1,) where () was expected" in wrong("09.1", lambda d, s, k: np.array([d / k + s] * k))
    assert "one number, got str" in wrong("09.1", lambda d, s, k: str(d / k + s))
    assert "float16" in wrong("09.1", lambda d, s, k: np.float16(d / k + s))


def test_09_1_rounded_answers_fail_and_the_rounding_is_named():
    assert "got 0.36. That is the right result rounded to 2" in wrong("09.1", lambda d, s, k: round(d / k + s, 2))
    assert "rounded to 3 decimals" in wrong("09.1", lambda d, s, k: round(d / k + s, 3))   # the engine's relation


def test_09_2_every_declared_mistake_is_named_and_other_forms_pass():
    for m in MISTAKES_09_2:
        assert m.feedback in wrong("09.2", m.fn), m.name
    assert check("09.2", solution_fit_dispatch_and_step)
    assert check("09.2", lambda ks, ms: np.polyfit(1 / np.asarray(ks), ms, 1)), "polyfit's array is a pair"
    assert "raised TypeError" in wrong("09.2", lambda ks, ms: np.polyfit(1 / ks, ms, 1))
    assert "got dict{'dispatch_ms': float" in wrong("09.2", lambda ks, ms: {"dispatch_ms": 0.6, "step_ms": 0.12})
    def line(ks, ms):                           # through the points at the smallest and the largest k
        i, j = int(np.argmin(ks)), int(np.argmax(ks))
        d = (ms[i] - ms[j]) / (1 / ks[i] - 1 / ks[j])
        return d, ms[j] - d / ks[j]
    two_points = wrong("09.2", line)
    assert "expected (" in two_points and "runs through two points, at the smallest and the largest k" in two_points


def test_09_2_in_place_and_half_precision():
    def in_place(ks, ms):
        out = solution_fit_dispatch_and_step(ks, ms)
        ms[:] = 0.0
        return out
    assert "changed its input ms in place" in wrong("09.2", in_place)
    assert "float16" in wrong("09.2", lambda ks, ms: tuple(np.float16(v) for v in solution_fit_dispatch_and_step(ks, ms)))


def test_hints_and_feedback_hold_no_solution_code():
    for id_, mistakes in [("09.1", MISTAKES_09_1), ("09.2", MISTAKES_09_2)]:
        assert_hints_are_a_ladder(id_)
        for m in mistakes:
            assert not code_from_solution(id_, check(id_, m.fn).message), m.name
