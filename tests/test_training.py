"""course_lib.training on 8 simulated devices: correctness of the data-parallel step, and a bounded fit."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from course_lib import data, diagrams, sharding, training


def mse(params, batch, key):
    pred = batch["x"] @ params["w"] + params["b"]
    return training.masked_mean((pred - batch["y"]) ** 2, batch.get("mask"))


ZERO = {"w": jnp.zeros(3), "b": jnp.float32(0.0)}


def run_data_parallel(steps, lr=0.1, seed=0, devices=None):
    x, y, _ = data.regression_data(n=512, seed=seed)
    opt = optax.sgd(lr)
    n = len(devices) if devices else jax.local_device_count()
    state = training.init_state(ZERO, opt, jax.random.key(0), devices=devices)
    step = training.make_train_step(mse, opt, devices=devices)
    state, history = training.fit(step, state, data.batches(x, y, 64, n_devices=n, epochs=None), num_steps=steps,
                                  progress=False)
    return state, history


def test_linear_regression_recovers_the_true_weights():
    x, y, true = data.regression_data(n=512)
    state, history = run_data_parallel(300)
    params = sharding.unreplicate(state.params)
    np.testing.assert_allclose(params["w"], true["w"], atol=0.02)
    np.testing.assert_allclose(params["b"], true["b"], atol=0.02)
    assert history["train"][-1]["loss"] < 0.02 < history["train"][0]["loss"]


def test_parameters_stay_bit_identical_on_every_device():
    state, _ = run_data_parallel(50)
    assert training.replicas_identical(state.params) and training.replicas_identical(state.opt_state)
    assert training.max_divergence(state.params) == 0.0


def test_data_parallel_equals_single_device_training_on_the_same_global_batches():
    x, y, _ = data.regression_data(n=512)
    opt = optax.sgd(0.1)
    params, opt_state = ZERO, opt.init(ZERO)
    for batch, _ in zip(data.batches(x, y, 64, n_devices=8, epochs=None), range(40)):
        whole = jax.tree.map(lambda a: a.reshape((-1,) + a.shape[2:]), batch)
        grads = jax.grad(mse)(params, whole, None)
        updates, opt_state = opt.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    state, _ = run_data_parallel(40)
    dp = sharding.unreplicate(state.params)
    for a, b in zip(jax.tree.leaves(dp), jax.tree.leaves(params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_same_global_batch_on_2_4_8_devices_gives_the_same_model():
    results = [sharding.unreplicate(run_data_parallel(30, devices=jax.devices()[:k])[0].params) for k in (2, 4, 8)]
    for other in results[1:]:
        np.testing.assert_allclose(other["w"], results[0]["w"], rtol=1e-5, atol=1e-6)


def test_padding_counts_for_nothing():
    """A padded batch gives the same gradient step as the same real examples alone."""
    x, y, _ = data.regression_data(n=40)
    opt = optax.sgd(0.1)
    step = training.make_train_step(mse, opt)
    padded = next(data.batches(x[:10], y[:10], 16, n_devices=8, remainder="pad", shuffle=False))
    state = training.init_state(ZERO, opt, jax.random.key(0))
    after, metrics = step(state, padded)
    grads = jax.grad(mse)(ZERO, {"x": x[:10], "y": y[:10]}, None)
    expected = jax.tree.map(lambda p, g: p - 0.1 * g, ZERO, grads)
    got = sharding.unreplicate(after.params)
    np.testing.assert_allclose(got["w"], expected["w"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(metrics["loss"][0]), float(mse(ZERO, {"x": x[:10], "y": y[:10]}, None)),
                               rtol=1e-5)


def test_each_device_gets_a_different_key_every_step():
    def loss_with_noise(params, batch, key):
        return jnp.sum(params["w"]) * 0.0, {"noise": jax.random.uniform(key)}

    opt = optax.sgd(0.0)
    state = training.init_state(ZERO, opt, jax.random.key(0))
    step = jax.pmap(lambda s, b: (jax.random.fold_in(jax.random.fold_in(s.key, s.step),
                                                     jax.lax.axis_index(training.AXIS))), axis_name=training.AXIS)
    keys = step(state, None)
    values = {float(jax.random.uniform(jax.random.wrap_key_data(k))) for k in jax.random.key_data(keys)}
    assert len(values) == 8
    train = training.make_train_step(loss_with_noise, opt, has_aux=True)
    batch = {"x": np.zeros((8, 1, 3), np.float32), "y": np.zeros((8, 1), np.float32)}
    s1, m1 = train(state, batch)
    _, m2 = train(s1, batch)
    assert float(m1["noise"][0]) != float(m2["noise"][0]), "a new key each step"


@pytest.mark.timeout(120)
def test_a_1000_step_fit_finishes_without_hanging():
    start = time.monotonic()
    state, history = run_data_parallel(1000)
    assert len(history["train"]) == 1000 and [h["step"] for h in history["train"][:3]] == [1, 2, 3]
    assert int(sharding.unreplicate(state.step)) == 1000
    assert time.monotonic() - start < 100


class Recorder:
    """A stand-in step that records what fit does: which steps it dispatched and which results it read back.

    Every metric holds the number of its step, so a read tells which steps it waited for.
    """

    def __init__(self, fusable):
        self.dispatched, self.read, self.calls, self.worst_ahead = 0, 0, [], 0
        if fusable:
            self.steps = self._steps

    def _record(self, k):
        self.calls.append(k)
        first = self.dispatched + 1
        self.dispatched += k
        self.worst_ahead = max(self.worst_ahead, self.dispatched - self.read)
        return first

    def __call__(self, state, batch):
        assert np.shape(batch["x"]) == (8, 1, 1)
        return state, {"loss": jnp.full(8, float(self._record(1)))}

    def _steps(self, state, batches):
        assert all(np.shape(b["x"]) == (8, 1, 1) for b in batches)
        k = len(batches)
        first = self._record(k)
        return state, {"loss": jnp.tile(jnp.arange(first, first + k, dtype=jnp.float32), (8, 1))}

    def run(self, monkeypatch, steps, **kwargs):
        real_get = jax.device_get

        def device_get(tree):
            values = real_get(tree)
            self.read = max(self.read, int(np.max(values["loss"])))
            return values

        monkeypatch.setattr(jax, "device_get", device_get)
        state = sharding.replicate({"w": jnp.zeros(1)})
        return training.fit(self, state, [{"x": np.zeros((8, 1, 1))}] * steps, progress=False, **kwargs)


def test_fit_never_runs_more_than_max_ahead_steps_ahead_one_step_per_dispatch(monkeypatch):
    rec = Recorder(fusable=False)
    _, history = rec.run(monkeypatch, 95, steps_per_call=10, max_ahead=7)
    assert rec.calls == [1] * 95, "a step without .steps runs one step per dispatch"
    assert rec.worst_ahead == 7
    assert [h["step"] for h in history["train"]] == list(range(1, 96))
    assert [h["loss"] for h in history["train"]] == [float(i) for i in range(1, 96)]


def test_fit_fuses_steps_per_call_and_keeps_one_dispatch_queued(monkeypatch):
    rec = Recorder(fusable=True)
    _, history = rec.run(monkeypatch, 95, steps_per_call=10, max_ahead=20, eval_fn=lambda s: {}, eval_every=45)
    # 4 fused calls up to the evaluation at step 45 and the 5 left over one at a time; the same up to 90; the last
    # 5 steps one at a time.
    assert rec.calls == [10] * 4 + [1] * 5 + [10] * 4 + [1] * 5 + [1] * 5
    assert rec.worst_ahead == 20, "the next dispatch is queued while the oldest is read"
    assert [h["step"] for h in history["train"]] == list(range(1, 96))
    assert [h["loss"] for h in history["train"]] == [float(i) for i in range(1, 96)], "per-step metrics, in order"
    assert [e["step"] for e in history["eval"]] == [45, 90, 95]


def test_fit_with_fused_steps_equals_one_step_per_dispatch():
    x, y, _ = data.regression_data(n=512)
    opt = optax.adam(0.05)
    results = {}
    for k in (1, 10):
        state = training.init_state(ZERO, opt, jax.random.key(0))
        step = training.make_train_step(mse, opt)
        results[k] = training.fit(step, state, data.batches(x, y, 64, epochs=None), num_steps=25,
                                  steps_per_call=k, progress=False)
    (s1, h1), (s10, h10) = results[1], results[10]
    np.testing.assert_allclose([h["loss"] for h in h10["train"]], [h["loss"] for h in h1["train"]], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(s10.params), jax.tree.leaves(s1.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert int(sharding.unreplicate(s10.step)) == 25


@pytest.mark.parametrize("backend", ["pmap", "shard_map"])
def test_device_step_sends_everything_in_one_all_reduce(backend):
    """Gradients of 2 leaves, the loss, a metric and the example count: one all-reduce in the compiled step."""
    opt = optax.sgd(0.1)

    def loss_with_metric(params, batch, key):
        loss = mse(params, batch, key)
        return loss, {"rmse": jnp.sqrt(loss)}

    x, y, _ = data.regression_data(n=64)
    state = training.init_state(ZERO, opt, jax.random.key(0), backend=backend)
    step = training.make_train_step(loss_with_metric, opt, has_aux=True, backend=backend)
    hlo = step.lower(state, next(data.batches(x, y, 64))).compile().as_text()
    assert hlo.count(" all-reduce(") == 1, hlo


def test_device_step_reduce_changes_only_the_communication():
    """reduce= swaps how the sums cross the devices: one psum per leaf trains the same; keeping each device's own
    sums (bench's step without its all-reduce) lets the replicas drift apart; a wrong value is named."""
    x, y, _ = data.regression_data(n=256)
    opt = optax.sgd(0.1)
    batch = next(data.batches(x, y, 64))
    per_leaf = lambda t, a: jax.tree.map(lambda v: jax.lax.psum(v, a), t)           # noqa: E731
    results = {}
    for name, reduce in [("default", None), ("per_leaf", per_leaf), ("local", lambda t, a: t)]:
        step = jax.pmap(training.device_step(mse, opt, reduce=reduce), axis_name=training.AXIS)
        results[name], _ = step(training.init_state(ZERO, opt, jax.random.key(0)), batch)
    np.testing.assert_allclose(results["per_leaf"].params["w"], results["default"].params["w"], rtol=1e-6)
    assert training.replicas_identical(results["default"].params)
    assert not training.replicas_identical(results["local"].params)
    with pytest.raises(TypeError, match=r"^device_step: reduce must be a function .*got 'psum'"):
        training.device_step(mse, opt, reduce="psum")


def test_psum_bucketed_equals_psum_per_leaf():
    tree = {"a": jnp.arange(16.0).reshape(8, 2), "b": jnp.arange(8.0), "c": jnp.ones((8, 2, 3), jnp.bfloat16)}
    bucketed = jax.pmap(lambda t: training.psum_bucketed(t, "i"), axis_name="i")(tree)
    per_leaf = jax.pmap(lambda t: jax.tree.map(lambda v: jax.lax.psum(v, "i"), t), axis_name="i")(tree)
    for k in tree:
        assert bucketed[k].dtype == tree[k].dtype and bucketed[k].shape == tree[k].shape
        np.testing.assert_array_equal(np.asarray(bucketed[k], np.float32), np.asarray(per_leaf[k], np.float32))


def test_mlp_on_digits_reaches_95_percent(tmp_path):
    x_train, y_train, x_test, y_test = data.digits()
    sizes = (64, 128, 10)
    keys = jax.random.split(jax.random.key(1), 2)
    params = [{"w": jax.random.normal(k, (a, b)) * jnp.sqrt(2.0 / a), "b": jnp.zeros(b)}
              for k, a, b in zip(keys, sizes[:-1], sizes[1:])]

    def forward(p, x, key=None):
        h = jax.nn.relu(x @ p[0]["w"] + p[0]["b"])
        if key is not None:
            h = jnp.where(jax.random.bernoulli(key, 0.8, h.shape), h / 0.8, 0.0)
        return h @ p[1]["w"] + p[1]["b"]

    def loss(p, batch, key):
        logits = forward(p, batch["x"], key)
        return training.masked_mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]),
                                    batch["mask"])

    opt = optax.adam(1e-3)
    state = training.init_state(params, opt, jax.random.key(2))

    def accuracy(s):
        p = sharding.unreplicate(s.params)
        return {"accuracy": float(jnp.mean(forward(p, x_test).argmax(-1) == y_test))}

    state, history = training.fit(training.make_train_step(loss, opt), state,
                                  data.batches(x_train, y_train, 128, epochs=None, remainder="pad"),
                                  num_steps=400, eval_fn=accuracy, eval_every=200, progress=False)
    assert [e["step"] for e in history["eval"]] == [200, 400]
    assert history["eval"][-1]["accuracy"] >= 0.95


