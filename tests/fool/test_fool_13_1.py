"""Try to fool exercise 13.1 (predict the training state's bytes per TPU chip): wrong predictions a learner might
write fail with feedback that names their mistake; right ones written differently pass. The checker compiles each
configuration once (cached), so the answers after the first are checked without compiling."""

import numpy as np
import pytest

from course_lib.exercises import check
from course_lib.exercises import lesson13 as L

pytestmark = pytest.mark.skipif(L.tpu_compiler_missing() is not None, reason="libtpu is not installed here")


def counts(c):
    D, M, L_, V, S = c["D"], c["MLP"], c["LAYERS"], c["VOCAB"], c["SEQ"]
    layers = L_ * (4 * D * D + 2 * D * M + 2 * D)
    return layers, 2 * V * D + S * D + D


def per_chip(bytes_per_param, split_rest=False, split_layers=True):
    def predict(c, n_chips, fsdp):
        layers, rest = counts(c)
        layers = layers / n_chips if fsdp and split_layers else layers
        rest = rest / n_chips if split_rest else rest
        return bytes_per_param * (layers + rest)
    return predict


WRONG = {
    "parameters only": (per_chip(4), "besides the parameters?"),
    "one moment": (per_chip(8), "and in which dtype?"),
    "gradients counted (16 bytes)": (per_chip(16), "free before it returns?"),
    "bfloat16 state": (per_chip(6), "In which dtype"),
    "everything divided by the chips": (lambda c, n, f: 12 * sum(counts(c)) / n, "which does FSDP?"),
    "every array divided under FSDP": (lambda c, n, f: 12 * sum(counts(c)) / (n if f else 1),
                                       "which does FSDP?"),
    "bfloat16 parameters, float32 moments": (per_chip(10), "In which dtype"),
    "FSDP not split": (per_chip(12, split_layers=False), "which does FSDP?"),
    "only the layers": (lambda c, n, f: 12 * (counts(c)[0] / (n if f else 1)), "Is every parameter of the model"),
    "data parallelism split like FSDP": (lambda c, n, f: 12 * (counts(c)[0] / n + counts(c)[1]),
                                         "which does FSDP?"),
    "FSDP over half the chips": (lambda c, n, f: 12 * (counts(c)[0] / (n / 2 if f else 1) + counts(c)[1]),
                                 "is too high"),
    "FSDP over a fixed 8 chips": (lambda c, n, f: 12 * (counts(c)[0] / (8 if f else 1) + counts(c)[1]),
                                  "divides by a fixed number of chips"),
    "24 bytes per parameter": (per_chip(24), "is too high"),
    "position embedding left out": (lambda c, n, f: per_chip(12)(c, n, f) - 12 * c["SEQ"] * c["D"],
                                    "Is every parameter of the model"),
    "in bits": (lambda c, n, f: 8 * per_chip(12)(c, n, f), "bits"),
    "in GiB": (lambda c, n, f: per_chip(12)(c, n, f) / 2**30, "looks like GiB"),
    "a list per array": (lambda c, n, f: [per_chip(12)(c, n, f)], "expected one number"),
    "crashes": (lambda c, n, f: c["WIDTH"], "raised KeyError"),
}


def test_near_misses_are_told_what_differs_not_a_mistake_they_did_not_make():
    """Within 1% of a declared mistake on one case is not that mistake: only a match on every case names it."""
    for near in (lambda c, n, f: L._state(16)(c, n, f) * 0.995, lambda c, n, f: L._state(8)(c, n, f) + 1000 * n,
                 lambda c, n, f: L._state(12, rest_over=lambda k, f: k)(c, n, f) * (1.009 if f else 0.991)):
        message = check("13.1", near).message
        assert not any(m.feedback in message for m in L.MISTAKES_13_1), message
        assert "you predicted" in message and ("too high" in message or "too low" in message), message


@pytest.mark.parametrize("name", list(WRONG))
def test_wrong_answer_fails_and_names_its_mistake(name):
    answer, named = WRONG[name]
    feedback = check("13.1", answer)
    assert not feedback, f"{name} passed"
    assert named in feedback.message, (name, feedback.message)


def right_by_arrays(c, n_chips, fsdp):
    """Count array by array from the shapes, as a learner reading init_params would."""
    D, M, L_, V, S = c["D"], c["MLP"], c["LAYERS"], c["VOCAB"], c["SEQ"]
    shapes = {"wqkv": (L_, D, 3 * D), "wo": (L_, D, D), "w1": (L_, D, M), "w2": (L_, M, D),
              "norm1": (L_, D), "norm2": (L_, D)}
    outside = [(V, D), (S, D), (D,), (D, V)]
    per_param = 4 + 4 + 4                                    # value, mu, nu, float32 each
    total = sum(np.prod(s) / (n_chips if fsdp else 1) for s in shapes.values()) + sum(np.prod(s) for s in outside)
    return int(per_param * total)                            # the step counter's 4 bytes are within the tolerance


def right_in_two_parts(c, n_chips, fsdp):
    """Parameters, then Adam's two moments like them, as a float."""
    layers, rest = counts(c)
    params = 4.0 * (layers / n_chips + rest if fsdp else layers + rest)
    return params + 2 * params + 4


@pytest.mark.parametrize("answer", [right_by_arrays, right_in_two_parts, L.solution_predict_state_bytes])
def test_right_answers_written_differently_pass(answer):
    feedback = check("13.1", answer)
    assert feedback, feedback.message


# ---- Fresh answers (issue 44), written as learners would: each wrong one fails with what differs (or its mistake,
# where the numbers confirm it); each right one in another form passes.

from course_lib.exercises.lesson13 import solution_predict_state_bytes as _s13  # noqa: E402

FRESH = [
    ("8 chips written in", lambda c, n, f: _s13(c, 8, f), "divides by a fixed number of chips"),
    ("FSDP split over a fixed 4 chips", lambda c, n, f: 12 * (counts(c)[0] / (4 if f else 1) + counts(c)[1]),
     "returns the same number for 4 and 8 chips"),
    ("returns None", lambda c, n, f: None, "returned None: did it forget"),
    ("an int", lambda c, n, f: int(_s13(c, n, f)), None),
]


from fooling import fresh_test as _fresh_test  # noqa: E402

test_a_fresh_answer_gets_what_differs = _fresh_test('13.1', FRESH)
