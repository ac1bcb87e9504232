"""Lesson 05 checkers: the reference passes; typical mistakes get feedback that names them."""

import jax
import jax.numpy as jnp
import numpy as np

from course_lib.exercises import check
from course_lib.exercises.lesson05 import solution_dp_step, solution_masked_mse, solution_max_divergence


def sgd(params, grads, lr):
    return jax.tree.map(lambda p, g: p - lr * g, params, grads)


def test_05_1_dp_step():
    assert check("05.1", solution_dp_step)

    def no_pmean(loss_fn, params, batch, lr):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        return sgd(params, grads, lr), loss

    drift = check("05.1", no_pmean)
    assert "the copies of w differ by up to" in drift.message and "jax.lax.pmean" in drift.message

    def with_psum(loss_fn, params, batch, lr):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        return sgd(params, jax.lax.psum(grads, "devices"), lr), jax.lax.pmean(loss, "devices")

    assert "the update is 8 times too large" in check("05.1", with_psum).message

    def old_tree_map(loss_fn, params, batch, lr):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        return jax.tree_map(lambda p, g: p - lr * g, params, jax.lax.pmean(grads, "devices")), loss

    assert "jax.tree_map was removed from JAX: use jax.tree.map" in check("05.1", old_tree_map).message

    def local_loss(loss_fn, params, batch, lr):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        return sgd(params, jax.lax.pmean(grads, "devices"), lr), loss

    assert "the loss returned on 8 devices" in check("05.1", local_loss).message


def test_05_2_max_divergence():
    assert check("05.2", solution_max_divergence)

    def first_two(tree):
        w = tree["w"].addressable_shards
        return float(np.max(np.abs(np.asarray(w[1].data) - np.asarray(w[0].data))))

    assert "not only the first two" in check("05.2", first_two).message
    def signed(tree):  # forgets the absolute value: a copy that is smaller than the first one goes unseen
        worst = 0.0
        for leaf in jax.tree.leaves(tree):
            copies = [np.asarray(s.data) for s in leaf.addressable_shards]
            worst = max([worst] + [float(np.max(c - copies[0])) for c in copies[1:]])
        return worst

    assert "device 1's copy of 'b' differs by 2.0" in check("05.2", signed).message
    per_leaf = check("05.2", lambda t: np.array([solution_max_divergence(t["w"]), solution_max_divergence(t["b"])]))
    assert "should be one number" in per_leaf.message


def test_05_3_masked_mse():
    assert check("05.3", solution_masked_mse)
    assert "counts the padding rows too" in check("05.3", lambda p, y, m: jnp.mean((p - y) ** 2)).message
    by_all = check("05.3", lambda p, y, m: jnp.sum(m * (p - y) ** 2) / len(p))
    assert "divides by all 8 rows" in by_all.message
    nan = check("05.3", lambda p, y, m: jnp.sum(m * (p - y) ** 2) / jnp.sum(m))
    assert "returned nan" in nan.message and "max(number of real rows, 1)" in nan.message


def test_05_1_swapped_or_wrong_structure():
    def swapped(loss_fn, params, batch, lr):
        new_params, loss = solution_dp_step(loss_fn, params, batch, lr)
        return loss, new_params

    fb = check("05.1", swapped)
    assert not fb and "the loss first and the parameters second" in fb.message
    fb = check("05.1", lambda loss_fn, params, batch, lr: solution_dp_step(loss_fn, params, batch, lr)[0])
    assert not fb and "should return a pair (new_params, loss); got dict{" in fb.message

    def renamed(loss_fn, params, batch, lr):
        new_params, loss = solution_dp_step(loss_fn, params, batch, lr)
        return {"weights": new_params["w"], "bias": new_params["b"]}, loss

    fb = check("05.1", renamed)
    assert not fb and "new_params, the first thing dp_step returns should have the structure dict{'w'" in fb.message

    def wrong_key(loss_fn, params, batch, lr):
        return params["weights"], 0.0

    fb = check("05.1", wrong_key)
    assert not fb and "pmap(dp_step)(dict, dict, float) raised KeyError: 'weights'" in fb.message


def test_05_2_raises_or_wrong_structure():
    fb = check("05.2", lambda t: {k: solution_max_divergence(v) for k, v in t.items()})
    assert not fb and "should be one number, got dict{'b': float, 'w': float}" in fb.message
    fb = check("05.2", lambda t: t["w"].addressable_shards[8].data)
    assert not fb and "max_divergence(dict) raised IndexError" in fb.message


def test_05_3_forgot_to_reduce_or_raises():
    fb = check("05.3", lambda p, y, m: m * (p - y) ** 2)
    assert not fb and "should be one number, got shape (8,)" in fb.message and "reduce" in fb.message
    fb = check("05.3", lambda p, y, m: jnp.sum(m * (p - y) ** 2) / m.sum(axis=1))
    assert not fb and "masked_mse(Array float32[8], Array float32[8], Array bool[8]) raised" in fb.message
    fb = check("05.3", lambda p, y, m: (jnp.mean((p - y) ** 2), m.sum()))
    assert not fb and "should be one number, got tuple(" in fb.message
