"""Lesson 12 checkers: the reference passes; each mistake the lesson warns about gets feedback that names it."""

import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from course_lib.exercises import check, exercises
from course_lib.exercises import lesson12 as L


def _step_body(loss_fn, optimizer, *, sign=1, keep_opt=False, dtype=None, gather_batch=False, update=True):
    def step(params, opt_state, x, y):
        if gather_batch:
            x, y = jax.sharding.reshard(x, P()), jax.sharding.reshard(y, P())
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, new_opt = optimizer.update(grads, opt_state, params)
        new_params = jax.tree.map(lambda p, u: p + sign * u, params, updates) if update else params
        return new_params, (opt_state if keep_opt else new_opt), (loss.astype(dtype) if dtype else loss)
    return step


# ---------------------------------------------------------------------------------------------- 12.1


def test_12_1_reference_passes():
    feedback = check("12.1", L.solution_make_dp_step)
    assert feedback, feedback.message
    assert "8 and 4 devices" in feedback.message


def test_12_1_placeholder_is_not_started():
    feedback = check("12.1", lambda loss_fn, optimizer: None)
    assert not feedback and not feedback.started


@pytest.mark.parametrize("answer, expected", [
    (lambda lf, opt: _step_body(lf, opt), "plain Python function"),
    (lambda lf, opt: jax.jit(_step_body(lf, opt)), "does not donate"),
    (lambda lf, opt: jax.jit(_step_body(lf, opt, sign=-1), donate_argnums=(0, 1)), "moved the wrong way"),
    (lambda lf, opt: jax.jit(_step_body(lf, opt, update=False), donate_argnums=(0, 1)), "did not change"),
    (lambda lf, opt: jax.jit(_step_body(lf, opt, keep_opt=True), donate_argnums=(0, 1)),
     "not the one the optimizer's update returned"),
    (lambda lf, opt: jax.jit(_step_body(lf, opt, dtype=jnp.bfloat16), donate_argnums=(0, 1)), "bfloat16"),
    (lambda lf, opt: jax.jit(_step_body(lf, opt, gather_batch=True), donate_argnums=(0, 1)), "all-gather"),
    (lambda lf, opt: "step", "returned str"),
], ids=["no-jit", "no-donation", "subtracts-updates", "no-update", "old-opt-state", "bfloat16-loss",
        "batch-gathered", "string"])
def test_12_1_mistakes_are_named(answer, expected):
    feedback = check("12.1", answer)
    assert not feedback
    assert expected in feedback.message, feedback.message


def test_12_1_sgd_instead_of_the_given_optimizer():
    def with_sgd(loss_fn, optimizer):
        return jax.jit(_step_body(loss_fn, optax.sgd(0.05)), donate_argnums=(0, 1))
    feedback = check("12.1", with_sgd)
    assert not feedback and "optimizer" in feedback.message


def test_12_1_pmean_in_sharded_jit():
    def with_pmean(loss_fn, optimizer):
        def step(params, opt_state, x, y):
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            grads = jax.lax.pmean(grads, "data")
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss
        return jax.jit(step, donate_argnums=(0, 1))
    feedback = check("12.1", with_pmean)
    assert not feedback, "a pmean in sharded jit should not pass"


def test_12_1_works_on_8_fails_on_4():
    mesh8 = jax.make_mesh((8,), ("data",))

    def fixed_mesh(loss_fn, optimizer):
        return jax.jit(_step_body(loss_fn, optimizer), donate_argnums=(0, 1),
                       out_shardings=(NamedSharding(mesh8, P()), NamedSharding(mesh8, P()), NamedSharding(mesh8, P())))
    feedback = check("12.1", fixed_mesh)
    assert not feedback
    assert "on 4 devices" in feedback.message, feedback.message


