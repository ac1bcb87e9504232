"""Exercise 08.1 (the rows one process loads): wrong answers fail with feedback naming their mistake; right
answers written differently pass."""

import numpy as np
import pytest

from course_lib.exercises import check

WRONG = {
    "interleaved rows": (lambda b, n, p: slice(p, None, n), ["interleaved"]),
    "one row too many": (lambda b, n, p: slice(p * (b // n), (p + 1) * (b // n) + 1), ["It selects one row too many"]),
    "true division": (lambda b, n, p: slice(p * b / n, (p + 1) * b / n), ["must be ints"]),
    "a range, not a slice": (lambda b, n, p: range(p * (b // n), (p + 1) * (b // n)), ["should return a slice"]),
    "two processes assumed": (lambda b, n, p: slice(p * (b // 2), (p + 1) * (b // 2)), ["shape (48,) where (24,) was expected"]),
    "shifted by one block": (lambda b, n, p: slice((p + 1) * (b // n) % b, (p + 1) * (b // n) % b + b // n),
                             ["every value off by +32"]),
    "a list of row numbers": (lambda b, n, p: list(range(p * (b // n), (p + 1) * (b // n))),
                              ["should return a slice"]),
    "the device count, not the processes": (lambda b, n, p: slice(p * (b // 8), (p + 1) * (b // 8)), ["global_batch // 8 rows in every case"]),
}


@pytest.mark.parametrize("name", WRONG)
def test_wrong_answer_is_named(name):
    answer, fragments = WRONG[name]
    fb = check("08.1", answer)
    assert not fb, name
    for fragment in fragments:
        assert fragment in fb.message, (name, fb.message)


def _numpy_ints(global_batch, num_processes, process_id):
    start, stop = np.array([process_id, process_id + 1]) * (global_batch // num_processes)
    return slice(start, stop)


def _from_the_fraction(global_batch, num_processes, process_id):
    start = global_batch * process_id // num_processes
    return slice(start, start + global_batch // num_processes, 1)


@pytest.mark.parametrize("answer", [_numpy_ints, _from_the_fraction])
def test_right_answer_passes(answer):
    fb = check("08.1", answer)
    assert fb, fb.message


# ---- Fresh answers (issue 44), written as learners would: each wrong one fails with what differs (or its mistake,
# where the numbers confirm it); each right one in another form passes.

FRESH = [
    ("8 processes written in", lambda b, n, p: slice(p * (b // 8), (p + 1) * (b // 8)), "global_batch // 8 rows in every case"),
    ("one row short", lambda b, n, p: slice(p * (b // n), (p + 1) * (b // n) - 1), "one row short: stop is exclusive"),
    ("jax.process_count()", lambda b, n, p: slice(p * b, (p + 1) * b), "divides by 1 (jax.process_count() is 1"),
    ("ids from 1", lambda b, n, p: slice((p - 1) * (b // n), p * (b // n)), "process 0 got no rows"),
    ("float division", lambda b, n, p: slice(p * b / n, (p + 1) * b / n), "start and stop must be ints"),
    ("a (start, stop) tuple", lambda b, n, p: (p * (b // n), (p + 1) * (b // n)), "should return a slice"),
]


from fooling import fresh_test as _fresh_test  # noqa: E402

test_a_fresh_answer_gets_what_differs = _fresh_test('08.1', FRESH)
