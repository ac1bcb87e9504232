"""Lesson 09 checkers: the formula and the fit, checked on made-up numbers (no timing)."""

import numpy as np

import inspect
import re

from course_lib.exercises import _REGISTRY, check
from course_lib.exercises.lesson09 import solution_fit_dispatch_and_step, solution_ms_per_step


def test_09_1_ms_per_step():
    assert check("09.1", solution_ms_per_step)
    fb = check("09.1", lambda d, s, k: (d + s) / k)
    assert not fb and "the step's own work was divided by k too" in fb.message
    fb = check("09.1", lambda d, s, k: d * k + s)
    assert not fb and "that grows with k" in fb.message
    fb = check("09.1", lambda d, s, k: d / k)
    assert not fb and "only the dispatch is counted" in fb.message
    fb = check("09.1", lambda d, s, k: d / (k - 1) + s)
    assert not fb and "ms_per_step(0.5, 0.1, 1) raised ZeroDivisionError" in fb.message
    fb = check("09.1", lambda d, s, k: (d / k, s))
    assert not fb and "should be one number, got tuple(float, float)" in fb.message
    fb = check("09.1", lambda d, s, k: np.array([d / k + s] * k))
    assert not fb and "should be one number, got shape (1,)" in fb.message


def test_09_2_fit_dispatch_and_step():
    assert check("09.2", solution_fit_dispatch_and_step)
    fb = check("09.2", lambda ks, ms: solution_fit_dispatch_and_step(ks, ms)[::-1])
    assert not fb and "swapped" in fb.message
    fb = check("09.2", lambda ks, ms: tuple(np.polyfit(ks, ms, 1)))
    assert not fb and "fitted a straight line in k itself" in fb.message
    two_points = check("09.2", lambda ks, ms: ((ms[0] - ms[-1]) / (1 - 1 / ks[-1]),
                                              ms[-1] - (ms[0] - ms[-1]) / (1 - 1 / ks[-1]) / ks[-1]))
    assert not two_points and "Fit every measurement, against 1 / k" in two_points.message
    fb = check("09.2", lambda ks, ms: np.polyfit(1 / ks, ms, 1))
    assert not fb and "fit_dispatch_and_step(list, ndarray float64[5]) raised TypeError" in fb.message
    fb = check("09.2", lambda ks, ms: {"dispatch_ms": 0.6, "step_ms": 0.12})
    assert not fb and "should return a pair (dispatch_ms, step_ms); got dict{'dispatch_ms': float" in fb.message


def test_09_1_more_wrong_answers_are_named():
    fb = check("09.1", lambda d, s, k: d + s)
    assert not fb and "k has no effect" in fb.message
    fb = check("09.1", lambda d, s, k: np.float16(d / k + s))
    assert not fb and "float16" in fb.message
    fb = check("09.1", lambda d, s, k: str(d / k + s))
    assert not fb and "one number" in fb.message
    assert check("09.1", lambda d, s, k: np.float32(d / k + s)), "float32 is precise enough"
    fb = check("09.1", lambda d, s, k: d // k + s)
    assert not fb and "Floor division" in fb.message


def test_09_2_more_wrong_answers_are_named():
    def in_place(ks, ms):
        out = solution_fit_dispatch_and_step(ks, ms)
        ms[:] = 0.0
        return out
    fb = check("09.2", in_place)
    assert not fb and "changed its input ms in place" in fb.message
    fb = check("09.2", lambda ks, ms: tuple(np.float16(v) for v in solution_fit_dispatch_and_step(ks, ms)))
    assert not fb and "float16" in fb.message

    def per_dispatch(ks, ms):                     # fits k * ms against k: least squares of other residuals
        ks = np.asarray(ks, float)
        step, dispatch = np.polyfit(ks, ks * np.asarray(ms), 1)
        return dispatch, step
    fb = check("09.2", per_dispatch)
    assert not fb and "time per dispatch" in fb.message and "as measured" in fb.message


def _solution_lines(fn):
    body = inspect.getsource(fn).split(":", 1)[1]
    return [re.sub(r"\s+", "", line.split("#")[0]) for line in body.splitlines()
            if len(re.sub(r"\s+", "", line.split("#")[0])) >= 12]


def test_hints_and_feedback_hold_no_solution_code():
    wrong = {"09.1": [lambda d, s, k: (d + s) / k, lambda d, s, k: d / k, lambda d, s, k: d * k + s,
                      lambda d, s, k: d + s, lambda d, s, k: 0.0],
             "09.2": [lambda ks, ms: tuple(np.polyfit(ks, ms, 1)), lambda ks, ms: (0.0, 0.0),
                      lambda ks, ms: solution_fit_dispatch_and_step(ks, ms)[::-1]]}
    for id_, fn in [("09.1", solution_ms_per_step), ("09.2", solution_fit_dispatch_and_step)]:
        ex = _REGISTRY[id_]
        assert len(ex.hints) >= 3, "a ladder: a nudge, the API or the section, the steps in words"
        texts = list(ex.hints) + [check(id_, w).message for w in wrong[id_]]
        for line in _solution_lines(fn):
            for text in texts:
                assert line not in re.sub(r"\s+", "", text), (line, text)
        for h in ex.hints:
            for snippet in re.findall(r"`([^`]*)`", h):
                assert not re.search(r"\(\s*[^)\s]", snippet), snippet
            assert "polyfit(" not in h and "return " not in h
