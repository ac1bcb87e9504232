"""Exercise 10.5 (predict how often each collective runs in an accumulated step): answers that try to fool it."""

import numpy as np

from fooling import fool_tests

ID = "10.5"
RIGHT_TABLE = {"replicated": lambda k: {"all-reduce": 1}, "zero1": lambda k: {"reduce-scatter": 1, "all-gather": 1},
               "zero2": lambda k: {"reduce-scatter": k, "all-gather": 1}}


def table(**changes):
    t = {**RIGHT_TABLE, **changes}
    return lambda stage, k: t[stage](k)


WRONG = [
    ("no loop: k ignored", table(zero2=lambda k: {"reduce-scatter": 1, "all-gather": 1}),
     "inside the micro-batch loop"),
    ("zero1 scatters every micro-batch", table(zero1=lambda k: {"reduce-scatter": k, "all-gather": 1}),
     "What does a ZeRO-1 device keep"),
    ("zero2 gathers every micro-batch", table(zero2=lambda k: {"reduce-scatter": k, "all-gather": k}),
     "is the update made for each micro-batch, or for the step?"),
    ("replicated all-reduces every micro-batch", table(replicated=lambda k: {"all-reduce": k}),
     "Where, then, must its all-reduce sit"),
    ("zero1 all-reduces", table(zero1=lambda k: {"all-reduce": 1, "all-gather": 1}), "only its slice of it?"),
    ("zero2 without its gather", table(zero2=lambda k: {"reduce-scatter": k}), "prediction has no all-gather"),
    ("half counts", lambda stage, k: {op: v / 2 for op, v in RIGHT_TABLE[stage](k).items()}, "whole number"),
    ("made-up names", lambda stage, k: {"gather": 1}, "the counts asked for are of 'all-gather'"),
    ("a list", lambda stage, k: list(RIGHT_TABLE[stage](k)), "expected a dict"),
]
RIGHT = [
    ("JAX's names", lambda stage, k: {"psum_scatter": k, "all_gather": 1} if stage == "zero2" else
     {"zero1": {"psum_scatter": 1, "all_gather": 1}, "replicated": {"psum": 1}}[stage]),
    ("numpy counts and zeros", lambda stage, k: {"all-reduce": np.int64(stage == "replicated"),
                                                  "reduce-scatter": np.int64({"zero2": k, "zero1": 1}.get(stage, 0)),
                                                  "all-gather": np.int64(stage != "replicated")}),
    ("counts as floats", lambda stage, k: {op: float(v) for op, v in RIGHT_TABLE[stage](k).items()}),
]


verdict, test_a_wrong_answer_fails_and_its_feedback_names_the_mistake, \
    test_a_right_answer_written_another_way_passes = fool_tests(ID, WRONG, RIGHT)


def test_feedback_never_prints_the_compiled_counts():
    """A prediction exercise: the compiled program's counts are the answer, so no feedback shows them."""
    for _, answer, _ in WRONG:
        message = verdict(answer).message
        assert "expected" not in message and "you predicted" in message, message


def test_feedback_never_prints_the_compiled_counts():
    from course_lib.exercises.lesson10 import _compiled_counts
    counts = _compiled_counts()
    for name, answer, _ in WRONG[:6]:
        message = verdict(answer).message
        for (stage, k), (right, _) in counts.items():
            mine = answer(stage, k)
            for op, count in right.items():
                if mine.get(op) != count:
                    assert f"'{op}': {count}" not in message, (name, message)
        # nor in words: how often the collective that differs runs is for the learner to find
        assert not any(w in message for w in (" once", "every micro-batch", "per micro-batch")), (name, message)


# ---- Fresh answers (issue 44), written as learners would: each wrong one fails with what differs (or its mistake,
# where the numbers confirm it); each right one in another form passes.

from course_lib.exercises.lesson10 import solution_predict_collectives as _pc  # noqa: E402

FRESH = [
    ("zero2 gathers every micro-batch", lambda s, k: {**_pc(s, k), **({"all-gather": k} if s == "zero2" else {})},
     "The all-gather rebuilds the whole parameters"),
    ("one scatter too many", lambda s, k: {**_pc(s, k), **({"reduce-scatter": k + 1} if s == "zero2" else {})},
     "too many reduce-scatters"),
    ("float counts", lambda s, k: {o: float(v) for o, v in _pc(s, k).items()}, None),
]


from fooling import fresh_test as _fresh_test  # noqa: E402

test_a_fresh_answer_gets_what_differs = _fresh_test('10.5', FRESH)
