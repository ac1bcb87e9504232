"""Lesson 04 checkers: the reference passes; typical mistakes get feedback that names them."""

import jax
import jax.numpy as jnp

from course_lib.exercises import check
from course_lib.exercises.lesson04 import (solution_gather_all, solution_global_mean_var, solution_ring_allreduce,
                                           solution_rotate_right)


def ring(axis_name, shift=1):
    n = jax.lax.psum(1, axis_name)
    return [(i, (i + shift) % n) for i in range(n)]


def test_04_1_ring_allreduce():
    assert check("04.1", solution_ring_allreduce)
    uses_psum = check("04.1", lambda x, a: jax.lax.psum(x, a))
    assert "must be built from jax.lax.ppermute, not psum" in uses_psum.message

    def n_hops(x, a):
        total, passing = x, x
        for _ in range(jax.lax.psum(1, a)):
            passing = jax.lax.ppermute(passing, a, ring(a))
            total = total + passing
        return total

    assert "the sum plus its own value once more: that is n = 8 hops" in check("04.1", n_hops).message
    one_hop = check("04.1", lambda x, a: x + jax.lax.ppermute(x, a, ring(a)))
    assert "one hop only" in one_hop.message
    wrong_name = check("04.1", lambda x, a: jax.lax.psum(x, "j"))
    assert "unbound axis name" in wrong_name.message and "Use the axis_name argument" in wrong_name.message


def test_04_2_global_mean_var():
    assert check("04.2", solution_global_mean_var)
    local = check("04.2", lambda x, a: (jnp.mean(x), jnp.var(x)))
    assert "the devices disagree" in local.message and "pmean" in local.message
    mean_of_vars = check("04.2", lambda x, a: (jax.lax.pmean(jnp.mean(x), a), jax.lax.pmean(jnp.var(x), a)))
    assert "mean of the per-device variances" in mean_of_vars.message
    not_a_pair = check("04.2", lambda x, a: jax.lax.pmean(jnp.mean(x), a))
    assert "should return a pair (mean, var)" in not_a_pair.message


def test_04_3_rotate_right():
    assert check("04.3", solution_rotate_right)
    left = check("04.3", lambda x, a: jax.lax.ppermute(x, a, ring(a, -1)))
    assert "rotates left" in left.message
    open_ring = check("04.3", lambda x, a: jax.lax.ppermute(x, a, [(i, i + 1) for i in range(jax.lax.psum(1, a) - 1)]))
    assert "device 0 received nothing" in open_ring.message and "(7, 0)" in open_ring.message
    not_a_perm = check("04.3", lambda x, a: jax.lax.ppermute(x, a, [(0, 1), (1, 1)]))
    assert "must be unique" in not_a_perm.message


def test_04_4_gather_all():
    assert check("04.4", solution_gather_all)
    builtin = check("04.4", lambda x, a: jax.lax.all_gather(x, a))
    assert "not all_gather" in builtin.message

    def own_first(x, a):
        out, passing = [x], x
        for _ in range(jax.lax.psum(1, a) - 1):
            passing = jax.lax.ppermute(passing, a, ring(a, -1))
            out.append(passing)
        return jnp.stack(out)

    assert "starting with its own" in check("04.4", own_first).message
    only_self = check("04.4", lambda x, a: jnp.stack([x] * jax.lax.psum(1, a)))
    assert "values differ" in only_self.message


def test_04_raises_or_wrong_structure():
    fb = check("04.1", lambda x, a: jax.lax.ppermute(x, a, ring(a))[0, 0])
    assert not fb and "pmap(ring_allreduce)(Array float32[8]) raised" in fb.message
    fb = check("04.1", lambda x, a: (x, jax.lax.psum(x, a)))
    assert not fb and "should be an array of shape (8,), got tuple(Array float32[8], Array float32[8])" in fb.message
    fb = check("04.2", lambda x, a: jax.lax.pmean(jnp.mean(x), "devices"))
    assert not fb and "unbound axis name" in fb.message
    fb = check("04.2", lambda x, a: {"mean": jax.lax.pmean(jnp.mean(x), a), "var": jnp.var(x)})
    assert not fb and "should return a pair (mean, var); got dict{'mean': Array float32[8]" in fb.message
    fb = check("04.2", lambda x, a: (jax.lax.pmean(x, a), jnp.var(x)))
    assert not fb and "mean and var should be one number per device (pmap gives shape (8,)); got (8, 6) and (8,)" in (
        fb.message)
    fb = check("04.3", lambda x, a: jax.lax.ppermute(x, a, [(i, i + 1) for i in range(8)]))
    assert not fb and "pmap(rotate_right)" in fb.message and "raised" in fb.message
    fb = check("04.3", lambda x, a: [x, x])
    assert not fb and "got list[Array float32[8, 2], Array float32[8, 2]]" in fb.message
    fb = check("04.4", lambda x, a: jnp.stack([x] * 8)[a])
    assert not fb and "pmap(gather_all)(Array float32[8]) raised" in fb.message
    fb = check("04.4", lambda x, a: (x,) * jax.lax.psum(1, a))
    assert not fb and "should be an array of shape (8, 8), got tuple(" in fb.message
