"""Exercise 04.1 (a ring all-reduce from ppermute): wrong answers a learner might write, and right ones written
differently from the reference. Each wrong answer fails with feedback that names its mistake, not the fix."""

import jax
import jax.numpy as jnp
import pytest

from course_lib.exercises import check


def ring(a, shift=1):
    n = jax.lax.axis_size(a)
    return [(i, (i + shift) % n) for i in range(n)]


def n_hops(x, a):                       # one hop too many: its own value comes back
    total, passing = x, x
    for _ in range(jax.lax.axis_size(a)):
        passing = jax.lax.ppermute(passing, a, ring(a))
        total = total + passing
    return total


def one_hop(x, a):
    return x + jax.lax.ppermute(x, a, ring(a))


def adds_what_it_sent(x, a):
    total, passing = x, x
    for _ in range(jax.lax.axis_size(a) - 1):
        jax.lax.ppermute(passing, a, ring(a))
        total = total + passing
    return total


def fixed_eight(x, a):
    total, passing = x, x
    for _ in range(7):
        passing = jax.lax.ppermute(passing, a, [(i, (i + 1) % 8) for i in range(8)])
        total = total + passing
    return total


def cast_to_float(x, a):                # right on float32, but an int32 sum comes back as float32
    total = passing = x.astype(jnp.float32)
    for _ in range(jax.lax.axis_size(a) - 1):
        passing = jax.lax.ppermute(passing, a, ring(a))
        total = total + passing
    return total


def open_line(x, a):                    # the ring is not closed: nothing goes from the last device to device 0
    total, passing = x, x
    n = jax.lax.axis_size(a)
    for _ in range(n - 1):
        passing = jax.lax.ppermute(passing, a, [(i, i + 1) for i in range(n - 1)])
        total = total + passing
    return total


def passes_the_total(x, a):             # sends its running total on, not the value in transit
    total = x
    for _ in range(jax.lax.axis_size(a) - 1):
        total = total + jax.lax.ppermute(total, a, ring(a))
    return total


WRONG = [
    (open_line, ["the ring is not closed", "sum of devices 0 to i only"]),
    (passes_the_total, ["passed on its running total, not the value in transit"]),
    (n_hops, ["sum plus its own value once more", "one hop too many"]),
    (one_hop, ["one hop only"]),
    (adds_what_it_sent, ["added what it sent, not what arrived"]),
    (lambda x, a: x * jax.lax.psum(1, a), ["8 of 8 values differ",
                                           "Its program has no ppermute: nothing travelled round a ring."]),
    (lambda x, a: jax.lax.psum(x, a), ["the program uses psum"]),
    (lambda x, a: jax.lax.all_gather(x, a).sum(0), ["the program uses all_gather"]),
    (fixed_eight, ["written for a fixed device count"]),
    (cast_to_float, ["dtype float32 where int32 was expected"]),
    (lambda x, a: jax.lax.ppermute(x, "devices", ring(a)) + x, ["unbound axis name", "axis_name argument"]),
    (lambda x, a: x + jax.lax.ppermute(x, a, [(i, 0) for i in range(jax.lax.axis_size(a))]), ["must be unique"]),
]


@pytest.mark.parametrize("answer, named", WRONG, ids=[w[0].__name__ if w[0].__name__ != "<lambda>" else f"lambda{i}"
                                                       for i, w in enumerate(WRONG)])
def test_wrong_answer_fails_and_the_feedback_names_the_mistake(answer, named):
    fb = check("04.1", answer)
    assert not fb, fb.message
    for words in named:
        assert words in fb.message, fb.message
    assert "n - 1" not in fb.message, "the number of hops is left to hint()"


def leftward(x, a):                     # the other direction round the ring
    total, passing = x, x
    for _ in range(jax.lax.axis_size(a) - 1):
        passing = jax.lax.ppermute(passing, a, ring(a, -1))
        total = total + passing
    return total


def every_shift_from_the_start(x, a):   # n - 1 permutations of the original x, each shifted further
    n = jax.lax.axis_size(a)
    return x + sum(jax.lax.ppermute(x, a, ring(a, k)) for k in range(1, n))


def in_a_fori_loop(x, a):               # the hops in lax.fori_loop: the report counts every iteration
    def hop(_, carry):
        total, passing = carry
        passing = jax.lax.ppermute(passing, a, ring(a))
        return total + passing, passing
    return jax.lax.fori_loop(0, jax.lax.axis_size(a) - 1, hop, (x, x))[0]


@pytest.mark.parametrize("answer", [leftward, every_shift_from_the_start, in_a_fori_loop])
def test_right_answers_written_differently_pass(answer):
    fb = check("04.1", answer)
    assert fb, fb.message
    assert "ran 7 ppermutes and each device sent 112 bytes for a 16-byte x: (N - 1) x V" in fb.message, fb.message
