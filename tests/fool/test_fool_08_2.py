"""Exercise 08.2 (the rows for the devices a process owns): wrong answers fail with feedback naming their
mistake; right answers written differently pass."""

import jax
import numpy as np
import pytest

from course_lib.exercises import check


def _owned(devices, p):
    return [i for i, d in enumerate(devices) if d.process_index == p]


WRONG = {
    "a contiguous block": (lambda b, d, p: b[p * (len(d) // 2):(p + 1) * (len(d) // 2)],
                           ["contiguous block", "process_index"]),
    "ids as positions": (lambda b, d, p: b[[x.id for x in d if x.process_index == p]], ["id is a label"]),
    "ids modulo the device count": (lambda b, d, p: b[np.array([x.id for x in d if x.process_index == p]) % len(d)],
                                    ["Device ids are labels, not positions"]),
    "always process 0": (lambda b, d, p: b[_owned(d, 0)], ["rows of process 0's devices"]),
    "this process, not the argument": (lambda b, d, p: b[_owned(d, jax.process_index())],
                                       ["rows of process 0's devices"]),
    "rows sorted by device id": (lambda b, d, p: b[[i for i, _ in sorted(
        ((i, x) for i, x in enumerate(d) if x.process_index == p), key=lambda t: t[1].id)]], ["another order"]),
    "owner read from the id": (lambda b, d, p: b[[i for i, x in enumerate(d) if x.id // 2048 == p]],
                               ["whatever its id"]),
    "a cast to float": (lambda b, d, p: b[_owned(d, p)].astype(np.float64), ["dtype float64 where int64 was expected"]),
    "a boolean mask of the wrong owner test": (lambda b, d, p: b[np.array([x.process_index != p for x in d])],
                                               ["the owner test is reversed"]),
}


@pytest.mark.parametrize("name", WRONG)
def test_wrong_answer_is_named(name):
    answer, fragments = WRONG[name]
    fb = check("08.2", answer)
    assert not fb, name
    for fragment in fragments:
        assert fragment in fb.message, (name, fb.message)


def _mask(batch, devices, process_index):
    return batch[np.array([d.process_index == process_index for d in devices])]


def _stacked(batch, devices, process_index):
    return np.stack([row for row, d in zip(batch, devices) if d.process_index == process_index])


@pytest.mark.parametrize("answer", [_mask, _stacked])
def test_right_answer_passes(answer):
    fb = check("08.2", answer)
    assert fb, fb.message


# ---- Fresh answers (issue 44), written as learners would: each wrong one fails with what differs (or its mistake,
# where the numbers confirm it); each right one in another form passes.

import jax.numpy as _jnp  # noqa: E402
from course_lib.exercises.lesson08 import solution_local_part as _local  # noqa: E402

FRESH = [
    ("the first half of the rows", lambda b, d, p: b[:len(b) // 2], "values differ; first at index"),
    ("a jax array (int32)", lambda b, d, p: _jnp.asarray(_local(b, d, p)), "dtype int32 where int64"),
    ("d.id compared", lambda b, d, p: b[[i for i, x in enumerate(d) if x.id == p]], "compares each device's id"),
    ("returns None", lambda b, d, p: None, "returned None: did it forget"),
    ("a list of rows", lambda b, d, p: [b[i] for i, x in enumerate(d) if x.process_index == p], None),
]


from fooling import fresh_test as _fresh_test  # noqa: E402

test_a_fresh_answer_gets_what_differs = _fresh_test('08.2', FRESH)
