"""Numbers under faults: training never goes NaN silently, max_divergence sees NaN, and the collectives'
NumPy references keep JAX's dtypes (checked against the real collectives)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from course_lib import collectives as C, data, sharding, training

N = 8
CAUSES = ["learning rate is too high", "NaN or inf in the data", "zero denominator", "allow_nonfinite=True"]


def loss_fn(params, batch, key):
    return training.masked_mean((batch["x"] @ params["w"] + params["b"] - batch["y"]) ** 2, batch["mask"])


def params():
    return {"w": jnp.zeros(3), "b": jnp.float32(0.0)}


def nan_at_step(bad_step, batch_size=64, n_batches=12):
    """Regression data whose batch number ``bad_step`` (1-based, unshuffled) holds a NaN."""
    x, y, _ = data.regression_data(n=batch_size * n_batches)
    x[(bad_step - 1) * batch_size + 5, 1] = np.nan
    return x, y


@pytest.mark.parametrize("backend", training.BACKENDS)
@pytest.mark.parametrize("steps_per_call", [1, 5])
def test_fit_stops_at_the_first_nan_step_and_names_it(devices, backend, steps_per_call):
    x, y = nan_at_step(7)
    state = training.init_state(params(), optax.sgd(0.1), jax.random.key(0), backend=backend)
    step = training.make_train_step(loss_fn, optax.sgd(0.1), backend=backend)
    with pytest.raises(training.TrainingDiverged) as e:
        training.fit(step, state, data.batches(x, y, 64, n_devices=N, shuffle=False), steps_per_call=steps_per_call,
                     progress=False)
    assert isinstance(e.value, FloatingPointError)
    message = str(e.value)
    assert "fit: the loss of step 7 is nan (not finite)" in message
    assert all(c in message for c in CAUSES), message
    assert e.value.step == 7 and e.value.name == "loss" and math.isnan(e.value.value)
    assert [h["step"] for h in e.value.history["train"]][:6] == [1, 2, 3, 4, 5, 6]
    assert all(math.isfinite(h["loss"]) for h in e.value.history["train"][:6])


def test_a_learning_rate_too_high_is_caught_where_the_loss_overflows(devices):
    x, y, _ = data.regression_data(n=4096)
    state = training.init_state(params(), optax.sgd(1e4), jax.random.key(0))
    step = training.make_train_step(loss_fn, optax.sgd(1e4))
    with pytest.raises(training.TrainingDiverged, match="learning rate is too high") as e:
        training.fit(step, state, data.batches(x, y, 64, n_devices=N, epochs=None), num_steps=200, progress=False)
    losses = [h["loss"] for h in e.value.history["train"]]
    assert 1 < e.value.step < 200 and all(math.isfinite(v) for v in losses[:-1]) and not math.isfinite(losses[-1])


def test_a_non_finite_metric_is_named(devices):
    def with_ratio(p, batch, key):
        loss = loss_fn(p, batch, key)
        return loss, {"ratio": jnp.sum(batch["mask"]) / jnp.float32(0.0)}   # a zero denominator: inf

    x, y, _ = data.regression_data(n=256)
    state = training.init_state(params(), optax.sgd(0.1), jax.random.key(0))
    step = training.make_train_step(with_ratio, optax.sgd(0.1), has_aux=True)
    with pytest.raises(training.TrainingDiverged, match=r"fit: the ratio of step 1 is inf \(not finite\)"):
        training.fit(step, state, data.batches(x, y, 64, n_devices=N), progress=False)


def test_allow_nonfinite_trains_on_and_records_it(devices):
    x, y = nan_at_step(2, n_batches=4)
    state = training.init_state(params(), optax.sgd(0.1), jax.random.key(0))
    step = training.make_train_step(loss_fn, optax.sgd(0.1))
    _, history = training.fit(step, state, data.batches(x, y, 64, n_devices=N, shuffle=False),
                              allow_nonfinite=True, progress=False)
    losses = [h["loss"] for h in history["train"]]
    assert len(losses) == 4 and math.isfinite(losses[0]) and all(math.isnan(v) for v in losses[1:])


def _copies(blocks):
    """A (n, ...) array whose device i holds blocks[i] (so the copies can differ, as after a bug)."""
    devs = jax.devices()[:len(blocks)]
    mesh = sharding.device_mesh(devs)
    spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(sharding.DEVICE_AXIS))
    return jax.make_array_from_single_device_arrays((len(blocks),) + np.shape(blocks[0]), spec,
                                                    [jax.device_put(np.asarray(b)[None], d)
                                                     for b, d in zip(blocks, devs)])


def test_max_divergence_reports_nan_and_inf(devices):
    same = _copies([np.ones(3, np.float32)] * 4)
    assert training.max_divergence({"w": same}) == 0.0
    one_nan = _copies([np.ones(3, np.float32)] * 3 + [np.array([1, np.nan, 1], np.float32)])
    assert math.isnan(training.max_divergence({"a": same, "w": one_nan}))
    first_nan = _copies([np.array([np.nan, 1, 1], np.float32)] + [np.ones(3, np.float32)] * 3)
    assert math.isnan(training.max_divergence(first_nan))
    all_nan = _copies([np.array([np.nan, 1, 1], np.float32)] * 4)
    assert math.isnan(training.max_divergence(all_nan)), "NaN on every copy is not 'no difference'"
    one_inf = _copies([np.ones(3, np.float32)] * 3 + [np.array([1, np.inf, 1], np.float32)])
    assert training.max_divergence(one_inf) == math.inf
    apart = _copies([np.zeros(2, np.float32), np.array([0, 0.5], np.float32)])
    assert training.max_divergence(apart) == 0.5


@pytest.mark.parametrize("backend", training.BACKENDS)
def test_max_divergence_and_replicas_identical_read_typed_keys(devices, backend):
    state = training.init_state(params(), optax.adam(1e-3), jax.random.key(0), backend=backend)
    assert jnp.issubdtype(state.key.dtype, jax.dtypes.prng_key)
    assert training.max_divergence(state) == 0.0 and training.replicas_identical(state)


def test_max_divergence_sees_different_keys(devices):
    keys = [jax.random.key_data(jax.random.key(0))] * 3 + [jax.random.key_data(jax.random.key(1))]
    raw = _copies([np.asarray(k) for k in keys])
    typed = jax.random.wrap_key_data(raw)
    assert jnp.issubdtype(typed.dtype, jax.dtypes.prng_key)
    assert training.max_divergence({"key": typed}) > 0 and not training.replicas_identical({"key": typed})


def test_max_divergence_rejects_host_values():
    with pytest.raises(TypeError, match=r"max_divergence: tree must hold arrays on the devices, but leaf \['w'\] is "
                                        r"a ndarray\. Pass the replicated state"):
        training.max_divergence({"w": np.zeros(3)})


def pmapped(f):
    return lambda xs: np.asarray(jax.pmap(f, axis_name="i")(xs))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.int32, np.int64, np.float16, np.float32,
                                   np.bool_])
def test_references_keep_jax_dtypes(devices, dtype):
    rng = np.random.default_rng(0)
    if dtype == np.bool_:
        xs = rng.random((N, 3)) > 0.5
    elif np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        xs = rng.integers(max(info.min, -10**6), min(info.max, 10**6), size=(N, 3), endpoint=True).astype(dtype)
    else:
        xs = rng.normal(size=(N, 3)).astype(dtype) * 100
    for name, ref, real in [
        ("psum", C.psum, lambda x: jax.lax.psum(x, "i")),
        ("pmean", C.pmean, lambda x: jax.lax.pmean(x, "i")),
        ("pmax", C.pmax, lambda x: jax.lax.pmax(x, "i")),
        ("pmin", C.pmin, lambda x: jax.lax.pmin(x, "i")),
        ("all_gather", C.all_gather, lambda x: jax.lax.all_gather(x, "i")),
    ]:
        if dtype == np.bool_ and name in ("pmax", "pmin", "pmean"):
            continue
        got, want = pmapped(real)(xs), ref(xs)
        assert want.dtype == got.dtype, f"{name} of {np.dtype(dtype).name}: reference {want.dtype}, JAX {got.dtype}"
        if np.issubdtype(got.dtype, np.floating):
            np.testing.assert_allclose(want, got, rtol=2e-3 if dtype == np.float16 else 1e-6, err_msg=name)
        else:
            np.testing.assert_array_equal(want, got, err_msg=name)


def test_an_int8_psum_wraps_around_as_jax_does(devices):
    xs = np.full((N, 2), 100, np.int8)                  # 8 x 100 = 800, which int8 holds as 800 - 3 x 256 = 32
    got = pmapped(lambda x: jax.lax.psum(x, "i"))(xs)
    assert got.dtype == np.int8 and (got == 32).all()
    np.testing.assert_array_equal(C.psum(xs), got)
    np.testing.assert_array_equal(C.pmean(xs), pmapped(lambda x: jax.lax.pmean(x, "i"))(xs))  # 32 / 8 = 4.0
    assert C.pmean(xs).dtype == np.float32 and (C.pmean(xs) == 4.0).all()