@pytest.mark.parametrize("kwargs, error, message", [
    ({"num_steps": 0}, ValueError, "num_steps must be a whole number >= 1"),
    ({"steps_per_call": 0}, ValueError, "steps_per_call must be a whole number >= 1"),
    ({"steps_per_call": 10, "max_ahead": 5}, ValueError, r"max_ahead must be a whole number >= steps_per_call \(10\)"),
    ({"max_ahead": True}, TypeError, "max_ahead must be a whole number"),
    ({"eval_every": 5}, ValueError, "eval_every needs an eval_fn"),
])
def test_fit_rejects_bad_settings(kwargs, error, message):
    state = training.init_state(ZERO, optax.sgd(0.1), jax.random.key(0))
    with pytest.raises(error, match=message):
        training.fit(training.make_train_step(mse, optax.sgd(0.1)), state, [], progress=False, **kwargs)


def test_fit_rejects_bad_batches():
    opt = optax.sgd(0.1)
    state = training.init_state(ZERO, opt, jax.random.key(0))
    step = training.make_train_step(mse, opt)
    x, y, _ = data.regression_data(n=64)
    with pytest.raises(ValueError, match="fit got no batches: the iterable was empty"):
        training.fit(step, state, [], progress=False)
    with pytest.raises(ValueError, match=r"batch leaf \['x'\] has shape \(30, 3\).*replicated on 8 devices"):
        training.fit(step, state, [{"x": x[:30], "y": y[:30]}], progress=False)
    mismatched = {"x": x[:16].reshape(8, 2, 3), "y": y[:24].reshape(8, 3)}
    with pytest.raises(ValueError, match="inputs and labels must have the same number of examples"):
        training.fit(step, state, [mismatched], progress=False)
    with pytest.raises(TypeError, match="batches must be an iterable"):
        training.fit(step, state, 42, progress=False)