def test_12_1_state_split_over_devices():
    def splits_state(loss_fn, optimizer):
        def step(params, opt_state, x, y):
            new_params, new_opt, loss = _step_body(loss_fn, optimizer)(params, opt_state, x, y)
            return {**new_params, "w": jax.sharding.reshard(new_params["w"], P("data"))}, new_opt, loss
        return jax.jit(step, donate_argnums=(0, 1))
    feedback = check("12.1", splits_state)
    assert not feedback and "split over the devices" in feedback.message, feedback.message


# ---------------------------------------------------------------------------------------------- 12.2


def test_12_2_reference_passes():
    feedback = check("12.2", L.solution_gather_layer)
    assert feedback, feedback.message


def _psum_gather(layer):
    """Right values without an all-gather: place my slice in zeros, then psum (an all-reduce of the whole leaf)."""
    def whole(w):
        n, i = jax.lax.axis_size("data"), jax.lax.axis_index("data")
        size = w.shape[-1]
        full = jnp.zeros(w.shape[:-1] + (n * size,), w.dtype)
        return jax.lax.psum(jax.lax.dynamic_update_slice_in_dim(full, w, i * size, axis=w.ndim - 1), "data")
    return jax.tree.map(whole, layer)


@pytest.mark.parametrize("answer, expected", [
    (lambda layer: layer, "still split over the devices"),
    (lambda layer: jax.tree.map(lambda w: jax.lax.all_gather(w, "data", axis=0, tiled=True), layer), "whole leaf"),
    (lambda layer: jax.tree.map(lambda w: jax.lax.all_gather(w, "data", axis=w.ndim - 1), layer), "whole leaf"),
    (lambda layer: {**layer, "w_in": jax.lax.all_gather(layer["w_in"], "data", axis=1, tiled=True),
                    "w_out": jax.lax.all_gather(layer["w_out"], "data", axis=1, tiled=True)}, "layer['b']"),
    (lambda layer: jax.tree.map(lambda w: jax.lax.stop_gradient(
        jax.lax.all_gather(w, "data", axis=w.ndim - 1, tiled=True)), layer), "no gradient flows back"),
    (_psum_gather, "no all-gather"),
    (lambda layer: list(layer.values()), "should return a dict"),
    (lambda layer: jax.tree.map(lambda w: jax.lax.all_gather(w, "devices", axis=w.ndim - 1, tiled=True), layer),
     "axis is named 'data'"),
    (lambda layer: None, "returned None"),
    (lambda layer: jax.tree.map(lambda w: jax.lax.all_gather(w.astype(jnp.bfloat16), "data", axis=w.ndim - 1,
                                                             tiled=True), layer), "bfloat16"),
], ids=["identity", "axis-0", "not-tiled", "forgot-b", "stop-gradient", "psum-gather", "list", "axis-name", "none",
        "bfloat16"])
def test_12_2_mistakes_are_named(answer, expected):
    feedback = check("12.2", answer)
    assert not feedback
    assert expected in feedback.message, feedback.message


def test_12_2_slices_joined_in_the_wrong_order():
    """The right shape, the wrong values: the values tell."""
    def reversed_order(layer):
        def whole(w):
            slices = jax.lax.all_gather(w, "data", axis=0)           # (n, *w.shape), in device order
            return jnp.concatenate(list(slices[::-1]), axis=-1)
        return jax.tree.map(whole, layer)
    feedback = check("12.2", reversed_order)
    assert not feedback and "in device order" in feedback.message, feedback.message


# ---------------------------------------------------------------------------------------------- 12.3


def test_12_3_reference_passes_and_matches_the_hlo():
    assert check("12.3", L.solution_predict)
    for n_layers, k in L._CASES:
        measured = L.measured_collectives(n_layers, k)
        assert measured == {"all-gather": 2 * n_layers * k, "reduce-scatter": n_layers * k, "all-reduce": 1}
    assert L.measured_collectives(2, 2, n_devices=4) == {"all-gather": 8, "reduce-scatter": 4, "all-reduce": 1}


