"""Lesson 10 checkers: the reference passes; typical mistakes get feedback that names them."""

import jax
import numpy as np

from course_lib.exercises import check
from course_lib.exercises.lesson10 import HINTS, solution_choose_k, solution_zero2_sgd, solution_zero_bytes


def test_10_1_zero_bytes():
    assert check("10.1", solution_zero_bytes)

    def adam_one_copy(n_params, n, stage):
        out = solution_zero_bytes(n_params, n, stage)
        return {**out, "opt_state": out["opt_state"] / 2}

    assert "Adam keeps two float32" in check("10.1", adam_one_copy).message

    def zero1_splits_grads(n_params, n, stage):
        return solution_zero_bytes(n_params, n, "zero2" if stage == "zero1" else stage)

    assert "zero1 on 8 devices: grads comes back divided by 8" in check("10.1", zero1_splits_grads).message

    def nothing_split(n_params, n, stage):
        return solution_zero_bytes(n_params, n, "replicated")

    assert "splits it over the devices" in check("10.1", nothing_split).message
    assert "raised KeyError" in check("10.1", lambda n_params, n, stage: {}["params"]).message
    assert "should return a dict" in check("10.1", lambda n_params, n, stage: 16 * n_params).message
    assert "a number of bytes" in check("10.1", lambda n_params, n, stage: dict.fromkeys(
        ["params", "grads", "opt_state"], "4 bytes")).message


def test_10_2_zero2_sgd():
    assert check("10.2", solution_zero2_sgd)

    def with_pmean(params, grads, lr):           # right values, but an all-reduce of the whole gradient
        n = jax.lax.axis_size("data")
        size = params.shape[0] // n
        mine = jax.lax.dynamic_slice_in_dim(jax.lax.pmean(grads, "data"), jax.lax.axis_index("data") * size, size)
        p = jax.lax.dynamic_slice_in_dim(params, jax.lax.axis_index("data") * size, size)
        return jax.lax.all_gather(p - lr * mine, "data", tiled=True)

    assert "there is no psum_scatter in the program" in check("10.2", with_pmean).message

    def no_gather(params, grads, lr):            # wrong structure: returns only the slice
        n = jax.lax.axis_size("data")
        size = params.shape[0] // n
        p = jax.lax.dynamic_slice_in_dim(params, jax.lax.axis_index("data") * size, size)
        return p - lr * jax.lax.psum_scatter(grads, "data", tiled=True) / n

    assert "returned only its slice" in check("10.2", no_gather).message

    def summed(params, grads, lr):
        size = params.shape[0] // jax.lax.axis_size("data")
        p = jax.lax.dynamic_slice_in_dim(params, jax.lax.axis_index("data") * size, size)
        return jax.lax.all_gather(p - lr * jax.lax.psum_scatter(grads, "data", tiled=True), "data", tiled=True)

    assert "8 times too large" in check("10.2", summed).message
    wrong_axis = check("10.2", lambda params, grads, lr: jax.lax.psum_scatter(grads, "devices", tiled=True))
    assert "raised" in wrong_axis.message and "named 'data'" in wrong_axis.message
    assert not check("10.2", lambda params, grads, lr: params - lr * grads)


def test_10_3_choose_k():
    assert check("10.3", solution_choose_k)

    def ceil_k(b, per_example, budget):          # the right size, ignoring divisibility
        return max(1, int(np.ceil(b * per_example / budget)))

    assert "does not divide the batch of 56" in check("10.3", ceil_k).message

    def largest(b, per_example, budget):
        return b

    assert "is smaller" in check("10.3", largest).message
    assert "raised ZeroDivisionError" in check("10.3", lambda b, e, m: 1 // 0).message
    assert "return None" in check("10.3", lambda b, e, m: next(k for k in range(1, b + 1) if not b % k
                                                                 and b // k * e <= m)).message
    assert "whole number" in check("10.3", lambda b, e, m: 4.0).message


def test_hints_cover_every_exercise_with_at_least_two_steps():
    assert set(HINTS) == {"10.1", "10.2", "10.3"}
    assert all(len(h) >= 2 and all(isinstance(t, str) and t for t in h) for h in HINTS.values())


def test_10_3_zero_or_negative_k_is_named_not_a_checker_crash():
    for k in (0, -1):
        feedback = check("10.3", lambda b, e, m, k=k: k)
        assert not feedback and f"returned {k}: K counts micro-batches, a whole number >= 1" in feedback.message
        assert "Checking it failed" not in feedback.message
