"""Lesson 05 checkers: the reference passes; typical mistakes get feedback that names them."""

import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from course_lib.exercises import check, exercises
from course_lib.exercises.lesson05 import solution_dp_step, solution_masked_mse, solution_max_divergence


def update(optimizer, grads, opt_state, params):
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def test_05_1_dp_step():
    fb = check("05.1", solution_dp_step)
    assert fb and "with SGD, momentum, AdamW and RMSprop" in fb.message

    def no_pmean(loss_fn, optimizer, params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        return *update(optimizer, grads, opt_state, params), loss

    drift = check("05.1", no_pmean)
    assert "got the copies of the parameters differ from device to device" in drift.message
    assert "jax.lax.pmean" not in drift.message, "the fix is left to hint()"   # psum, tree_map, ...: fool tests


def test_05_1_averaging_the_parameters_after_the_update_is_rejected_with_the_reason():
    def params_averaged(loss_fn, optimizer, params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)        # each device's own gradients
        new_params, opt_state = update(optimizer, grads, opt_state, params)
        return jax.lax.pmean(new_params, "devices"), opt_state, jax.lax.pmean(loss, "devices")

    fb = check("05.1", params_averaged)
    assert not fb and "with Adam" in fb.message and "the average was taken AFTER the optimizer" in fb.message
    assert "not linear in the gradient" in fb.message, "says why SGD could not tell"


def test_05_1_psum_with_adam_is_caught():
    calls = []

    def psum_adam_only(loss_fn, optimizer, params, opt_state, batch):
        # pmean while the checker uses SGD, psum once it uses Adam: the bug Adam hides in the loss curve.
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        adam = not isinstance(opt_state[0], optax.EmptyState)
        calls.append(adam)
        grads = (jax.lax.psum if adam else jax.lax.pmean)(grads, "devices")
        return *update(optimizer, grads, opt_state, params), jax.lax.pmean(loss, "devices")

    fb = check("05.1", psum_adam_only)
    assert any(calls), "the checker runs Adam too"
    # the state handed in is one update old, so Adam's update itself shows the summed gradient
    assert not fb and "on 8 devices with AdamW: the update of params" in fb.message


def test_05_2_max_divergence():
    assert check("05.2", solution_max_divergence)

    def first_two(tree):
        w = tree["w"].addressable_shards
        return float(np.max(np.abs(np.asarray(w[1].data) - np.asarray(w[0].data))))

    fb = check("05.2", first_two)   # one leaf, two devices: no known mistake matches every case; measured
    assert not fb and "expected 0.3751, got 0.125: 3x too small" in fb.message
    assert "only the second device's copy" not in fb.message

    def signed(tree):  # forgets the absolute value: a copy that is smaller than the first one goes unseen
        worst = 0.0
        for leaf in jax.tree.leaves(tree):
            copies = [np.asarray(s.data) for s in leaf.addressable_shards]
            worst = max([worst] + [float(np.max(c - copies[0])) for c in copies[1:]])
        return worst

    fb = check("05.2", signed)
    assert not fb and "the largest signed difference" in fb.message and "below the first one" in fb.message
    per_leaf = check("05.2", lambda t: np.array([solution_max_divergence(t["w"]), solution_max_divergence(t["b"])]))
    assert "shape (2,) where () was expected" in per_leaf.message


def test_05_2_a_global_computation_is_rejected_as_02_3_does():
    def global_view(tree):
        return max(float(jnp.max(jnp.abs(leaf - leaf[0]))) for leaf in jax.tree.leaves(tree))

    fb = check("05.2", global_view)
    assert not fb and "the value is right, but it was computed from the global view" in fb.message

    def on_devices(tree):
        worst = 0.0
        for leaf in jax.tree.leaves(tree):
            copies = [s.data for s in leaf.addressable_shards]
            worst = max([worst] + [float(jnp.max(jnp.abs(c - copies[0]))) for c in copies[1:]])
        return worst

    fb = check("05.2", on_devices)
    assert not fb and "copies that live on different devices" in fb.message


def test_05_2_numbers_as_strings_or_changed_inputs():
    fb = check("05.2", lambda t: str(solution_max_divergence(t)))
    assert not fb and "expected one number, got str" in fb.message

    def pops(tree):
        tree.pop("b")
        return solution_max_divergence(tree)

    fb = check("05.2", pops)
    assert not fb and "changed its input" in fb.message


def test_05_3_masked_mse():
    assert check("05.3", solution_masked_mse)
    plain_mean = check("05.3", lambda p, y, m: jnp.mean((p - y) ** 2))
    assert "the padding rows counted as if they were real" in plain_mean.message
    by_all = check("05.3", lambda p, y, m: jnp.sum(m * (p - y) ** 2) / len(p))
    assert "divided by all the rows" in by_all.message
    nan = check("05.3", lambda p, y, m: jnp.sum(m * (p - y) ** 2) / jnp.sum(m))
    assert "got nan" in nan.message and "0 / 0" in nan.message
    assert "max(" not in nan.message, "the fix is left to hint()"


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_05_3_a_lower_precision_loss_is_named(dtype):
    fb = check("05.3", lambda p, y, m: solution_masked_mse(p, y, m).astype(dtype))
    assert not fb and f"dtype {jnp.dtype(dtype).name} where float32 was expected" in fb.message


def test_05_1_swapped_or_wrong_structure():
    def swapped(loss_fn, optimizer, params, opt_state, batch):
        new_params, new_state, loss = solution_dp_step(loss_fn, optimizer, params, opt_state, batch)
        return loss, new_state, new_params

    fb = check("05.1", swapped)
    assert not fb and "expected dict{'b'" in fb.message and "got ndarray float32[]" in fb.message
    fb = check("05.1", lambda *a: (lambda p, s, loss: (s, p, loss))(*solution_dp_step(*a)))
    assert not fb and "The triple is in the order (new_opt_state, new_params, loss)" in fb.message

    def hand_sgd(loss_fn, optimizer, params, opt_state, batch):     # the optimizer it was given, never used
        loss, grads = jax.lax.pmean(jax.value_and_grad(loss_fn)(params, batch), "devices")
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), opt_state, loss
    fb = check("05.1", hand_sgd)
    assert not fb and "dp_step never called the update of the optimizer it was given" in fb.message
    fb = check("05.1", lambda *a: solution_dp_step(*a)[0])
    assert not fb and "should return a triple (new_params, new_opt_state, loss)" in fb.message
    fb = check("05.1", lambda *a: (solution_dp_step(*a)[0], solution_dp_step(*a)[2]))
    assert not fb and "should return a triple" in fb.message

    def renamed(*a):
        new_params, new_state, loss = solution_dp_step(*a)
        return {"weights": new_params["w"], "bias": new_params["b"]}, new_state, loss

    fb = check("05.1", renamed)
    assert not fb and "expected dict{'b'" in fb.message and "got dict{'bias'" in fb.message

    def wrong_key(loss_fn, optimizer, params, opt_state, batch):
        return params["weights"], opt_state, 0.0

    fb = check("05.1", wrong_key)
    assert not fb and "raised KeyError: 'weights'" in fb.message


