"""Exercise 04.3 (rotate the shards one device to the right): wrong answers and other right ones."""

import jax
import jax.numpy as jnp
import pytest

from course_lib.exercises import check


def perm(a, pairs):
    n = jax.lax.axis_size(a)
    return [pairs(i, n) for i in range(n)]


WRONG = [
    (lambda x, a: x, ["Every device still holds its own x: nothing moved between the devices."]),
    (lambda x, a: jnp.roll(x, 1), ["Each device rotated the values of its own x"]),
    (lambda x, a: jax.lax.ppermute(x, a, perm(a, lambda i, n: ((i + 1) % n, i))), ["rotates left"]),
    (lambda x, a: jax.lax.ppermute(x, a, [(i, i + 1) for i in range(jax.lax.axis_size(a) - 1)]),
     ["Device 0 received nothing", "the ring is not closed"]),
    (lambda x, a: jax.lax.ppermute(x, a, perm(a, lambda i, n: (i, (i + 2) % n))), ["moved 2 devices to the right"]),
    (lambda x, a: jax.lax.ppermute(x, a, [(i, (i + 1) % 8) for i in range(8)]), ["written for a fixed device count"]),
    (lambda x, a: jax.lax.ppermute(x, a, perm(a, lambda i, n: (i, 0))), ["must be unique"]),
    (lambda x, a: jax.lax.ppermute(x.astype(jnp.float32), a, perm(a, lambda i, n: (i, (i + 1) % n))),
     ["dtype float32 where float16 was expected"]),
    (lambda x, a: jax.lax.all_gather(x, a)[(jax.lax.axis_index(a) - 1) % jax.lax.axis_size(a)],
     ["the program uses all_gather", "built from jax.lax.ppermute"]),
    (lambda x, a: jax.lax.ppermute(x, "i", perm(a, lambda i, n: (i, (i + 1) % n))) if a != "i" else
     jax.lax.ppermute(x, "devices", perm(a, lambda i, n: (i, (i + 1) % n))), ["unbound axis name"]),
]


@pytest.mark.parametrize("answer, named", WRONG, ids=[f"wrong{i}" for i in range(len(WRONG))])
def test_wrong_answer_fails_and_the_feedback_names_the_mistake(answer, named):
    fb = check("04.3", answer)
    assert not fb, fb.message
    for words in named:
        assert words in fb.message, fb.message
    assert "% n" not in fb.message and "modulo" not in fb.message, "the fix is left to hint()"


def from_the_left(x, a):                # written from the receiver's side: device i gets from i - 1
    n = jax.lax.axis_size(a)
    return jax.lax.ppermute(x, a, [((i - 1) % n, i) for i in range(n)])


def zipped(x, a):
    n = jax.lax.psum(1, a)
    sources = list(range(n))
    return jax.lax.ppermute(x, a, list(zip(sources, sources[1:] + sources[:1])))


@pytest.mark.parametrize("answer", [from_the_left, zipped])
def test_right_answers_written_differently_pass(answer):
    fb = check("04.3", answer)
    assert fb, fb.message