def test_masked_mean():
    values = jnp.array([[1.0, 1.0], [3.0, 3.0], [100.0, 100.0]])
    assert float(training.masked_mean(values, jnp.array([True, True, False]))) == 2.0
    assert float(training.masked_mean(values, jnp.zeros(3, bool))) == 0.0
    assert float(training.masked_mean(jnp.array([1.0, 3.0]))) == 2.0


def test_train_step_diagram_shapes(devices):
    x, y, _ = data.regression_data(n=128)
    batch = next(data.batches(x, y, 128))
    g = diagrams.train_step(mse, ZERO, batch, optimizer_name="SGD", devices_shown=8)
    assert g.source.count("forward + backward") == 8 and g.source.count("SGD update") == 8
    assert "mask bool[16]\\nx f32[16,3]\\ny f32[16]" in g.source and "4 parameters" in g.source
    assert g.source.count("-> mean") == 8 and g.source.count("mean -> update") == 8


def test_device_step_fused_with_scan_equals_one_step_at_a_time():
    x, y, _ = data.regression_data(n=256)
    opt = optax.sgd(0.1)
    batches = [b for b, _ in zip(data.batches(x, y, 64, epochs=None), range(4))]
    state = training.init_state(ZERO, opt, jax.random.key(0))
    one_by_one = training.make_train_step(mse, opt)
    s1 = training.init_state(ZERO, opt, jax.random.key(0))   # the step donates it: state stays for the fused run
    for b in batches:
        s1, _ = one_by_one(s1, b)
    fused = jax.pmap(lambda s, chunk: jax.lax.scan(training.device_step(mse, opt), s, chunk), axis_name=training.AXIS)
    stacked = jax.tree.map(lambda *a: np.stack(a, axis=1), *batches)          # (n, K, b, ...)
    s2, metrics = fused(state, stacked)
    assert metrics["loss"].shape == (8, 4)
    np.testing.assert_allclose(sharding.unreplicate(s2.params)["w"], sharding.unreplicate(s1.params)["w"], rtol=1e-6)