@pytest.mark.parametrize("answer, expected", [
    (lambda n, k: {"all-gather": n * k, "reduce-scatter": n * k, "all-reduce": 1}, "Half the all-gathers"),
    (lambda n, k: {"all-gather": 2 * n * k, "reduce-scatter": n * k, "all-reduce": 0}, "what else in the step"),
    (lambda n, k: {"all-gather": 2 * n * k, "reduce-scatter": 2 * n * k, "all-reduce": 1}, "once, in the backward"),
    (lambda n, k: {"all-gather": 0, "reduce-scatter": 0, "all-reduce": n * k + 1}, "one per weight array"),
    (lambda n, k: {"all-gather": str(2 * n * k), "reduce-scatter": n * k, "all-reduce": 1}, "whole number"),
    (lambda n, k: {"all-gather": 2 * n * k, "reduce-scatter": n * k}, "exactly the keys"),
    (lambda n, k: (2 * n * k, n * k, 1), "exactly the keys"),
], ids=["no-backward-gather", "no-loss", "double-scatter", "dp-thinking", "string", "missing-key", "tuple"])
def test_12_3_mistakes_are_named(answer, expected):
    feedback = check("12.3", answer)
    assert not feedback
    assert expected in feedback.message, feedback.message


def test_12_3_accepts_whole_floats_and_numpy_ints():
    assert check("12.3", lambda n, k: {"all-gather": float(2 * n * k), "reduce-scatter": np.int64(n * k),
                                        "all-reduce": 1})
    assert not check("12.3", lambda n, k: {"all-gather": 2 * n * k + 0.5, "reduce-scatter": n * k, "all-reduce": 1})


# ---------------------------------------------------------------------------------------------- hints and reading


def _normalised_lines(fn):
    body = inspect.getsource(fn).split("\n", 1)[1]
    return {re.sub(r"\s", "", line) for line in body.splitlines() if len(re.sub(r"\s", "", line)) >= 12}


@pytest.mark.parametrize("id_", ["12.1", "12.2", "12.3"])
def test_hints_are_a_ladder_without_solution_code(id_):
    ex = exercises()[id_]
    assert len(ex.hints) >= 2
    lines = _normalised_lines(ex.solution)
    for hint_text in ex.hints:
        flat = re.sub(r"\s", "", hint_text)
        assert not [line for line in lines if line in flat], hint_text
        for snippet in re.findall(r"`([^`]*)`", hint_text):
            assert "(" not in snippet, snippet


def test_compiled_collectives_counts_loop_iterations():
    mesh = jax.make_mesh((8,), ("data",))
    found = L.compiled_collectives(L._square_stack(4, 1, mesh))
    assert found["all-gather"][0] == 8 and found["reduce-scatter"][0] == 4
    # bytes: each all-gather returns a whole (16, 16) float32 matrix
    assert found["all-gather"][1] == 8 * 16 * 16 * 4
    assert L.compiled_collectives("") == {}


# ---------------------------------------------------------------------------------------------- beginner review


def _shard_map_dp_step(correction):
    """12.1 written with shard_map: `correction` is what the step does to the gradient of the P() parameters."""
    def make(loss_fn, optimizer):
        def one_device(params, opt_state, x, y):
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            grads = correction(grads)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, jax.lax.pmean(loss, "data")
        return jax.jit(jax.shard_map(one_device, in_specs=(P(), P(), P("data"), P("data")),
                                     out_specs=(P(), P(), P())), donate_argnums=(0, 1))
    return make


@pytest.mark.parametrize("correction", [
    lambda g: jax.lax.pmean(g, "data"),     # a pmean on top of a gradient already summed over the devices
    lambda g: g,                            # the summed gradient used as it is
], ids=["pmean-on-summed", "summed-unscaled"])
def test_12_1_shard_map_gradient_n_times_too_large_is_named(correction):
    feedback = check("12.1", _shard_map_dp_step(correction))
    assert not feedback
    assert "8 times too large" in feedback.message and "already arrives summed" in feedback.message, feedback.message


def test_12_1_shard_map_with_the_mean_gradient_passes():
    feedback = check("12.1", _shard_map_dp_step(lambda g: jax.tree.map(lambda a: a / jax.lax.axis_size("data"), g)))
    assert feedback, feedback.message


