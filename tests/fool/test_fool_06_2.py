"""Exercise 06.2 (out_specs that check_vma accepts): wrong answers fail with feedback naming their mistake;
right answers written differently pass."""

import jax
import pytest
from jax.sharding import PartitionSpec as P

from course_lib.exercises import check

WRONG = {
    "both replicated": (lambda: (P(), P()), ["check_vma rejects P() for the per-device sums"]),
    "both stacked": (lambda: (P("i"), P("i")), ["naming 'i' for it stacks 8 copies of one value"]),
    "swapped": (lambda: (P(), P("i")), ["check_vma rejects P()"]),
    "P(None) for the sums": (lambda: (P(None), P()), ["it names no mesh axis: the same as P()"]),
    "the lesson's axis name": (lambda: (P("data"), P()), ["its only axis is 'i'"]),
    "strings, not specs": (lambda: ("i", None), ["a pair of PartitionSpecs"]),
    "one spec": (lambda: P("i"), ["a pair of PartitionSpecs"]),
    "sums stacked along axis 1": (lambda: (P(None, "i"), P()), ["stacked along axis 1"]),
}


@pytest.mark.parametrize("name", WRONG)
def test_wrong_answer_is_named(name):
    answer, fragments = WRONG[name]
    fb = check("06.2", answer)
    assert not fb, name
    for fragment in fragments:
        assert fragment in fb.message, (name, fb.message)


RIGHT = {"a list": lambda: [P("i"), P()], "jax.P, explicit None": lambda: (jax.P("i", None), jax.P(None, None)),
         "P(None) for the total": lambda: (P("i"), P(None))}


@pytest.mark.parametrize("name", RIGHT)
def test_right_answer_passes(name):
    fb = check("06.2", RIGHT[name])
    assert fb, (name, fb.message)
