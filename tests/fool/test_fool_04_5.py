"""Exercise 04.5 (the bandwidth-optimal ring): wrong answers and right ones written differently."""

import jax
import jax.numpy as jnp
import pytest

from course_lib.exercises import check
from course_lib.exercises.lesson04 import solution_ring_allreduce, solution_ring_allreduce_chunked


def ring(a, shift=1):
    n = jax.lax.axis_size(a)
    return [(i, (i + shift) % n) for i in range(n)]


def misfiled(x, a):                     # the right reduce-scatter, each finished piece filed one place off
    n = jax.lax.axis_size(a)
    me = jax.lax.axis_index(a)
    chunks = x.reshape(n, -1)
    passing = chunks[me]
    for step in range(1, n):
        passing = jax.lax.ppermute(passing, a, ring(a)) + chunks[(me - step) % n]
    total = jnp.zeros_like(chunks).at[me].set(passing)
    for step in range(1, n):
        passing = jax.lax.ppermute(passing, a, ring(a))
        total = total.at[(me - step) % n].set(passing)
    return total.reshape(x.shape)


def fixed_eight(x, a):
    me = jax.lax.axis_index(a)
    chunks = x.reshape(8, -1)
    perm = [(i, (i + 1) % 8) for i in range(8)]
    passing = chunks[me]
    for step in range(1, 8):
        passing = jax.lax.ppermute(passing, a, perm) + chunks[(me - step) % 8]
    total = jnp.zeros_like(chunks).at[(me + 1) % 8].set(passing)
    for step in range(1, 8):
        passing = jax.lax.ppermute(passing, a, perm)
        total = total.at[(me + 1 - step) % 8].set(passing)
    return total.reshape(x.shape)


def whole_x_in_a_fori_loop(x, a):      # 04.1's ring in lax.fori_loop: each iteration sends all of x
    def hop(_, carry):
        total, passing = carry
        passing = jax.lax.ppermute(passing, a, ring(a))
        return total + passing, passing
    return jax.lax.fori_loop(0, jax.lax.axis_size(a) - 1, hop, (x, x))[0]


def traced_loop_bound(x, a):            # a fori_loop whose bound is a traced value becomes a while_loop
    n = jax.lax.axis_size(a)
    me = jax.lax.axis_index(a)
    chunks = x.reshape(n, -1)
    send = jax.lax.fori_loop(1, n + 0 * me, lambda s, p: jax.lax.ppermute(p, a, ring(a)) + chunks[(me - s) % n],
                             chunks[me])
    return solution_ring_allreduce_chunked(x, a) + 0 * send.sum()


WRONG = [
    (whole_x_in_a_fori_loop, ["ran 7 ppermutes and each device sent 672 bytes", "(N - 1) x V in total, N - 1 times a whole x"]),
    (traced_loop_bound, ["inside a lax.while_loop", "cannot count how many times it runs"]),
    (solution_ring_allreduce, ["(N - 1) x V in total, N - 1 times a whole x"]),
    (lambda x, a: jax.lax.all_gather(jax.lax.psum_scatter(x, a, tiled=True), a, tiled=True), ["the program uses"]),
    (lambda x, a: jax.lax.psum(x, a), ["the program uses psum"]),
    (misfiled, ["each one is stored one piece-row off from its place"]),
    (fixed_eight, ["written for a fixed device count"]),
    (lambda x, a: solution_ring_allreduce_chunked(x, a).astype(jnp.float16), ["dtype float16 where float32 was expected"]),
    (lambda x, a: x * jax.lax.axis_size(a), ["on 8 devices, each x a vector of 24: expected"]),
]


@pytest.mark.parametrize("answer, named", WRONG, ids=[f"wrong{i}" for i in range(len(WRONG))])
def test_wrong_answer_fails_and_the_feedback_names_the_mistake(answer, named):
    fb = check("04.5", answer)
    assert not fb, fb.message
    for words in named:
        assert words in fb.message, fb.message


def leftward(x, a):                     # both phases round the ring the other way
    n = jax.lax.axis_size(a)
    me = jax.lax.axis_index(a)
    chunks = x.reshape(n, -1)
    passing = chunks[me]
    for step in range(1, n):            # after step s this device holds a partial sum of piece me + s
        passing = jax.lax.ppermute(passing, a, ring(a, -1)) + chunks[(me + step) % n]
    total = jnp.zeros_like(chunks).at[(me - 1) % n].set(passing)
    for step in range(1, n):
        passing = jax.lax.ppermute(passing, a, ring(a, -1))
        total = total.at[(me - 1 + step) % n].set(passing)
    return total.reshape(x.shape)


def gather_into_a_list(x, a):           # the all-gather phase collects the pieces, then rolls them into place
    n = jax.lax.axis_size(a)
    me = jax.lax.axis_index(a)
    chunks = x.reshape(n, -1)
    passing = chunks[me]
    for step in range(1, n):
        passing = jax.lax.ppermute(passing, a, ring(a)) + chunks[(me - step) % n]
    pieces = [passing]                  # piece me + 1, then me, me - 1, ...
    for _ in range(1, n):
        passing = jax.lax.ppermute(passing, a, ring(a))
        pieces.append(passing)
    order = (me + 1 - jnp.arange(n)) % n          # the piece number of each collected entry
    stacked = jnp.stack(pieces)
    return stacked[jnp.argsort(order)].reshape(x.shape)


def phases_in_fori_loops(x, a):         # both phases in lax.fori_loop: the traffic counts every iteration
    n = jax.lax.axis_size(a)
    me = jax.lax.axis_index(a)
    chunks = x.reshape(n, -1)
    passing = jax.lax.fori_loop(1, n, lambda s, p: jax.lax.ppermute(p, a, ring(a)) + chunks[(me - s) % n], chunks[me])

    def gather(s, carry):
        total, p = carry
        p = jax.lax.ppermute(p, a, ring(a))
        return total.at[(me + 1 - s) % n].set(p), p
    total = jnp.zeros_like(chunks).at[(me + 1) % n].set(passing)
    return jax.lax.fori_loop(1, n, gather, (total, passing))[0].reshape(x.shape)


@pytest.mark.parametrize("answer", [leftward, gather_into_a_list, phases_in_fori_loops])
def test_right_answers_written_differently_pass(answer):
    fb = check("04.5", answer)
    assert fb, fb.message
    assert "each device sent 168 bytes for a 96-byte x" in fb.message, fb.message