def test_05_2_raises_or_wrong_structure():
    fb = check("05.2", lambda t: {k: solution_max_divergence(v) for k, v in t.items()})
    assert not fb and "expected float, got dict{'b': float, 'w': float}" in fb.message
    fb = check("05.2", lambda t: t["w"].addressable_shards[8].data)
    assert not fb and "max_divergence(dict) raised IndexError" in fb.message


def test_05_3_forgot_to_reduce_or_raises():
    fb = check("05.3", lambda p, y, m: m * (p - y) ** 2)
    assert not fb and "shape (8,) where () was expected" in fb.message
    fb = check("05.3", lambda p, y, m: jnp.sum(m * (p - y) ** 2) / m.sum(axis=1))
    assert not fb and "masked_mse(Array float32[8], Array float32[8], Array bool[8]) raised" in fb.message
    fb = check("05.3", lambda p, y, m: (jnp.mean((p - y) ** 2), m.sum()))
    assert not fb and "got tuple(" in fb.message


def test_no_hint_or_wrong_answer_feedback_of_lesson_05_holds_solution_code():
    for id_ in ("05.1", "05.2", "05.3"):
        ex = exercises()[id_]
        body = inspect.getsource(ex.solution).splitlines()[1:]
        lines = {re.sub(r"\s+", "", ln.split("#")[0]) for ln in body}
        lines = {ln for ln in lines if len(ln) >= 12}
        for text in ex.hints:
            squashed = re.sub(r"\s+", "", text)
            assert not [ln for ln in lines if ln in squashed], (id_, text)
            for snippet in re.findall(r"`([^`]*)`", text):
                assert "(" not in snippet, (id_, snippet)
        assert len(ex.hints) >= 2, f"{id_}: a ladder: a nudge, then the API or the section to read"


