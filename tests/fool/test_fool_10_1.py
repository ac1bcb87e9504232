"""Exercise 10.1 (bytes per device for each ZeRO stage): answers that try to fool the checker."""

from fractions import Fraction

import numpy as np
from fooling import fool_tests

ID = "10.1"
SPLIT = {"replicated": (), "zero1": ("opt_state",), "zero2": ("opt_state", "grads"),
         "fsdp": ("opt_state", "grads", "params")}


def table(n_params, n, stage, per=(4, 4, 8), split=SPLIT):
    parts = dict(zip(("params", "grads", "opt_state"), per))
    return {k: v * n_params / (n if k in split[stage] else 1) for k, v in parts.items()}


WRONG = [
    ("nothing split", lambda p, n, s: table(p, n, "replicated"), "Every stage keeps everything whole"),
    ("Adam with one moment", lambda p, n, s: table(p, n, s, per=(4, 4, 4)), "Adam keeps two float32"),
    ("zero1 splits the gradients", lambda p, n, s: table(p, n, s, split={**SPLIT, "zero1": ("opt_state", "grads")}),
     "ZeRO-1 reduce-scatters too"),
    ("fsdp keeps whole parameters", lambda p, n, s: table(p, n, s, split={**SPLIT, "fsdp": ("opt_state", "grads")}),
     "this answer keeps params whole"),
    ("everything split everywhere", lambda p, n, s: table(p, n, "fsdp"), "Every stage splits all three"),
    ("a missing key", lambda p, n, s: {"params": 4 * p, "opt_state": 8 * p}, "missing: ['grads']"),
    ("text", lambda p, n, s: {k: f"{v:.0f} bytes" for k, v in table(p, n, s).items()}, "got str"),
    ("n - 1 devices", lambda p, n, s: {k: v * (n / (n - 1) if k in SPLIT[s] else 1)
                                       for k, v in table(p, n, s).items()}, "the device count over itself minus one"),
    ("devices written in as 8", lambda p, n, s: table(p, 8, s), "whatever n_devices says"),
    ("the library's formula", lambda p, n, s: __import__("course_lib.sharded_state").sharded_state.formula_bytes(
        p, n, s), "sharded_state.formula_bytes"),
]
RIGHT = [
    ("fractions", lambda p, n, s: {k: Fraction(v).limit_denominator() for k, v in table(p, n, s).items()}),
    ("by stage number", lambda p, n, s: (lambda i: {"params": 4 * p / (n if i >= 3 else 1),
                                                     "grads": 4 * p / (n if i >= 2 else 1),
                                                     "opt_state": 8 * p / (n if i >= 1 else 1)})(
        ["replicated", "zero1", "zero2", "fsdp"].index(s))),
]


verdict, test_a_wrong_answer_fails_and_its_feedback_names_the_mistake, \
    test_a_right_answer_written_another_way_passes = fool_tests(ID, WRONG, RIGHT)


def test_devices_written_in_is_not_told_adam_has_one_moment():
    message = verdict(lambda p, n, s: table(p, 8, s)).message
    assert "Adam keeps" not in message, message


# ---- Fresh answers (issue 44), written as learners would: each wrong one fails with what differs (or its mistake,
# where the numbers confirm it); each right one in another form passes.

from course_lib.exercises.lesson10 import solution_zero_bytes as _zb  # noqa: E402

FRESH = [
    ("8 devices written in", lambda p, n, s: _zb(p, 8, s), "numbers for all of jax.devices()"),
    ("2-byte params and grads", lambda p, n, s: {k: v / 2 if k != "opt_state" else v for k, v in _zb(p, n, s).items()},
     "got 2000000000: 2x too small"),
    ("NumPy numbers", lambda p, n, s: {k: (np.int64 if v == int(v) else np.float64)(v)     # integers where whole
                                       for k, v in _zb(p, n, s).items()}, None),
]


from fooling import fresh_test as _fresh_test  # noqa: E402

test_a_fresh_answer_gets_what_differs = _fresh_test('10.1', FRESH)
