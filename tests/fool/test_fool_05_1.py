"""Exercise 05.1 (the data-parallel step): wrong answers a learner might write, and right ones written
differently from the reference. Each wrong answer fails with feedback that names its mistake, not the fix."""

import jax
import optax
import pytest

from course_lib.exercises import check


def update(optimizer, grads, opt_state, params):
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def no_pmean(loss_fn, optimizer, params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    return *update(optimizer, grads, opt_state, params), jax.lax.pmean(loss, "devices")


def psum_grads(loss_fn, optimizer, params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    return *update(optimizer, jax.lax.psum(grads, "devices"), opt_state, params), jax.lax.pmean(loss, "devices")


def fixed_eight(loss_fn, optimizer, params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    grads = jax.tree.map(lambda g: jax.lax.psum(g, "devices") / 8, grads)
    return *update(optimizer, grads, opt_state, params), jax.lax.pmean(loss, "devices")


def own_sgd(loss_fn, optimizer, params, opt_state, batch):      # ignores the optimizer it is given
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    grads = jax.lax.pmean(grads, "devices")
    new_params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
    return new_params, optimizer.update(grads, opt_state, params)[1], jax.lax.pmean(loss, "devices")


def local_loss(loss_fn, optimizer, params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    return *update(optimizer, jax.lax.pmean(grads, "devices"), opt_state, params), loss


def summed_loss(loss_fn, optimizer, params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    return *update(optimizer, jax.lax.pmean(grads, "devices"), opt_state, params), jax.lax.psum(loss, "devices")


def params_averaged(loss_fn, optimizer, params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    new_params, new_state = update(optimizer, grads, opt_state, params)
    return jax.lax.pmean(new_params, "devices"), new_state, jax.lax.pmean(loss, "devices")


def updates_averaged(loss_fn, optimizer, params, opt_state, batch):   # pmean of the optimizer's updates
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    updates = jax.lax.pmean(updates, "devices")
    return optax.apply_updates(params, updates), opt_state, jax.lax.pmean(loss, "devices")


def stale_state(loss_fn, optimizer, params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    new_params, _ = update(optimizer, jax.lax.pmean(grads, "devices"), opt_state, params)
    return new_params, opt_state, jax.lax.pmean(loss, "devices")


def no_params(loss_fn, optimizer, params, opt_state, batch):    # AdamW's weight decay reads the params
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = optimizer.update(jax.lax.pmean(grads, "devices"), opt_state)
    return optax.apply_updates(params, updates), opt_state, jax.lax.pmean(loss, "devices")


def old_tree_map(loss_fn, optimizer, params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    grads = jax.tree_map(lambda g: jax.lax.pmean(g, "devices"), grads)
    return *update(optimizer, grads, opt_state, params), jax.lax.pmean(loss, "devices")


def wrong_axis_name(loss_fn, optimizer, params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    grads = jax.lax.pmean(grads, "batch")
    return *update(optimizer, grads, opt_state, params), jax.lax.pmean(loss, "batch")


WRONG = [
    (no_pmean, ["the copies of the parameters differ", "its own shard"]),
    (psum_grads, ["8 times too large", "sum of the 8 devices' (what psum gives), not their mean"]),
    (fixed_eight, ["divides by a fixed count, all the devices"]),
    (own_sgd, ["the one optax.sgd(0.1) makes", "ignored its optimizer argument"]),
    (local_loss, ["Each device returned the loss of its own shard"]),
    (summed_loss, ["8 times the loss of the global batch"]),
    (params_averaged, ["the average was taken AFTER the optimizer"]),
    (updates_averaged, ["the average was taken AFTER the optimizer", "of its updates, or of the new parameters"]),
    (stale_state, ["the one dp_step was given, unchanged"]),
    (no_params, ["on 8 devices with AdamW", "not passing `params` when calling `update`"]),
    (old_tree_map, ["jax.tree_map was removed"]),
    (wrong_axis_name, ["raised NameError: Found an unbound axis name: batch. The axis is named 'devices'"]),
]


@pytest.mark.parametrize("answer, named", WRONG, ids=[w[0].__name__ for w in WRONG])
def test_wrong_answer_fails_and_the_feedback_names_the_mistake(answer, named):
    fb = check("05.1", answer)
    assert not fb, fb.message
    for words in named:
        assert words in fb.message, fb.message


def sum_over_count(loss_fn, optimizer, params, opt_state, batch):   # psum / number of devices, by hand
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    n = jax.lax.axis_size("devices")
    grads = jax.tree.map(lambda g: jax.lax.psum(g, "devices") / n, grads)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return jax.tree.map(lambda p, u: p + u, params, updates), opt_state, jax.lax.psum(loss, "devices") / n


def both_at_once(loss_fn, optimizer, params, opt_state, batch):     # one pmean of (loss, grads) together
    loss, grads = jax.lax.pmean(jax.value_and_grad(loss_fn)(params, batch), "devices")
    return *update(optimizer, grads, opt_state, params), loss


@pytest.mark.parametrize("answer", [sum_over_count, both_at_once])
def test_right_answers_written_differently_pass(answer):
    fb = check("05.1", answer)
    assert fb, fb.message
