"""Exercise 04.4 (all_gather from ppermute): wrong answers and right ones written differently."""

import jax
import jax.numpy as jnp
import pytest

from course_lib.exercises import check


def ring(a, shift=1):
    n = jax.lax.axis_size(a)
    return [(i, (i + shift) % n) for i in range(n)]


def in_arrival_order(x, a):             # row k holds what arrived after k hops, not device k's value
    n = jax.lax.axis_size(a)
    rows, passing = [x], x
    for _ in range(n - 1):
        passing = jax.lax.ppermute(passing, a, ring(a, -1))
        rows.append(passing)
    return jnp.stack(rows)


def wrong_direction(x, a):              # values come from the left, filed as if from the right
    n = jax.lax.axis_size(a)
    me = jax.lax.axis_index(a)
    out, passing, owner = jnp.zeros((n,) + x.shape, x.dtype).at[me].set(x), x, me
    for _ in range(n - 1):
        passing = jax.lax.ppermute(passing, a, ring(a))
        owner = (owner + 1) % n
        out = out.at[owner].set(passing)
    return out


def zeros_in_float32(x, a):             # right values, but the zeros have no dtype: float16 in, float32 out
    n = jax.lax.axis_size(a)
    me = jax.lax.axis_index(a)
    out, passing, owner = jnp.zeros((n,) + x.shape).at[me].set(x), x, me
    for _ in range(n - 1):
        passing = jax.lax.ppermute(passing, a, ring(a))
        owner = (owner - 1) % n
        out = out.at[owner].set(passing)
    return out


def fixed_eight(x, a):
    me = jax.lax.axis_index(a)
    out, passing, owner = jnp.zeros((8,) + x.shape, x.dtype).at[me].set(x), x, me
    for _ in range(7):
        passing = jax.lax.ppermute(passing, a, [(i, (i + 1) % 8) for i in range(8)])
        owner = (owner - 1) % 8
        out = out.at[owner].set(passing)
    return out


def gather(x, a, hops, own=True):        # the solution's ring, with a hop count and the own row as given
    n, me = jax.lax.axis_size(a), jax.lax.axis_index(a)
    out = jnp.zeros((n,) + x.shape, x.dtype)
    out = out.at[me].set(x) if own else out
    passing, owner = x, me
    for _ in range(hops(n)):
        passing = jax.lax.ppermute(passing, a, ring(a))
        owner = (owner - 1) % n
        out = out.at[owner].set(passing)
    return out


WRONG = [
    (lambda x, a: gather(x, a, lambda n: n - 1, own=False), ["Every row is right except the device's own"]),
    (lambda x, a: gather(x, a, lambda n: n - 2), ["The values stopped one hop short"]),
    (in_arrival_order, ["but starting with its own", "row k holds what arrived after k hops"]),
    (wrong_direction, ["in the wrong rows", "assumes the other"]),
    (lambda x, a: jax.lax.all_gather(x, a), ["the program uses all_gather", "built from jax.lax.ppermute"]),
    (zeros_in_float32, ["dtype float32 where float16 was expected"]),
    (fixed_eight, ["written for a fixed device count"]),
    (lambda x, a: jax.lax.ppermute(x, a, ring(a)), ["shape (8,) where (8, 8) was expected"]),
]


@pytest.mark.parametrize("answer, named", WRONG, ids=[f"wrong{i}" for i in range(len(WRONG))])
def test_wrong_answer_fails_and_the_feedback_names_the_mistake(answer, named):
    fb = check("04.4", answer)
    assert not fb, fb.message
    for words in named:
        assert words in fb.message, fb.message


def leftward(x, a):                     # values travel left: each arrival comes from one device further right
    n = jax.lax.axis_size(a)
    me = jax.lax.axis_index(a)
    out, passing = jnp.zeros((n,) + x.shape, x.dtype).at[me].set(x), x
    for k in range(1, n):
        passing = jax.lax.ppermute(passing, a, ring(a, -1))
        out = out.at[(me + k) % n].set(passing)
    return out


def stack_then_reorder(x, a):           # collect in arrival order, then index the rows into device order
    n = jax.lax.axis_size(a)
    me = jax.lax.axis_index(a)
    received, passing = [x], x
    for _ in range(n - 1):
        passing = jax.lax.ppermute(passing, a, ring(a))
        received.append(passing)        # after k hops: device (me - k)'s value
    return jnp.stack(received)[(me - jnp.arange(n)) % n]


@pytest.mark.parametrize("answer", [leftward, stack_then_reorder])
def test_right_answers_written_differently_pass(answer):
    fb = check("04.4", answer)
    assert fb, fb.message