def test_05_1_an_average_fixed_to_8_devices_fails_on_4_with_the_reason():
    def divide_by_8(loss_fn, optimizer, params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        grads = jax.tree.map(lambda g: jax.lax.psum(g, "devices") / 8, grads)
        return *update(optimizer, grads, opt_state, params), jax.lax.pmean(loss, "devices")

    fb = check("05.1", divide_by_8)
    assert not fb and "on 4 devices with SGD with momentum and a Huber loss: " in fb.message
    assert "divides by a fixed count, all the devices" in fb.message


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_05_1_parameters_in_another_dtype_are_named(dtype):
    def cast(loss_fn, optimizer, params, opt_state, batch):
        new_params, new_state, loss = solution_dp_step(loss_fn, optimizer, params, opt_state, batch)
        return jax.tree.map(lambda p: p.astype(dtype), new_params), new_state, loss

    fb = check("05.1", cast)
    assert not fb and f"dtype {jnp.dtype(dtype).name} where float32 was expected" in fb.message


def _max_divergence_in(dtype, as_float):
    def max_divergence(replicated):
        worst = 0.0
        for leaf in jax.tree.leaves(replicated):
            copies = [np.asarray(s.data).astype(dtype) for s in leaf.addressable_shards]
            for c in copies[1:]:
                worst = max(worst, np.max(np.abs(c - copies[0])))
        return float(worst) if as_float else worst
    return max_divergence


def test_05_2_lower_precision_is_named():
    fb = check("05.2", _max_divergence_in(np.float16, as_float=False))
    assert not fb and "dtype float16 where a Python float was expected" in fb.message
    fb = check("05.2", _max_divergence_in(np.float16, as_float=True))
    assert not fb and "rounded to 3 decimals (or to float16 precision: both give these numbers)" in fb.message
    assert check("05.2", _max_divergence_in(np.float32, as_float=True))
    assert check("05.2", _max_divergence_in(np.float64, as_float=True))


def test_05_3_a_loss_that_cannot_be_traced_is_named():
    boolean_index = check("05.3", lambda p, y, m: jnp.mean(((p - y) ** 2)[m]))
    assert not boolean_index and "indexing with a boolean mask" in boolean_index.message
    python_float = check("05.3", lambda p, y, m: float(solution_masked_mse(p, y, m)))
    assert not python_float and "float(), int(), bool(), np.asarray(), np.float32() or a Python if" in python_float.message

    def python_if(p, y, m):
        if jnp.sum(m) == 0:
            return jnp.float32(0.0)
        return jnp.sum(m * (p - y) ** 2) / jnp.sum(m)

    assert "float(), int(), bool(), np.asarray(), np.float32() or a Python if" in check("05.3", python_if).message


@pytest.mark.parametrize("hide", [lambda v: jnp.nan_to_num(v), lambda v: jnp.where(jnp.isnan(v), 0.0, v)])
def test_05_3_a_nan_hidden_in_the_value_but_not_in_the_gradient_is_caught(hide):
    fb = check("05.3", lambda p, y, m: hide(jnp.sum(m * (p - y) ** 2) / jnp.sum(m)))
    assert not fb and "its gradient there is [nan nan nan nan]" in fb.message
    assert check("05.3", lambda p, y, m: jnp.sum(m * (p - y) ** 2) / (jnp.sum(m) + 1e-8))


def test_05_1_a_string_returned_from_pmap_is_explained():
    fb = check("05.1", lambda *args: "3")
    assert not fb and "returns arrays (or pytrees of them)" in fb.message


def test_05_1_a_gathered_batch_is_refused_with_the_rows_the_loss_saw():
    def gathered(loss_fn, optimizer, params, opt_state, batch):
        everything = jax.tree.map(lambda v: jax.lax.all_gather(v, "devices", tiled=True), batch)
        loss, grads = jax.value_and_grad(loss_fn)(params, everything)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    fb = check("05.1", gathered)
    assert not fb and "the loss function was called on a batch of 128 rows; each device's shard has 16" in fb.message


def test_05_3_dividing_by_a_zero_count_is_named_on_the_all_padding_case():
    fb = check("05.3", lambda p, y, m: jnp.sum(m * (p - y) ** 2) / jnp.sum(m))
    assert not fb and fb.message.startswith("masked_mse with no real rows at all")
    assert "0 / 0 is NaN" in fb.message
