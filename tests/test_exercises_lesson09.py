"""Lesson 09 checkers: the formula and the fit, checked on made-up numbers (no timing)."""

import numpy as np

from course_lib.exercises import check
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
    assert not fb and "ms_per_step(float, float, int) raised ZeroDivisionError" in fb.message
    fb = check("09.1", lambda d, s, k: (d / k, s))
    assert not fb and "should be one number, got tuple(float, float)" in fb.message
    fb = check("09.1", lambda d, s, k: np.array([d / k + s] * k))
    assert not fb and "should be one number, got shape (1,)" in fb.message


def test_09_2_fit_dispatch_and_step():
    assert check("09.2", solution_fit_dispatch_and_step)
    fb = check("09.2", lambda ks, ms: solution_fit_dispatch_and_step(ks, ms)[::-1])
    assert not fb and "swapped" in fb.message
    fb = check("09.2", lambda ks, ms: tuple(np.polyfit(ks, ms, 1)))
    assert not fb and "fitted a line in k" in fb.message
    two_points = check("09.2", lambda ks, ms: ((ms[0] - ms[-1]) / (1 - 1 / ks[-1]),
                                              ms[-1] - (ms[0] - ms[-1]) / (1 - 1 / ks[-1]) / ks[-1]))
    assert not two_points and "Fit every measurement, against 1 / k" in two_points.message
    fb = check("09.2", lambda ks, ms: np.polyfit(1 / ks, ms, 1))
    assert not fb and "fit_dispatch_and_step(list, ndarray float64[5]) raised TypeError" in fb.message
    fb = check("09.2", lambda ks, ms: {"dispatch_ms": 0.6, "step_ms": 0.12})
    assert not fb and "should return a pair (dispatch_ms, step_ms); got dict{'dispatch_ms': float" in fb.message
