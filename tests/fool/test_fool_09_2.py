"""Exercise 09.2 (least-squares fit of dispatch and step costs): answers that try to fool the checker."""

import numpy as np

from fooling import fool_tests

ID = "09.2"


def polyfit_inv(ks, ms):
    d, s = np.polyfit(1.0 / np.asarray(ks, float), np.asarray(ms, float), 1)
    return float(d), float(s)


def two_points(ks, ms):              # a line through the first and the last point only
    x = 1.0 / np.asarray(ks, float)
    d = (ms[0] - ms[-1]) / (x[0] - x[-1])
    return float(d), float(ms[-1] - d * x[-1])


def lstsq(ks, ms):
    a = np.stack([1.0 / np.asarray(ks, float), np.ones(len(ks))], axis=1)
    (d, s), *_ = np.linalg.lstsq(a, np.asarray(ms, float), rcond=None)
    return float(d), float(s)


def by_covariance(ks, ms):
    x, y = 1.0 / np.asarray(ks, float), np.asarray(ms, float)
    d = np.sum((x - x.mean()) * (y - y.mean())) / np.sum((x - x.mean()) ** 2)
    return d, y.mean() - d * x.mean()


WRONG = [
    ("swapped", lambda ks, ms: polyfit_inv(ks, ms)[::-1], "Swapped"),
    ("line in k", lambda ks, ms: tuple(np.polyfit(np.asarray(ks, float), ms, 1)), "straight line fitted in k itself"),
    ("time per dispatch against k",
     lambda ks, ms: tuple(np.polyfit(np.asarray(ks, float), np.asarray(ks) * np.asarray(ms), 1)[::-1]),
     "time per dispatch"),
    ("two points only", two_points, "expected ("),
    ("last point as the step cost", lambda ks, ms: (float((ms[0] - ms[-1]) / (1 - 1 / ks[-1])), float(ms[-1])),
     "expected ("),
    ("three values", lambda ks, ms: (*polyfit_inv(ks, ms), 0.0), "expected a tuple of 2"),
    ("half precision", lambda ks, ms: tuple(np.float16(v) for v in polyfit_inv(ks, ms)), "float16"),
]
RIGHT = [("np.linalg.lstsq", lstsq), ("covariance formula", by_covariance),
         ("np.polyfit's array itself", lambda ks, ms: np.polyfit(1.0 / np.asarray(ks, float), ms, 1))]


verdict, test_a_wrong_answer_fails_and_its_feedback_names_the_mistake, \
    test_a_right_answer_written_another_way_passes = fool_tests(ID, WRONG, RIGHT)


# ---- Fresh answers (issue 44), written as learners would: each wrong one fails with what differs (or its mistake,
# where the numbers confirm it); each right one in another form passes.

import numpy as _np  # noqa: E402
from course_lib.exercises.lesson09 import solution_fit_dispatch_and_step as _fit  # noqa: E402

FRESH = [
    ("the intercept only", lambda ks, ms: float(_np.polyfit(1 / _np.asarray(ks, float), ms, 1)[1]),
     "expected a tuple of 2"),
    ("rounded to 1 decimal", lambda ks, ms: tuple(round(v, 1) for v in _fit(ks, ms)), "rounded to 1 decimal place"),
    ("np.polyfit's array", lambda ks, ms: _np.polyfit(1 / _np.asarray(ks, float), ms, 1), None),
]


from fooling import fresh_test as _fresh_test  # noqa: E402

test_a_fresh_answer_gets_what_differs = _fresh_test('09.2', FRESH)


def test_fits_in_either_order_and_two_point_lines_are_named():
    import numpy as _n
    from course_lib.exercises import check as _c
    k_ms = lambda ks, ms: tuple(_n.polyfit(_n.asarray(ks, float), _n.asarray(ks) * ms, 1))
    assert "time per dispatch (k times ms)" in _c("09.2", k_ms).message
    assert "The pair is swapped too" in _c("09.2", k_ms).message
    two = lambda ks, ms: (lambda e: tuple(_n.polyfit(1 / _n.asarray(ks, float)[e], _n.asarray(ms)[e], 1)))(
        [int(_n.argmin(ks)), int(_n.argmax(ks))])
    assert "runs through two points" in _c("09.2", two).message