# allreduce= (how the gradients cross the devices) and loss_reduction= (a summed loss), lesson 09 section 3.

def _all_reduces(step, state, batch):
    hlo = step.lower(state, batch).compile().as_text()
    return [line.split(" all-reduce(")[0].split(" = ", 1)[1] for line in hlo.splitlines() if " all-reduce(" in line]


def _sum_mse(params, batch, key):
    pred = batch["x"] @ params["w"] + params["b"]
    return jnp.sum(jnp.where(batch["mask"], (pred - batch["y"]) ** 2, 0.0))


def _padded_batches():
    x, y, _ = data.regression_data(n=200)
    return [b for b, _ in zip(data.batches(x, y, 64, remainder="pad", epochs=None), range(8))]


@pytest.mark.parametrize("backend", ["pmap", "shard_map"])
def test_allreduce_auto_is_one_buffer_on_cpu_and_per_leaf_is_one_psum_per_gradient(backend):
    opt = optax.adam(0.05)
    batches = _padded_batches()
    assert min(int(b["mask"].sum()) for b in batches) < 64, "a padded batch, so that the weights matter"
    losses = {}
    for allreduce in ("auto", "one_buffer", "per_leaf"):
        step = training.make_train_step(mse, opt, backend=backend, allreduce=allreduce)
        state = training.init_state(ZERO, opt, jax.random.key(0), backend=backend)
        reduces = _all_reduces(step, state, batches[0])
        if allreduce == "per_leaf":
            # w, b, the loss and the count: one psum each, which XLA's combiner merges into one tuple
            assert len(reduces) == 1 and reduces[0].startswith("(") and reduces[0].count("f32") == 4, reduces
        else:
            assert len(reduces) == 1 and reduces[0].startswith("f32[6]"), reduces      # w (3), b, loss, count
        _, history = training.fit(step, state, batches, progress=False)
        losses[allreduce] = [h["loss"] for h in history["train"]]
    np.testing.assert_allclose(losses["per_leaf"], losses["one_buffer"], rtol=1e-5)
    assert losses["auto"] == losses["one_buffer"]


