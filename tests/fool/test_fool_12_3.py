"""Exercise 12.3 (predict an FSDP step's collectives) against answers that try to fool it.

Wrong answers: the mistakes the lesson warns about (no re-gather in the checkpointed backward, a re-gather of the
biases after the nonlinearity, none of the biases inside it, a re-gather without jax.checkpoint, one layer's count)
and counting mistakes. Each must fail with feedback that names the mistake; right answers written another way pass.
"""

import numpy as np
import pytest

from course_lib.exercises import check


def _answer(gathers, scatters=lambda n, k, i, o: n * (k + i + o), reduces=lambda n: 1):
    def predict(n_layers, matrices, inner_biases, outer_biases, remat):
        return {"all-gather": gathers(n_layers, matrices, inner_biases, outer_biases, remat),
                "reduce-scatter": scatters(n_layers, matrices, inner_biases, outer_biases),
                "all-reduce": reduces(n_layers)}
    return predict


WRONG = [
    (_answer(lambda n, k, i, o, r: n * (k + i + o)), "What must the backward pass do"),
    (_answer(lambda n, k, i, o, r: n * 2 * (k + i + o) if r else n * (k + i + o)), "Which arrays do those"),
    (_answer(lambda n, k, i, o, r: n * (2 * k + i + o) if r else n * (k + i + o)), "Which arrays do those"),
    (_answer(lambda n, k, i, o, r: n * (2 * (k + i) + o)), "without jax.checkpoint"),
    (_answer(lambda n, k, i, o, r: (2 * (k + i) + o) if r else (k + i + o),
             scatters=lambda n, k, i, o: k + i + o), "one layer's collectives"),
    (_answer(lambda n, k, i, o, r: n * (2 * (k + i) + o) if r else n * (k + i + o),
             scatters=lambda n, k, i, o: n * (k + i)), "Reduce-scatters"),
    (_answer(lambda n, k, i, o, r: n * (2 * (k + i) + o) if r else n * (k + i + o),
             scatters=lambda n, k, i, o: n * (2 * (k + i) + o)), "how many gradients"),
    (_answer(lambda n, k, i, o, r: n * (2 * (k + i) + o) if r else n * (k + i + o), reduces=lambda n: n),
     "All-reduces"),
    (_answer(lambda n, k, i, o, r: n * (2 * (k + i) + o) if r else n * (k + i + o), reduces=lambda n: 0),
     "which values in the step are averaged"),
    (lambda n, k, i, o, r: (n, k, 1), "expected a dict"),
    (lambda n, k, i, o, r: {"all-gather": 2.5, "reduce-scatter": 1, "all-reduce": 1}, "whole number"),
]


@pytest.mark.parametrize("answer, named", WRONG, ids=[f"wrong-{i}" for i in range(len(WRONG))])
def test_wrong_answer_fails_and_is_named(answer, named):
    feedback = check("12.3", answer)
    assert not feedback, feedback.message
    assert named in feedback.message, feedback.message


def _counted(n_layers, matrices, inner_biases, outer_biases, remat):
    counts = {"all-gather": 0, "reduce-scatter": 0, "all-reduce": 1}
    for _ in range(n_layers):
        for kind in ["matrix"] * matrices + ["inner"] * inner_biases + ["outer"] * outer_biases:
            counts["all-gather"] += 1                          # forward
            counts["all-gather"] += int(remat and kind != "outer")   # the recomputation reads it
            counts["reduce-scatter"] += 1
    return counts


def _numpy_ints(n_layers, matrices, inner_biases, outer_biases, remat):
    again = (matrices + inner_biases) * (2 if remat else 1)
    return {"all-reduce": np.int64(1), "all-gather": np.int32(n_layers * (again + outer_biases)),
            "reduce-scatter": float(n_layers * (matrices + inner_biases + outer_biases))}


def _jax_floats(n_layers, matrices, inner_biases, outer_biases, remat):
    import jax.numpy as jnp
    return {kind: jnp.float32(v) for kind, v in _counted(n_layers, matrices, inner_biases, outer_biases,
                                                          remat).items()}


def _zero_d_arrays(n_layers, matrices, inner_biases, outer_biases, remat):
    return {kind: np.array(v) for kind, v in _counted(n_layers, matrices, inner_biases, outer_biases, remat).items()}


@pytest.mark.parametrize("answer", [_counted, _numpy_ints, _jax_floats, _zero_d_arrays])
def test_right_answers_written_another_way_pass(answer):
    feedback = check("12.3", answer)
    assert feedback, feedback.message


def test_feedback_never_prints_the_compiled_counts():
    """A prediction exercise: the compiler's counts are the answer, so no feedback shows them."""
    from course_lib.exercises import lesson12 as L
    kinds = ("all-gather", "reduce-scatter", "all-reduce")
    for answer, _ in WRONG[:9]:
        message = check("12.3", answer).message
        case = next(c for c in L._CASES if {k: int(v) for k, v in answer(*c).items()}
                    != {k: L.measured_collectives(*c).get(k, 0) for k in kinds})
        compiled = {k: L.measured_collectives(*case).get(k, 0) for k in kinds}
        assert str(compiled) not in message, message


def test_a_near_miss_is_not_named_a_mistake():
    from course_lib.exercises import lesson12 as L
    off_by_one = _answer(lambda n, k, i, o, r: n * (2 * (k + i) + o) + 1 if r else n * (k + i + o))
    message = check("12.3", off_by_one).message
    assert "too many all-gathers" in message and not any(m.feedback in message for m in L.MISTAKES_12_3)


@pytest.mark.parametrize("answer", [a for a, _ in WRONG[:9]], ids=[f"wrong-{i}" for i in range(9)])
def test_feedback_never_prints_the_compiled_counts(answer):
    import ast
    import re
    from course_lib.exercises.lesson12 import _CASES
    message = check("12.3", answer).message
    printed = [ast.literal_eval(d) for d in re.findall(r"\{[^{}]*\}", message)]
    assert printed, message
    for counts in printed:                   # every count shown is the learner's own prediction
        assert counts in [answer(*case) for case in _CASES], message
    assert " once" not in message, message   # nor in words


# ---- Fresh answers (issue 44), written as learners would: each wrong one fails with what differs (or its mistake,
# where the numbers confirm it); each right one in another form passes.

import jax.numpy as _jnp  # noqa: E402
from course_lib.exercises.lesson12 import solution_predict as _sp  # noqa: E402

FRESH = [
    ("remat ignored", lambda n, k, i, o, r: _sp(n, k, i, o, True), "what does the backward pass read there"),
    ("an all-reduce per layer, plus one", lambda *a: {**_sp(*a), "all-reduce": a[0] + 1}, "too many all-reduces"),
    ("two reduce-scatters per array", lambda *a: {**_sp(*a), "reduce-scatter": 2 * _sp(*a)["reduce-scatter"]},
     "too many reduce-scatters"),
    ("returns None", lambda *a: None, "returned None: did it forget"),
    ("float32 counts", lambda *a: {k: _jnp.float32(v) for k, v in _sp(*a).items()}, None),
]


from fooling import fresh_test as _fresh_test  # noqa: E402

test_a_fresh_answer_gets_what_differs = _fresh_test('12.3', FRESH)