def test_12_1_a_mesh_set_inside_the_step_is_named():
    def own_mesh(loss_fn, optimizer):
        inner = jax.jit(_step_body(loss_fn, optimizer), donate_argnums=(0, 1))
        mesh8 = jax.make_mesh((8,), ("data",))

        def step(*args):
            with jax.set_mesh(mesh8):
                return inner(*args)
        step.lower = inner.lower
        return step
    feedback = check("12.1", own_mesh)
    assert not feedback
    assert "on 4 devices" in feedback.message and "a mesh of its own" in feedback.message, feedback.message
    assert "occurs at source" not in feedback.message and "/" not in feedback.message.split("raised", 1)[1], \
        feedback.message                                                  # no file path of this machine


def test_12_1_batch_pinned_replicated_by_in_shardings_is_named():
    def pinned(loss_fn, optimizer):
        return jax.jit(_step_body(loss_fn, optimizer), donate_argnums=(0, 1), in_shardings=(P(), P(), P(), P()))
    feedback = check("12.1", pinned)
    assert not feedback and "in_shardings" in feedback.message, feedback.message


@pytest.mark.parametrize("answer", [
    lambda layer: jax.tree.map(lambda w: jax.lax.all_gather(w, "data", axis=w.ndim - 1), layer),
    lambda layer: jax.tree.map(lambda w: jax.lax.all_gather(w, "data"), layer),
], ids=["last-axis", "axis-0"])
def test_12_2_untiled_gather_is_named_as_stacked(answer):
    feedback = check("12.2", answer)
    assert not feedback
    assert "stacked along a new axis" in feedback.message and "tiled" in feedback.message, feedback.message


def test_12_2_device_count_written_in_works_on_8_not_on_4():
    def eight(layer):
        def whole(w):
            slices = jax.lax.all_gather(w, "data")                     # (n, *w.shape)
            return jnp.moveaxis(slices, 0, -2).reshape(w.shape[:-1] + (8 * w.shape[-1],))
        return jax.tree.map(whole, layer)
    feedback = check("12.2", eight)
    assert not feedback
    assert "on 4 devices" in feedback.message and "assumes a number of devices" in feedback.message, feedback.message


def test_12_3_a_count_per_layer_is_named_not_taken_for_the_checkpoint():
    feedback = check("12.3", lambda n, k: {"all-gather": 2 * k, "reduce-scatter": k, "all-reduce": 1})
    assert not feedback
    assert "one layer's collectives" in feedback.message and "Half" not in feedback.message, feedback.message
    # without the backward's gathers it is still the checkpoint that is named
    feedback = check("12.3", lambda n, k: {"all-gather": n * k, "reduce-scatter": n * k, "all-reduce": 1})
    assert "Half the all-gathers" in feedback.message and "one layer's" not in feedback.message, feedback.message


def test_12_3_accepts_jax_integer_scalars_not_jax_floats_with_a_fraction():
    assert check("12.3", lambda n, k: {"all-gather": jnp.int32(2 * n * k), "reduce-scatter": jnp.asarray(n * k),
                                        "all-reduce": jnp.int32(1)})
    feedback = check("12.3", lambda n, k: {"all-gather": jnp.float32(2 * n * k + 0.5), "reduce-scatter": n * k,
                                           "all-reduce": 1})
    assert not feedback and "whole number" in feedback.message, feedback.message


def test_12_2_a_layer_edited_in_place_is_named_not_misread():
    def in_place(layer):
        for key in layer:
            layer[key] = jax.lax.all_gather(layer[key], "data", axis=-1, tiled=True)
        return layer
    feedback = check("12.2", in_place)
    assert not feedback and "in place" in feedback.message and "still split" not in feedback.message, \
        feedback.message


def test_12_2_leaves_that_are_not_arrays_are_named():
    feedback = check("12.2", lambda layer: {key: 0 for key in layer})
    assert not feedback and "not an array" in feedback.message and "AttributeError" not in feedback.message, \
        feedback.message
