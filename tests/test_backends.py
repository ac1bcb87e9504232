"""course_lib.training backends: pmap, jit(shard_map) and sharded jit compute the same training."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from course_lib import data, sharding, training


def mse(params, batch, key):
    pred = batch["x"] @ params["w"] + params["b"]
    return training.masked_mean((pred - batch["y"]) ** 2, batch.get("mask"))


def train(backend, loss_fn, params, optimizer, batches, steps, has_aux=False):
    state = training.init_state(params, optimizer, jax.random.key(0), backend=backend)
    step = training.make_train_step(loss_fn, optimizer, backend=backend, has_aux=has_aux)
    state, history = training.fit(step, state, batches(), num_steps=steps, progress=False)
    return state, [h["loss"] for h in history["train"]]


def test_three_backends_give_the_same_parameters_after_100_steps():
    x, y, true = data.regression_data(n=512)
    zero = {"w": jnp.zeros(3), "b": jnp.float32(0.0)}
    results = {b: train(b, mse, zero, optax.sgd(0.1), lambda: data.batches(x, y, 64, epochs=None), 100)
               for b in training.BACKENDS}
    ref_params = sharding.unreplicate(results["pmap"][0].params)
    for backend in ("shard_map", "jit"):
        state, losses = results[backend]
        params = sharding.unreplicate(state.params)
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(losses, results["pmap"][1], rtol=1e-5, atol=1e-7)
        assert state.params["w"].shape == (3,), "no stacked device axis outside pmap"
        assert state.params["w"].sharding.is_fully_replicated
        assert training.replicas_identical(state.params)


def _digits_mlp(dropout):
    x_train, y_train, _, _ = data.digits()
    keys = jax.random.split(jax.random.key(1))
    params = [{"w": jax.random.normal(keys[0], (64, 32)) * 0.2, "b": jnp.zeros(32)},
              {"w": jax.random.normal(keys[1], (32, 10)) * 0.2, "b": jnp.zeros(10)}]

    def loss(p, batch, key):
        h = jax.nn.relu(batch["x"] @ p[0]["w"] + p[0]["b"])
        if dropout:
            h = jnp.where(jax.random.bernoulli(key, 0.8, h.shape), h / 0.8, 0.0)
        ce = optax.softmax_cross_entropy_with_integer_labels(h @ p[1]["w"] + p[1]["b"], batch["y"])
        return training.masked_mean(ce, batch["mask"])

    # 300 rows in batches of 128: the third batch has 44 real rows, so the devices hold 16, 16, 12, 0, ... of them
    batches = lambda: data.batches(x_train[:300], y_train[:300], 128, epochs=None, remainder="pad")  # noqa: E731
    return loss, params, batches


def test_three_backends_agree_with_padding_on_uneven_devices():
    loss, params, batches = _digits_mlp(dropout=False)
    losses = {b: train(b, loss, params, optax.adam(1e-3), batches, 8)[1] for b in training.BACKENDS}
    for backend in ("shard_map", "jit"):
        np.testing.assert_allclose(losses[backend], losses["pmap"], rtol=1e-5)


def test_per_device_backends_agree_with_dropout_keys_and_padding():
    loss, params, batches = _digits_mlp(dropout=True)
    losses = {b: train(b, loss, params, optax.adam(1e-3), batches, 8)[1] for b in ("pmap", "shard_map")}
    np.testing.assert_allclose(losses["shard_map"], losses["pmap"], rtol=1e-4)


def test_jit_backend_gives_the_global_batch_one_new_key_per_step():
    seen = []

    def loss(params, batch, key):
        seen.append(batch["x"].shape)
        return jnp.sum(params["w"]) * 0.0, {"noise": jax.random.uniform(key)}

    x, y, _ = data.regression_data(n=256)
    opt = optax.sgd(0.1)
    state = training.init_state({"w": jnp.zeros(3), "b": jnp.float32(0.0)}, opt, jax.random.key(0), backend="jit")
    step = training.make_train_step(loss, opt, has_aux=True, backend="jit")
    batches = data.batches(x, y, 64, epochs=None)
    state, m1 = step(state, next(batches))
    state, m2 = step(state, next(batches))
    assert seen == [(64, 3)], "traced once, on the whole global batch (64, 3), not on one device's (8, 3)"
    assert m1["noise"].shape == () and float(m1["noise"]) != float(m2["noise"]), "a new key each step"


def test_jit_backend_has_the_compiler_insert_the_all_reduce():
    x, y, _ = data.regression_data(n=128)
    opt = optax.sgd(0.1)
    state = training.init_state({"w": jnp.zeros(3), "b": jnp.float32(0.0)}, opt, jax.random.key(0), backend="jit")
    step = training.make_train_step(mse, opt, backend="jit")
    hlo = step.lower(state, next(data.batches(x, y, 64))).compile().as_text()
    assert "all-reduce" in hlo


def test_jit_backend_compiles_the_plain_jit_step():
    """A mean loss: one all-reduce, of the gradients and the loss together, as for lesson 07's jit_step."""
    def mean_loss(params, batch, key):
        return jnp.mean((batch["x"] @ params["w"] + params["b"] - batch["y"]) ** 2)

    x, y, _ = data.regression_data(n=128)
    opt = optax.sgd(0.1)
    state = training.init_state({"w": jnp.zeros(3), "b": jnp.float32(0.0)}, opt, jax.random.key(0), backend="jit")
    hlo = training.make_train_step(mean_loss, opt, backend="jit").lower(state, next(data.batches(x, y, 64)))
    hlo = hlo.compile().as_text()
    reduces = [line for line in hlo.splitlines() if " all-reduce(" in line or " all-reduce-start(" in line]
    assert len(reduces) == 1 and "f32[3]" in reduces[0], reduces
    assert " all-gather(" not in hlo and " all-to-all(" not in hlo, "merging (n, B // n) into (B,) moves no rows"
    # A masked mean also sums the real rows over the devices (its denominator) before the gradients: two.
    hlo = training.make_train_step(mse, opt, backend="jit").lower(state, next(data.batches(x, y, 64)))
    assert sum(" all-reduce(" in line for line in hlo.compile().as_text().splitlines()) == 2


def test_unknown_backend():
    with pytest.raises(ValueError, match=r"backend must be one of \('pmap', 'shard_map', 'jit'\), got 'tpu'"):
        training.make_train_step(mse, optax.sgd(0.1), backend="tpu")
    with pytest.raises(ValueError, match="backend must be one of"):
        training.init_state({}, optax.sgd(0.1), jax.random.key(0), backend="vmap")


def test_mesh_helpers(devices):
    mesh = sharding.device_mesh()
    rep = sharding.replicate_on_mesh({"w": jnp.ones(3)}, mesh)
    assert rep["w"].shape == (3,) and rep["w"].sharding.is_fully_replicated and len(rep["w"].devices()) == 8
    split = sharding.shard_on_mesh(jnp.arange(16.0), mesh)
    assert [s.data.shape for s in split.addressable_shards] == [(2,)] * 8
    np.testing.assert_array_equal(sharding.unreplicate(rep)["w"], np.ones(3))
    with pytest.raises(ValueError, match="must divide across the 8 devices"):
        sharding.shard_on_mesh(jnp.arange(12.0), mesh)
