"""Exercise 09.1 (predict the time per step when k steps share one dispatch): answers that try to fool it."""

import numpy as np

from fooling import fool_tests

ID = "09.1"

WRONG = [
    ("work divided by k too", lambda d, s, k: (d + s) / k, "The step's own work was divided by k too"),
    ("dispatch only", lambda d, s, k: d / k, "Only the dispatch is counted"),
    ("dispatch times k", lambda d, s, k: d * k + s, "that grows with k"),
    ("work times k", lambda d, s, k: d + k * s, "that grows with k"),
    ("floor division", lambda d, s, k: d // k + s, "Floor division"),
    ("k ignored", lambda d, s, k: d + s, "k has no effect"),
    ("half precision", lambda d, s, k: np.float16(d / k + s), "float16"),
    ("a pair", lambda d, s, k: (d / k, s), "got tuple(float, float)"),
    ("one dispatch too many", lambda d, s, k: d / (k + 1) + s, "expected 0.6, got 0.35"),
    ("costs swapped", lambda d, s, k: d + s / k, "The two costs are swapped"),
    ("work times k, dispatch shared", lambda d, s, k: d / k + s * k, "The step's own work is multiplied by k"),
    ("rounded to hundredths", lambda d, s, k: round(d / k + s, 2), "expected"),
    ("rounded to thousandths", lambda d, s, k: round(d / k + s, 3), "expected"),
]
RIGHT = [
    ("total over k", lambda d, s, k: (d + k * s) / k),
    ("numpy, reciprocal", lambda d, s, k: float(np.float64(d) * (1.0 / k) + np.float64(s))),
]


verdict, test_a_wrong_answer_fails_and_its_feedback_names_the_mistake, \
    test_a_right_answer_written_another_way_passes = fool_tests(ID, WRONG, RIGHT)


# ---- Fresh answers (issue 44), written as learners would: each wrong one fails with what differs (or its mistake,
# where the numbers confirm it); each right one in another form passes.

import numpy as _np  # noqa: E402

FRESH = [
    ("rounded to 1 decimal", lambda d, s, k: round(d / k + s, 1), "expected 0.363333, got 0.4"),
    ("k - 1 steps share the dispatch", lambda d, s, k: d / (k - 1) + s if k > 1 else d + s, "shared by k - 1 steps"),
    ("returns None", lambda d, s, k: None, "returned None: did it forget"),
    ("a NumPy float32", lambda d, s, k: _np.float32(d / k + s), None),
]


from fooling import fresh_test as _fresh_test  # noqa: E402

test_a_fresh_answer_gets_what_differs = _fresh_test('09.1', FRESH)


def test_a_dispatch_shared_by_k_minus_1_is_told_so():
    from course_lib.exercises import check as _c
    assert "shared by k - 1 steps" in _c("09.1", lambda d, s, k: d / max(k - 1, 1) + s).message
    assert "zero. At k = 1 your formula divides by zero" in _c("09.1", lambda d, s, k: d / (k - 1) + s).message
