"""Exercise 05.3 (a loss that ignores padding): wrong answers and differently written right ones."""

import jax.numpy as jnp
import numpy as np
import pytest

from course_lib.exercises import check


def python_if(p, y, m):
    if jnp.sum(m) == 0:
        return jnp.float32(0.0)
    return jnp.sum(m * (p - y) ** 2) / jnp.sum(m)


WRONG = [
    (lambda p, y, m: jnp.mean((p - y) ** 2), ["the padding rows counted as if they were real"]),
    (lambda p, y, m: jnp.sum((p * m - y) ** 2) / jnp.maximum(jnp.sum(m), 1), ["1.3x too large"]),  # y unmasked
    (lambda p, y, m: jnp.sum(m * (p - y) ** 2) / p.shape[0], ["divided by all the rows"]),
    (lambda p, y, m: jnp.sum(m * (p - y) ** 2) / jnp.sum(m), ["got nan", "0 / 0"]),
    (lambda p, y, m: jnp.nan_to_num(jnp.sum(m * (p - y) ** 2) / jnp.sum(m)), ["its gradient there is"]),
    (lambda p, y, m: jnp.mean(((p - y) ** 2)[m]), ["indexing with a boolean mask"]),
    (python_if, ["float(), int(), bool(), np.asarray(), np.float32() or a Python if"]),
    (lambda p, y, m: np.float32(jnp.sum(m * (p - y) ** 2) / jnp.maximum(jnp.sum(m), 1.0)),
     ["raised TracerArrayConversionError", "np.asarray(), np.float32() or a Python if on a value need a concrete "
                                           "number"]),
    (lambda p, y, m: jnp.sum((jnp.arange(p.shape[0]) < m.sum()) * (p - y) ** 2) / jnp.maximum(m.sum(), 1),
     ["the mean over the FIRST"]),
    (lambda p, y, m: (jnp.sum(m * (p - y) ** 2) / jnp.maximum(jnp.sum(m), 1)).astype(jnp.float16),
     ["dtype float16 where float32 was expected"]),
    (lambda p, y, m: m * (p - y) ** 2, ["shape (8,) where () was expected"]),
    (lambda p, y, m: jnp.sum(jnp.where(m, jnp.abs(p - y), 0)) / jnp.maximum(m.sum(), 1), ["the mean ABSOLUTE error"]),
]


@pytest.mark.parametrize("answer, named", WRONG, ids=[f"wrong{i}" for i in range(len(WRONG))])
def test_wrong_answer_fails_and_the_feedback_names_the_mistake(answer, named):
    fb = check("05.3", answer)
    assert not fb, fb.message
    for words in named:
        assert words in fb.message, fb.message
    assert "maximum" not in fb.message and "max(" not in fb.message, "the fix is left to hint()"


@pytest.mark.parametrize("answer", [
    lambda p, y, m: jnp.sum(jnp.where(m, (p - y) ** 2, 0.0)) / jnp.maximum(jnp.sum(m), 1),
    lambda p, y, m: jnp.vdot(m.astype(jnp.float32), (p - y) ** 2) / jnp.clip(m.sum(), 1, None),
], ids=["where", "vdot"])
def test_right_answers_written_differently_pass(answer):
    fb = check("05.3", answer)
    assert fb, fb.message
