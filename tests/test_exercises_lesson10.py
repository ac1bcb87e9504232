"""Lesson 10 checkers: the reference passes; typical mistakes get feedback that names them."""

import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from course_lib.exercises import check, exercises
from course_lib.exercises.lesson10 import (HINTS, solution_choose_k, solution_fsdp_step, solution_predict_collectives,
                                           solution_zero2_sgd, solution_zero_bytes)


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

    assert "no reduce-scatter of the gradient" in check("10.2", with_pmean).message

    def thrown_away(params, grads, lr):          # a psum_scatter whose result is unused; the update from a pmean
        n = jax.lax.axis_size("data")
        size = params.shape[0] // n
        unused = jax.lax.psum_scatter(grads, "data", tiled=True) / n      # noqa: F841
        mine = jax.lax.dynamic_slice_in_dim(jax.lax.pmean(grads, "data"), jax.lax.axis_index("data") * size, size)
        p = jax.lax.dynamic_slice_in_dim(params, jax.lax.axis_index("data") * size, size)
        return jax.lax.all_gather(p - lr * mine, "data", tiled=True)

    feedback = check("10.2", thrown_away)
    assert not feedback and "did not use its result" in feedback.message

    def both(params, grads, lr):                 # uses the scatter, but also all-reduces the whole gradient
        n = jax.lax.axis_size("data")
        size = params.shape[0] // n
        mine = jax.lax.psum_scatter(grads, "data", tiled=True) / n
        mean = jax.lax.dynamic_slice_in_dim(jax.lax.pmean(grads, "data"), jax.lax.axis_index("data") * size, size)
        p = jax.lax.dynamic_slice_in_dim(params, jax.lax.axis_index("data") * size, size)
        return jax.lax.all_gather(p - lr * (mine + mean) / 2, "data", tiled=True)

    assert "still all-reduces" in check("10.2", both).message

    def in_bfloat16(params, grads, lr):
        return solution_zero2_sgd(params.astype(jnp.bfloat16), grads.astype(jnp.bfloat16), lr)

    assert "bfloat16" in check("10.2", in_bfloat16).message
    assert "float16" in check("10.2", lambda p, g, lr: solution_zero2_sgd(p.astype(jnp.float16), g, lr)).message

    def eight_only(params, grads, lr):           # right on 8 devices, wrong on 4
        size = params.shape[0] // 8
        mine = jax.lax.psum_scatter(grads, "data", tiled=True) / 8
        p = jax.lax.dynamic_slice_in_dim(params, jax.lax.axis_index("data") * size, size)
        return jax.lax.all_gather(p - lr * mine, "data", tiled=True)

    assert "On 4 devices" in check("10.2", eight_only).message

    def own_only(params, grads, lr):
        return params - lr * grads

    assert "never summed" in check("10.2", own_only).message or "on 8 devices" in check("10.2", own_only).message

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

    def first_slice_everywhere(params, grads, lr):   # every device cuts slice 0 of the parameters
        n = jax.lax.axis_size("data")
        size = params.shape[0] // n
        mine = jax.lax.psum_scatter(grads, "data", tiled=True) / n
        return jax.lax.all_gather(params[:size] - lr * mine, "data", tiled=True)

    feedback = check("10.2", first_slice_everywhere)
    assert not feedback and "only the first slice is right" in feedback.message

    def untiled(params, grads, lr):              # an all_gather without tiling stacks the slices: (n, P // n)
        n = jax.lax.axis_size("data")
        size = params.shape[0] // n
        mine = jax.lax.psum_scatter(grads, "data", tiled=True) / n
        p = jax.lax.dynamic_slice_in_dim(params, jax.lax.axis_index("data") * size, size)
        return jax.lax.all_gather(p - lr * mine, "data")

    feedback = check("10.2", untiled)
    assert not feedback and "stacked on a new axis" in feedback.message and "tiled" in feedback.message
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

    assert "a smaller K" in check("10.3", largest).message
    assert "raised ZeroDivisionError" in check("10.3", lambda b, e, m: 1 // 0).message
    assert "return None" in check("10.3", lambda b, e, m: next(k for k in range(1, b + 1) if not b % k
                                                                 and b // k * e <= m)).message
    assert "whole number" in check("10.3", lambda b, e, m: 4.0).message


def test_hints_cover_every_exercise_with_a_ladder_of_three():
    assert set(HINTS) == {"10.1", "10.2", "10.3", "10.4", "10.5"}
    assert all(len(h) >= 3 and all(isinstance(t, str) and t for t in h) for h in HINTS.values())


def _solution_lines(fn):
    body = inspect.getsource(fn).split("\n")[1:]
    lines = {re.sub(r"\s+", "", line.split("#")[0]) for line in body}
    return {line for line in lines if len(line) >= 12}


WRONG_ANSWERS = {
    "10.1": lambda n_params, n, stage: solution_zero_bytes(n_params, n, "replicated"),
    "10.2": lambda params, grads, lr: params - lr * grads,
    "10.3": lambda b, e, m: b,
    "10.4": lambda loss_fn, optimizer: (lambda p, o, b: (p, o, loss_fn(p, b))),
    "10.5": lambda stage: {"all-reduce": 1},
}
SOLUTIONS = {"10.1": solution_zero_bytes, "10.2": solution_zero2_sgd, "10.3": solution_choose_k,
             "10.4": solution_fsdp_step, "10.5": solution_predict_collectives}


@pytest.mark.parametrize("id_", sorted(SOLUTIONS))
def test_no_hint_and_no_feedback_holds_the_solutions_code(id_):
    lines = _solution_lines(SOLUTIONS[id_])
    hints = exercises()[id_].hints
    feedback = check(id_, WRONG_ANSWERS[id_])
    assert not feedback
    for text in list(hints) + [feedback.message]:
        squeezed = re.sub(r"\s+", "", text)
        assert not [line for line in lines if line in squeezed], (id_, text)
    for text in hints:
        for snippet in re.findall(r"`([^`]*)`", text):
            assert not re.search(r"\w\(.+\)", snippet), (id_, snippet)


def test_10_4_fsdp_step():
    assert check("10.4", solution_fsdp_step)

    def not_averaged(loss_fn, optimizer):        # the reduce-scattered gradient is a sum: n times too large
        def step(p, o, batch):
            loss, g = jax.value_and_grad(lambda q: loss_fn(jax.lax.all_gather(q, "data", tiled=True), batch))(p)
            u, o = optimizer.update(g, o, p)
            return optax.apply_updates(p, u), o, jax.lax.pmean(loss, "data")
        return step

    feedback = check("10.4", not_averaged)
    assert not feedback and "8 times too large" in feedback.message and "Adam" in feedback.message

    def all_reduced(loss_fn, optimizer):         # gathers, all-reduces the whole gradient, keeps a slice
        def step(p, o, batch):
            n = jax.lax.axis_size("data")
            full = jax.lax.all_gather(p, "data", tiled=True)
            loss, g = jax.value_and_grad(loss_fn)(full, batch)
            g = jax.lax.pmean(g, "data")
            mine = jax.lax.dynamic_slice_in_dim(g, jax.lax.axis_index("data") * p.shape[0], p.shape[0])
            u, o = optimizer.update(mine, o, p)
            return optax.apply_updates(p, u), o, jax.lax.pmean(loss, "data") + 0 * n
        return step

    feedback = check("10.4", all_reduced)
    assert not feedback and "all-reduces the gradient" in feedback.message

    def gathered_invarying(loss_fn, optimizer):  # section 2's invarying gather copied into the loss: an all-reduce
        def step(p, o, batch):                   # of the gradient (XLA drops the unread padding: under P bytes)
            gather = lambda q: jax.lax.all_gather(q, "data", tiled=True, to="invarying")
            loss, g = jax.value_and_grad(lambda q: loss_fn(gather(q), batch))(p)
            u, o = optimizer.update(g / jax.lax.axis_size("data"), o, p)
            return optax.apply_updates(p, u), o, jax.lax.pmean(loss, "data")
        return step

    feedback = check("10.4", gathered_invarying)
    assert not feedback and "all-reduces the gradient" in feedback.message and "invarying" in feedback.message

    def never_summed(loss_fn, optimizer):        # gathers outside grad, keeps its slice of its own local gradient
        def step(p, o, batch):
            full = jax.lax.all_gather(p, "data", tiled=True)
            loss, g = jax.value_and_grad(loss_fn)(full, batch)
            mine = jax.lax.dynamic_slice_in_dim(g, jax.lax.axis_index("data") * p.shape[0], p.shape[0])
            u, o = optimizer.update(mine, o, p)
            return optax.apply_updates(p, u), o, jax.lax.pmean(loss, "data")
        return step

    feedback = check("10.4", never_summed)
    assert not feedback and "sums no gradient over the devices" in feedback.message

    def scatters_itself(loss_fn, optimizer):     # gathers once outside grad, reduce-scatters by hand: right
        def step(p, o, batch):
            full = jax.lax.all_gather(p, "data", tiled=True)
            loss, g = jax.value_and_grad(loss_fn)(full, batch)
            g = jax.lax.psum_scatter(g, "data", tiled=True) / jax.lax.axis_size("data")
            u, o = optimizer.update(g, o, p)
            return optax.apply_updates(p, u), o, jax.lax.pmean(loss, "data")
        return step

    assert check("10.4", scatters_itself)

    def keeps_whole(loss_fn, optimizer):         # returns the gathered vector instead of the slice
        def step(p, o, batch):
            new, o, loss = solution_fsdp_step(loss_fn, optimizer)(p, o, batch)
            return jax.lax.all_gather(new, "data", tiled=True), o, loss
        return step

    assert "FSDP keeps only this device's slice" in check("10.4", keeps_whole).message

    def never_gathers(loss_fn, optimizer):
        def step(p, o, batch):
            loss, g = jax.value_and_grad(loss_fn)(p, batch)
            return p - g, o, jax.lax.pmean(loss, "data")
        return step

    feedback = check("10.4", never_gathers)
    assert not feedback and "raised" in feedback.message and "needs the whole parameter vector" in feedback.message

    def local_loss(loss_fn, optimizer):          # the loss of this device's examples only, never averaged
        def step(p, o, batch):
            new, o, loss = solution_fsdp_step(loss_fn, optimizer)(p, o, batch)
            return new, o, loss_fn(jax.lax.all_gather(p, "data", tiled=True), batch)
        return step

    feedback = check("10.4", local_loss)
    assert not feedback and "raised" in feedback.message and "average it" in feedback.message

    def eight_only(loss_fn, optimizer):
        def step(p, o, batch):
            loss, g = jax.value_and_grad(lambda q: loss_fn(jax.lax.all_gather(q, "data", tiled=True), batch))(p)
            u, o = optimizer.update(g / 8, o, p)
            return optax.apply_updates(p, u), o, jax.lax.pmean(loss, "data")
        return step

    feedback = check("10.4", eight_only)
    assert not feedback and "on 4 devices" in feedback.message.lower()

    def half_precision(loss_fn, optimizer):
        def step(p, o, batch):
            new, o, loss = solution_fsdp_step(loss_fn, optimizer)(p, o, batch)
            return new.astype(jnp.float16), o, loss
        return step

    feedback = check("10.4", half_precision)
    assert not feedback and "float16" in feedback.message
    assert "returned None" in check("10.4", lambda loss_fn, optimizer: (lambda p, o, b: None)).message
    assert "expected the step function" in check("10.4", lambda loss_fn, optimizer: 3).message


def test_10_5_predict_collectives():
    assert check("10.5", solution_predict_collectives)
    as_jax_names = {"replicated": {"psum": 1}, "zero1": {"psum_scatter": 1, "all_gather": 1},
                    "zero2": {"psum_scatter": 1, "all_gather": 1}, "fsdp": {"all_gather": 2, "psum_scatter": 1}}
    assert check("10.5", as_jax_names.__getitem__)

    def zero1_all_reduces(stage):                # the claim a reader of older texts makes
        return {"all-reduce": 1, "all-gather": 1} if stage == "zero1" else solution_predict_collectives(stage)

    feedback = check("10.5", zero1_all_reduces)
    assert not feedback and feedback.message.startswith("[10.5]") is False
    assert "zero1: you predicted all-gather x1, all-reduce x1" in feedback.message and "reduce-scatter" in feedback.message

    def fsdp_gathers_once(stage):
        return {"all-gather": 1, "reduce-scatter": 1} if stage == "fsdp" else solution_predict_collectives(stage)

    assert "backward" in check("10.5", fsdp_gathers_once).message

    def per_layer(stage):                        # counted once per layer (2 layers) instead of once per step
        return {op: 2 * k for op, k in solution_predict_collectives(stage).items()}

    feedback = check("10.5", per_layer)
    assert not feedback and "not once per layer" in feedback.message
    strings = check("10.5", lambda stage: {k: str(v) for k, v in solution_predict_collectives(stage).items()})
    assert not strings and "a Python int" in strings.message and "'1'" in strings.message
    assert "compiled program's names" in check("10.5", lambda stage: {"allreduce-ish": 1}).message
    assert "expected a dict" in check("10.5", lambda stage: ["all-reduce"]).message


def test_10_3_zero_or_negative_k_is_named_not_a_checker_crash():
    for k in (0, -1):
        feedback = check("10.3", lambda b, e, m, k=k: k)
        assert not feedback and f"returned {k}: K counts micro-batches, a whole number >= 1" in feedback.message
        assert "Checking it failed" not in feedback.message
