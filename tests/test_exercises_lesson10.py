"""Lesson 10 checkers: the reference passes; typical mistakes get feedback that names them.
(Each exercise's full battery of wrong and right answers is in tests/fool/test_fool_10_N.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from course_lib.exercises import check
from course_lib.exercises.lesson10 import (HINTS, solution_choose_k, solution_fsdp_step, solution_predict_collectives,
                                           solution_zero2_sgd, solution_zero_bytes)
from hint_rules import assert_hints_are_a_ladder, code_from_solution


def test_10_1_section_2s_padded_slices_pass_and_bits_are_named():
    def padded(n_params, n, stage):             # a device's slice of the flat vector padded to a multiple of n
        slice_ = -(-n_params // n)
        split = {"replicated": 0, "zero1": 1, "zero2": 2, "fsdp": 3}[stage]
        return {k: b * (slice_ if split > i else n_params) for i, (k, b) in enumerate(
            (("opt_state", 8), ("grads", 4), ("params", 4)))}
    assert "padded slices of section 2's flat vector" in check("10.1", padded).message
    bits = check("10.1", lambda p, n, s: {k: 8 * v for k, v in solution_zero_bytes(p, n, s).items()})
    assert not bits and "looks like bits" in bits.message


def test_10_1_zero_bytes():
    assert check("10.1", solution_zero_bytes)

    def adam_one_copy(n_params, n, stage):
        out = solution_zero_bytes(n_params, n, stage)
        return {**out, "opt_state": out["opt_state"] / 2}

    assert "Adam keeps two float32" in check("10.1", adam_one_copy).message

    def zero1_splits_grads(n_params, n, stage):
        return solution_zero_bytes(n_params, n, "zero2" if stage == "zero1" else stage)

    assert "zero1 keeps the whole gradients" in check("10.1", zero1_splits_grads).message

    def nothing_split(n_params, n, stage):
        return solution_zero_bytes(n_params, n, "replicated")

    assert "Every stage keeps everything whole" in check("10.1", nothing_split).message
    assert "raised KeyError" in check("10.1", lambda n_params, n, stage: {}["params"]).message
    assert "expected dict{" in check("10.1", lambda n_params, n, stage: 16 * n_params).message
    assert "got str" in check("10.1", lambda n_params, n, stage: dict.fromkeys(
        ["params", "grads", "opt_state"], "4 bytes")).message




def test_10_2_zero2_sgd_passes_and_reads_the_scatter_axis():
    assert check("10.2", solution_zero2_sgd)

    def flattened(params, grads, lr):            # the lesson's flat-vector ZeRO, applied to the matrix
        n = jax.lax.axis_size("data")
        flat, shape = params.reshape(-1), params.shape
        size = flat.shape[0] // n
        mine = jax.lax.psum_scatter(grads.reshape(-1), "data", tiled=True) / n
        my = jax.lax.dynamic_slice_in_dim(flat, jax.lax.axis_index("data") * size, size)
        return jax.lax.all_gather(my - lr * mine, "data", tiled=True).reshape(shape)

    feedback = check("10.2", flattened)
    assert not feedback and "collectives are" in feedback.message and "block of columns" in feedback.message


def test_10_3_choose_k_passes_and_needs_the_compiled_step():
    assert check("10.3", solution_choose_k)
    feedback = check("10.3", lambda make_step, state, batch, n, budget: 1)
    assert not feedback and "without building a single step" in feedback.message
    feedback = check("10.3", lambda make_step, state, batch, n, budget: None)   # None: "no K fits"
    assert not feedback and "returned None without building a single step" in feedback.message, feedback.message


def test_10_4_fsdp_step_passes_on_a_leaf_split_model():
    assert check("10.4", solution_fsdp_step)
    feedback = check("10.4", lambda loss_fn, optimizer: (lambda p, o, b: None))
    assert not feedback and "returned None" in feedback.message
    assert "expected the step function" in check("10.4", lambda loss_fn, optimizer: 3).message


def test_10_5_predict_passes_and_counts_runs_per_step():
    assert check("10.5", solution_predict_collectives)
    feedback = check("10.5", lambda stage, k: solution_predict_collectives(stage, 1))
    assert not feedback and "inside the micro-batch loop" in feedback.message
    feedback = check("10.5", lambda stage, k: {**solution_predict_collectives(stage, k), "reduce-scatter": -1})
    assert not feedback and "0 or more" in feedback.message, feedback.message


def test_hints_cover_every_exercise_with_a_ladder_of_three():
    assert set(HINTS) == {"10.1", "10.2", "10.3", "10.4", "10.5"}
    assert all(len(h) >= 3 for h in HINTS.values())


WRONG_ANSWERS = {
    "10.1": lambda n_params, n, stage: solution_zero_bytes(n_params, n, "replicated"),
    "10.2": lambda params, grads, lr: params - lr * grads,
    "10.3": lambda make_step, state, batch, n, budget: 2,
    "10.4": lambda loss_fn, optimizer: (lambda p, o, b: (p, o, loss_fn(p, b))),
    "10.5": lambda stage, k: {"all-reduce": 1},
}


@pytest.mark.parametrize("id_", sorted(WRONG_ANSWERS))
def test_no_hint_and_no_feedback_holds_the_solutions_code(id_):
    assert_hints_are_a_ladder(id_)
    feedback = check(id_, WRONG_ANSWERS[id_])
    assert not feedback and not code_from_solution(id_, feedback.message), feedback.message


def test_10_2_an_untiled_scatter_and_gather_with_reshapes_passes():
    from jax import lax

    def untiled(params, grads, lr):
        n, i, (r, c) = lax.axis_size("data"), lax.axis_index("data"), params.shape
        g = lax.psum_scatter(grads.reshape(r, n, c // n).transpose(1, 0, 2), "data", tiled=False) / n
        mine = params.reshape(r, n, c // n)[:, i, :] - lr * g
        return lax.all_gather(mine, "data", to="invarying").transpose(1, 0, 2).reshape(r, c)

    fb = check("10.2", untiled)
    assert fb, fb.message