def test_allreduce_is_checked_and_names_the_fix():
    with pytest.raises(ValueError, match=r"allreduce must be one of \('auto', 'one_buffer', 'per_leaf'\), got 'flat'"):
        training.make_train_step(mse, optax.sgd(0.1), allreduce="flat")
    with pytest.raises(ValueError, match=r"applies to the 'pmap' and 'shard_map' backends.*backend='shard_map'"):
        training.make_train_step(mse, optax.sgd(0.1), backend="jit", allreduce="one_buffer")
    with pytest.raises(ValueError, match=r"loss_reduction must be 'mean' .* or 'sum' .*got 'total'"):
        training.make_train_step(mse, optax.sgd(0.1), loss_reduction="total")
    with pytest.raises(ValueError, match=r"^device_step: loss_reduction"):
        training.device_step(mse, optax.sgd(0.1), loss_reduction=None)


def test_a_summed_loss_trains_the_same_on_every_backend_and_jit_sends_one_all_reduce():
    opt = optax.adam(0.05)
    batches = _padded_batches()
    losses = {}
    for backend in training.BACKENDS:
        for reduction, fn in (("mean", mse), ("sum", _sum_mse)):
            step = training.make_train_step(fn, opt, backend=backend, loss_reduction=reduction)
            state = training.init_state(ZERO, opt, jax.random.key(0), backend=backend)
            reduces = _all_reduces(step, state, batches[0])
            if backend == "jit":
                # a mean over the global batch needs the count of real rows first; a sum sends it with the gradients
                assert len(reduces) == (2 if reduction == "mean" else 1), reduces
            else:
                assert len(reduces) == 1, reduces
            state, history = training.fit(step, state, batches, progress=False)
            losses[backend, reduction] = [h["loss"] for h in history["train"]]
            params = sharding.unreplicate(state.params) if backend == "pmap" else state.params
            losses[backend, reduction, "w"] = np.asarray(params["w"])
    ref = losses["pmap", "mean"]
    for key, value in losses.items():
        if len(key) == 2:
            np.testing.assert_allclose(value, ref, rtol=2e-5, err_msg=str(key))
        else:
            np.testing.assert_allclose(value, losses["pmap", "mean", "w"], rtol=2e-5, atol=1e-6, err_msg=str(key))


def test_loss_reduction_sum_without_a_mask_divides_by_the_rows():
    opt = optax.sgd(0.1)
    x, y, _ = data.regression_data(n=128)
    batch = {k: v for k, v in next(data.batches(x, y, 64)).items() if k != "mask"}

    def sum_plain(p, b, key):
        return jnp.sum((b["x"] @ p["w"] + p["b"] - b["y"]) ** 2)

    out = {}
    for backend in training.BACKENDS:
        for reduction, fn in (("mean", mse), ("sum", sum_plain)):
            step = training.make_train_step(fn, opt, backend=backend, loss_reduction=reduction, donate=False)
            state = training.init_state(ZERO, opt, jax.random.key(0), backend=backend)
            _, metrics = step(state, batch)
            out[backend, reduction] = float(np.asarray(metrics["loss"]).reshape(-1)[0])
    assert max(out.values()) - min(out.values()) < 1e-5 * max(out.values()), out
