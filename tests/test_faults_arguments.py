"""Wrong arguments to every public module of course_lib: each fails at once with a clear message.

Every case asserts the exception type and the words of its message: the module's function, the argument's
name, and the fix. None may come out as a raw IndexError, KeyError, ZeroDivisionError or AttributeError.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from course_lib import _checks, bench, collectives as C, data, devices as cdev, diagrams, distributed, errors
from course_lib import sharding, train_dp, training
from conftest import RAW, unclear_errors

X, Y = np.zeros((64, 3), np.float32), np.zeros(64, np.float32)
PARAMS = {"w": jnp.zeros(3), "b": jnp.float32(0.0)}


def loss_fn(params, batch, key):
    return training.masked_mean((batch["x"] @ params["w"] + params["b"] - batch["y"]) ** 2, batch["mask"])


def _mesh_named(name):
    return jax.sharding.Mesh(np.array(jax.devices()), (name,))


# (id, call, exception type, words the message must hold: the argument's name and the fix)
CASES = [
    # the shared checks
    ("whole-numpy-int-accepted", lambda: _checks.whole(np.int64(3), "n", "f") == 3 or 1 / 0, None, []),
    ("whole-bool", lambda: _checks.whole(True, "n", "f"), TypeError, ["f: n must be a whole number", "got True"]),
    ("whole-float-integral", lambda: _checks.whole(4.0, "n", "f"), TypeError, ["n must be a whole number",
                                                                                "Pass int(4.0) = 4"]),
    # sharding
    ("shard-different-batch-sizes", lambda: sharding.shard({"x": np.zeros((16, 3)), "y": np.zeros(8)}, 8),
     ValueError, ["shard: the leaves of tree must share one batch size", "'x'", "16", "8",
                  "cut or pad them to the same number of rows"]),
    ("shard-n-devices-zero", lambda: sharding.shard(np.zeros((8, 2)), 0), ValueError,
     ["shard: n_devices must be a whole number >= 1, got 0", "Pass n_devices=1 or more"]),
    ("shard-n-devices-float", lambda: sharding.shard(np.zeros((8, 2)), 2.0), TypeError,
     ["shard: n_devices must be a whole number", "int(2.0) = 2"]),
    ("shard-string-leaf", lambda: sharding.shard({"x": "abc"}, 8), TypeError,
     ["shard: leaf ['x'] is a str", "np.asarray"]),
    ("pad-batch-zero", lambda: sharding.pad_batch(np.zeros((5, 2)), 0), ValueError,
     ["pad_batch: multiple must be a whole number >= 1, got 0", "multiple=jax.local_device_count()"]),
    ("pad-batch-negative", lambda: sharding.pad_batch(np.zeros((5, 2)), -8), ValueError,
     ["pad_batch: multiple must be a whole number >= 1, got -8", "multiple=jax.local_device_count()"]),
    ("pad-batch-string", lambda: sharding.pad_batch(np.zeros((5, 2)), "8"), TypeError,
     ["pad_batch: multiple must be a whole number >= 1, got '8'", "multiple=jax.local_device_count()"]),
    ("pad-batch-bool", lambda: sharding.pad_batch(np.zeros((5, 2)), True), TypeError,
     ["pad_batch: multiple must be a whole number", "got True"]),
    ("shard-on-mesh-unknown-axis", lambda: sharding.shard_on_mesh(np.zeros((8, 2)), sharding.device_mesh(), "data"),
     ValueError, ["shard_on_mesh: axis must name an axis of the mesh, one of ('devices',), got 'data'",
                  "Pass axis='devices'"]),
    ("shard-on-mesh-not-a-mesh", lambda: sharding.shard_on_mesh(np.zeros((8, 2)), jax.devices()), TypeError,
     ["shard_on_mesh: mesh must be a jax.sharding.Mesh, got list", "device_mesh(devices)"]),
    ("replicate-on-mesh-not-a-mesh", lambda: sharding.replicate_on_mesh({"w": np.zeros(2)}, "mesh"), TypeError,
     ["replicate_on_mesh: mesh must be a jax.sharding.Mesh, got str", "device_mesh(devices)"]),
    ("device-mesh-empty", lambda: sharding.device_mesh([]), ValueError,
     ["device_mesh: devices must be a non-empty list of jax.Device, got []", "devices=jax.devices()"]),
    ("device-mesh-ints", lambda: sharding.device_mesh([0, 1, 2]), TypeError,
     ["device_mesh: devices must be a list of jax.Device", "not their indices"]),
    ("device-mesh-repeated", lambda: sharding.device_mesh([jax.devices()[0]] * 2), ValueError,
     ["device_mesh: devices must be a list of distinct devices", "Name each device once"]),
    ("replicate-non-array-leaf", lambda: sharding.replicate({"w": np.zeros(2), "name": "linear"}), TypeError,
     ["replicate: leaf ['name'] is a str", "every leaf must be an array or a number", "np.asarray"]),
    ("replicate-one-device", lambda: sharding.replicate({"w": np.zeros(2)}, jax.devices()[0]), TypeError,
     ["replicate: devices must be a list of jax.Device", "devices=[device]"]),
    ("replicate-device-ids", lambda: sharding.replicate({"w": np.zeros(2)}, [0, 1]), TypeError,
     ["replicate: devices must be a list of jax.Device", "not their indices"]),
    # data
    ("batches-n-devices-zero", lambda: data.batches(X, Y, 8, n_devices=0), ValueError,
     ["batches: n_devices must be a whole number >= 1, got 0", "Pass n_devices=1 or more"]),
    ("batches-n-devices-negative", lambda: data.batches(X, Y, 8, n_devices=-8), ValueError,
     ["batches: n_devices must be a whole number >= 1, got -8", "Pass n_devices=1 or more"]),
    ("batches-epochs-float", lambda: data.batches(X, Y, 8, n_devices=8, epochs=1.5), TypeError,
     ["batches: epochs must be a whole number >= 1, got 1.5", "or None to repeat forever"]),
    ("batches-epochs-zero", lambda: data.batches(X, Y, 8, n_devices=8, epochs=0), ValueError,
     ["batches: epochs must be a whole number >= 1, got 0", "or None to repeat forever"]),
    ("batches-none-data", lambda: data.batches(None, Y, 8, n_devices=8), TypeError,
     ["batches: x must be an array of examples", "got None", "Pass a NumPy array"]),
    ("batches-batch-size-string", lambda: data.batches(X, Y, "64", n_devices=8), TypeError,
     ["batches: batch_size must be a whole number >= 1, got '64'", "batch_size=64"]),
    ("num-batches-zero-batch", lambda: data.num_batches(100, 0), ValueError,
     ["num_batches: batch_size must be a whole number >= 1, got 0", "Pass batch_size=1 or more"]),
    ("num-batches-none", lambda: data.num_batches(None, 8), TypeError,
     ["num_batches: n_examples must be a whole number >= 0, got None"]),
    ("num-batches-remainder", lambda: data.num_batches(100, 8, "keep"), ValueError,
     ["num_batches: remainder must be one of 'drop', 'pad', got 'keep'", "remainder='drop'"]),
    ("unreplicate-string-leaf", lambda: sharding.unreplicate({"w": "abc"}), TypeError,
     ["unreplicate: leaf ['w'] is a str", "np.asarray"]),
    ("regression-data-zero", lambda: data.regression_data(n=0), ValueError,
     ["regression_data: n must be a whole number >= 1, got 0", "Pass n=1 or more"]),
    ("regression-data-noise", lambda: data.regression_data(noise=-1.0), ValueError,
     ["regression_data: noise must be a number >= 0, got -1.0", "noise=0.1"]),
    ("digits-fraction", lambda: data.digits(test_fraction=1.5), ValueError,
     ["digits: test_fraction must be a fraction strictly between 0 and 1, got 1.5", "test_fraction=0.2"]),
    ("launcher-output-before-start", lambda: distributed.Launcher(2, 2).output(0), ValueError,
     ["Launcher.output: pid must be a started worker's index", "Call start() first"]),
    # training
    ("masked-mean-shapes", lambda: training.masked_mean(jnp.zeros(8), jnp.ones(4, bool)), ValueError,
     ["masked_mean: mask must have the leading shape of values", "mask (4,) for values (8,)", "batch['mask']"]),
    ("init-state-optax-function", lambda: training.init_state(PARAMS, optax.sgd, jax.random.key(0)), TypeError,
     ["init_state: optimizer must be an optax optimizer", "optimizer=optax.sgd(learning_rate)"]),
    ("init-state-not-optimizer", lambda: training.init_state(PARAMS, 0.1, jax.random.key(0)), TypeError,
     ["init_state: optimizer must be an optax optimizer", "got float", "optax.sgd(0.1)"]),
    ("init-state-int-key", lambda: training.init_state(PARAMS, optax.sgd(0.1), 0), TypeError,
     ["init_state: key must be a JAX PRNG key, got int", "key=jax.random.key(seed)"]),
    ("init-state-backend", lambda: training.init_state(PARAMS, optax.sgd(0.1), jax.random.key(0), backend="tpu"),
     ValueError, ["init_state: backend must be one of ('pmap', 'shard_map', 'jit'), got 'tpu'", "backend='pmap'"]),
    ("make-train-step-loss", lambda: training.make_train_step("mse", optax.sgd(0.1)), TypeError,
     ["make_train_step: loss_fn must be a function", "Pass the function itself"]),
    ("fit-not-a-step", lambda: training.fit("step", None, []), TypeError,
     ["fit: step must be a function", "make_train_step(loss_fn, optimizer)"]),
    ("fit-num-steps-float", lambda: training.fit(lambda s, b: (s, {}), None, [], num_steps=2.5), TypeError,
     ["fit: num_steps must be a whole number >= 1, got 2.5", "or None to use every batch"]),
    # collectives
    ("all-gather-axis", lambda: C.all_gather(np.zeros((4, 3)), axis=3), ValueError,
     ["all_gather: axis must be an axis in -2..1", "got 3", "Pass axis between -2 and 1"]),
    ("all-gather-axis-float", lambda: C.all_gather(np.zeros((4, 3)), axis=1.0), TypeError,
     ["all_gather: axis must be a whole number", "int(1.0) = 1"]),
    ("psum-scatter-dimension", lambda: C.psum_scatter(np.zeros((4, 4)), scatter_dimension=1), ValueError,
     ["psum_scatter: scatter_dimension must be an axis in -1..0", "got 1", "Pass scatter_dimension between -1 and 0"]),
    ("all-to-all-split-axis", lambda: C.all_to_all(np.zeros((4, 4, 4)), split_axis=2, concat_axis=0), ValueError,
     ["all_to_all: split_axis must be an axis in -2..1", "got 2"]),
    ("all-to-all-concat-axis", lambda: C.all_to_all(np.zeros((4, 4, 4)), split_axis=0, concat_axis=-3), ValueError,
     ["all_to_all: concat_axis must be an axis in -2..1", "got -3"]),
    ("ppermute-out-of-range", lambda: C.ppermute(np.zeros((4, 1)), [(0, 4)]), ValueError,
     ["ppermute: perm must be pairs of devices in 0..3 (4 devices)", "ring_permutation(4)"]),
    ("ppermute-negative", lambda: C.ppermute(np.zeros((4, 1)), [(-1, 0)]), ValueError,
     ["ppermute: perm must be pairs of devices in 0..3", "ring_permutation(4)"]),
    ("ppermute-not-pairs", lambda: C.ppermute(np.zeros((4, 1)), [(0, 1, 2)]), ValueError,
     ["ppermute: perm must be a list of (source, destination) pairs", "ring_permutation(4)"]),
    ("ppermute-float-device", lambda: C.ppermute(np.zeros((4, 1)), [(0.5, 1)]), TypeError,
     ["ppermute: perm must be a whole number", "ring_permutation(4)"]),
    ("ppermute-repeated", lambda: C.ppermute(np.zeros((4, 1)), [(0, 1), (2, 1)]), ValueError,
     ["ppermute: perm must be a permutation", "Name each device at most once on each side"]),
    ("psum-strings", lambda: C.psum(["a", "b"]), TypeError,
     ["psum: xs must be a numeric array", "np.arange(8.0).reshape(4, 2)"]),
    ("psum-scalar", lambda: C.psum(3.0), ValueError,
     ["psum: xs must be per-device values stacked on a leading axis", "Stack one value per device"]),
    ("ring-permutation-zero", lambda: C.ring_permutation(0), ValueError,
     ["ring_permutation: n must be a whole number >= 1, got 0", "Pass n=1 or more"]),
    ("ring-bytes-negative", lambda: C.ring_allreduce_bytes(8, -1), ValueError,
     ["ring_allreduce_bytes: message_bytes must be a number of bytes >= 0, got -1", "message_bytes=x.nbytes"]),
    ("axis-index-bool", lambda: C.axis_index(True), TypeError, ["axis_index: n must be a whole number"]),
    # diagrams (input checks only)
    ("diagram-topology-empty", lambda: diagrams.device_topology([]), ValueError,
     ["device_topology: devices must be a non-empty list of jax.Device", "devices=jax.devices()"]),
    ("diagram-topology-ints", lambda: diagrams.device_topology([0, 1]), TypeError,
     ["device_topology: devices must be a list of jax.Device", "not their indices"]),
    ("diagram-spmd-scalar-batch", lambda: diagrams.spmd_overview(batch=np.float32(1.0)), ValueError,
     ["spmd_overview: batch must be an array or jax.ShapeDtypeStruct of shape (B, ...)", "Pass the global batch"]),
    ("diagram-spmd-ints", lambda: diagrams.spmd_overview([0, 1, 2, 3]), TypeError,
     ["spmd_overview: devices must be a list of jax.Device", "not their indices"]),
    ("diagram-spmd-program", lambda: diagrams.spmd_overview(program="train"), TypeError,
     ["spmd_overview: program must be a function", "Pass the function itself"]),
    ("diagram-mpmd-empty", lambda: diagrams.mpmd_overview([]), ValueError,
     ["mpmd_overview: programs must be a non-empty list of functions", "programs=[f, g]"]),
    ("diagram-pmap-scalar", lambda: diagrams.pmap_dataflow(lambda x: x, np.float32(1.0)), ValueError,
     ["pmap_dataflow: in_axes for x must be an axis of its shape ()", "pass in_axes=None for it"]),
    ("diagram-pmap-axis", lambda: diagrams.pmap_dataflow(lambda x: x, np.zeros((8, 2)), in_axes=2), ValueError,
     ["pmap_dataflow: in_axes for x must be an axis of its shape (8, 2)", "has 2 axes: pick one of them"]),
    ("diagram-placement-host", lambda: diagrams.array_placement(np.zeros(8)), TypeError,
     ["array_placement needs a jax.Array (on devices) as x", "jax.device_put"]),
    ("diagram-placement-max-values", lambda: diagrams.array_placement(jnp.zeros(8), max_values=-1), ValueError,
     ["array_placement: max_values must be a whole number >= 0, got -1", "Pass max_values=0 or more"]),
    ("diagram-collective-scalar", lambda: diagrams.collective(jax.lax.psum, 1.0), ValueError,
     ["collective: xs must be per-device inputs stacked on a leading axis", "Stack one value per device"]),
    ("diagram-collective-ints", lambda: diagrams.collective(jax.lax.psum, np.zeros(4), devices=[0, 1, 2, 3]),
     TypeError, ["collective: devices must be a list of jax.Device", "not their indices"]),
    ("diagram-collective-op", lambda: diagrams.collective("psum", np.zeros(4)), TypeError,
     ["collective: op must be a function", "jax.lax.psum"]),
    ("diagram-train-step-unsharded",
     lambda: diagrams.train_step(loss_fn, PARAMS, {"x": X, "y": Y, "mask": np.ones(64, bool)}), ValueError,
     ["train_step: batch must be sharded", "leaf ['mask'] has shape (64,)", "sharding.shard(batch)"]),
    ("diagram-train-step-too-many",
     lambda: diagrams.train_step(loss_fn, PARAMS, {"x": X.reshape(16, 4, 3), "y": Y.reshape(16, 4),
                                                   "mask": np.ones((16, 4), bool)}), ValueError,
     ["train_step: batch must be sharded over at most 8 devices", "sharding.shard(batch)"]),
    ("diagram-train-step-empty", lambda: diagrams.train_step(loss_fn, PARAMS, {}), ValueError,
     ["train_step: batch must be a sharded batch with at least one array", "sharding.shard("]),
    ("diagram-shape-str", lambda: diagrams.shape_str(object()), TypeError,
     ["shape_str: x must be an array, a jax.ShapeDtypeStruct or a number", "np.zeros((8, 3))"]),
    # devices
    ("devices-simulate-numpy-int-ok", lambda: len(cdev.simulate_devices(np.int64(8))) == 8 or 1 / 0, None, []),
    ("devices-lesson-zero", lambda: cdev.lesson_devices(0), ValueError,
     ["lesson_devices: n must be a whole number >= 1, got 0", "lesson_devices(8)"]),
    # errors
    ("errors-show-error-instance", lambda: errors.show_error(ValueError("x")).__enter__(), TypeError,
     ["show_error: expected must be exception classes", "show_error(ValueError, TypeError)"]),
    ("errors-show-error-max-lines", lambda: errors.show_error(ValueError, max_lines=0).__enter__(), ValueError,
     ["show_error: max_lines must be a whole number >= 1, got 0", "Pass max_lines=1 or more"]),
    # distributed (no process is started: every check runs first)
    ("launcher-num-processes", lambda: distributed.Launcher(0), ValueError,
     ["Launcher: num_processes must be a whole number >= 1, got 0", "Pass num_processes=1 or more"]),
    ("launcher-devices-float", lambda: distributed.Launcher(2, 2.5), TypeError,
     ["Launcher: devices_per_process must be a whole number >= 1, got 2.5"]),
    ("launcher-timeout-none", lambda: distributed.Launcher(2, 2, timeout=None), TypeError,
     ["Launcher: timeout must be a number of seconds > 0, got None", "timeout=180"]),
    ("launcher-timeout-negative", lambda: distributed.Launcher(2, 2, timeout=-1), ValueError,
     ["Launcher: timeout must be a number of seconds > 0, got -1", "timeout=180"]),
    ("launcher-args-string", lambda: distributed.Launcher(2, 2, args="--steps 5"), TypeError,
     ["Launcher: args must be a list of strings", "args=['--steps', '40']"]),
    ("launcher-args-int", lambda: distributed.Launcher(2, 2, args=["--steps", 5]), TypeError,
     ["Launcher: args must be a list of strings", "args=['--steps', '40']"]),
    ("launcher-module-file", lambda: distributed.Launcher(2, 2, module="train_dp.py"), ValueError,
     ["Launcher: module must be a module name to run with python -m", "module='course_lib.train_dp'"]),
    ("launcher-env", lambda: distributed.Launcher(2, 2, env=["A=1"]), TypeError,
     ["Launcher: env must be a dict of environment variables", "env={**os.environ"]),
    ("launch-devices-zero", lambda: distributed.launch(2, 0), ValueError,
     ["Launcher: devices_per_process must be a whole number >= 1, got 0"]),
    ("launcher-wait-before-start", lambda: distributed.Launcher(2, 2).wait(), RuntimeError,
     ["Launcher.wait: no workers are running", "call start() first"]),
    ("worker-env-devices", lambda: distributed.worker_env(0), ValueError,
     ["worker_env: devices_per_process must be a whole number >= 1, got 0"]),
    # train_dp (in this process: the checks run before JAX's distributed runtime)
    ("train-dp-train-steps", lambda: train_dp.train(steps=0), ValueError,
     ["train_dp.train: steps must be a whole number >= 1, got 0", "Pass steps=1 or more"]),
    ("train-dp-train-devices", lambda: train_dp.train(steps=1, devices=[]), ValueError,
     ["train_dp.train: devices must be a non-empty list of jax.Device"]),
    # bench (the library functions; the command line is tested in test_faults_processes.py)
    ("bench-run-steps", lambda: bench.run(steps=0), ValueError,
     ["bench.run: steps must be a whole number >= 1, got 0", "Pass steps=1 or more"]),
    ("bench-run-repeats", lambda: bench.run(repeats=-3), ValueError,
     ["bench.run: repeats must be a whole number >= 1, got -3"]),
    ("bench-run-multiple", lambda: bench.run(steps=15, scan_steps=10), ValueError,
     ["bench.run: steps must be a multiple of scan_steps (10), got 15", "steps=10"]),
    ("bench-allreduce-too-many-devices", lambda: bench.allreduce_ms({"one": 1}, [2, 16]), ValueError,
     ["bench.allreduce_ms: device_counts must be a non-empty list of counts from 1 to 8", "got [2, 16]",
      "device_counts=[2, 8]"]),
    ("bench-allreduce-no-devices", lambda: bench.allreduce_ms({"one": 1}, []), ValueError,
     ["bench.allreduce_ms: device_counts must be a non-empty list"]),
    ("bench-allreduce-size-zero", lambda: bench.allreduce_ms({"one": 0}, [2]), ValueError,
     ["bench.allreduce_ms: sizes['one'] must be a whole number >= 1, got 0"]),
    ("bench-allreduce-sizes-list", lambda: bench.allreduce_ms([1], [2]), TypeError,
     ["bench.allreduce_ms: sizes must be a non-empty dict {label: how many float32 numbers}", 'sizes={"one number"']),
    ("bench-buffer-size-unknown", lambda: bench.buffer_size("cnn"), ValueError,
     ["bench.buffer_size: name must be one of 'regression', 'mlp', got 'cnn'"]),
]



@pytest.mark.parametrize("call, error, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_wrong_argument_gets_a_clear_error(devices, call, error, words):
    if error is None:  # an accepted value (NumPy integers count as whole numbers)
        call()
        return
    with pytest.raises(Exception) as caught:
        call()
    assert not isinstance(caught.value, RAW), f"a raw {type(caught.value).__name__}: {caught.value}"
    assert type(caught.value) is error, f"{type(caught.value).__name__}: {caught.value}"
    message = str(caught.value)
    for w in words:
        assert w in message, f"{w!r} not in {message!r}"


def test_there_are_forty_cases_over_every_public_module():
    failing = [c for c in CASES if c[2] is not None]
    assert len(failing) >= 40
    for module in ["shard", "pad_batch", "device_mesh", "batches", "init_state", "fit", "ppermute", "all_gather",
                   "device_topology", "lesson_devices", "show_error", "Launcher", "train_dp", "bench"]:
        assert any(module in " ".join(c[3]) for c in failing), module


def test_shard_numpy_integer_device_count_is_accepted():
    out = sharding.shard({"x": np.zeros((16, 3)), "y": np.zeros(16)}, np.int32(8))
    assert out["x"].shape == (8, 2, 3) and out["y"].shape == (8, 2)


def test_pad_batch_numpy_integer_and_data_numpy_integers_are_accepted():
    padded, mask = sharding.pad_batch(np.zeros((5, 2)), np.int64(4))
    assert padded.shape == (8, 2) and mask.sum() == 5
    first = next(data.batches(X, Y, np.int64(16), n_devices=np.int32(8), epochs=np.int64(1)))
    assert first["x"].shape == (8, 2, 3)
    assert data.num_batches(np.int64(100), np.int32(8)) == 12


def test_fit_rejects_a_host_state(devices):
    step = training.make_train_step(loss_fn, optax.sgd(0.1))
    host = jax.tree.map(np.asarray, PARAMS)
    raw = training.TrainState(host, optax.sgd(0.1).init(host), jax.random.key(0), np.int32(0))
    batches = data.batches(X, Y, 64, n_devices=8)
    with pytest.raises(TypeError) as e:
        training.fit(step, raw, batches, progress=False)
    assert "fit: state must live on the devices" in str(e.value)
    assert "training.init_state(params, optimizer, key, backend='pmap')" in str(e.value)


def test_fit_rejects_an_unreplicated_state(devices):
    step = training.make_train_step(loss_fn, optax.sgd(0.1))
    state = training.TrainState(PARAMS, optax.sgd(0.1).init(PARAMS), jax.random.key(0), jnp.int32(0))
    with pytest.raises(ValueError) as e:
        training.fit(step, state, data.batches(X, Y, 64, n_devices=8), progress=False)
    message = str(e.value)
    assert "the 'pmap' step needs a copy per device" in message and "it is not replicated" in message
    assert "training.init_state(params, optimizer, key, backend='pmap')" in message


@pytest.mark.parametrize("state_backend, step_backend, origin", [
    ("shard_map", "pmap", "it comes from backend 'shard_map' or 'jit'"),
    ("pmap", "jit", "it comes from backend 'pmap'"),
    ("pmap", "shard_map", "it comes from backend 'pmap'"),
])
def test_fit_names_a_state_from_another_backend(devices, state_backend, step_backend, origin):
    state = training.init_state(PARAMS, optax.sgd(0.1), jax.random.key(0), backend=state_backend)
    step = training.make_train_step(loss_fn, optax.sgd(0.1), backend=step_backend)
    with pytest.raises(ValueError) as e:
        training.fit(step, state, data.batches(X, Y, 64, n_devices=8), progress=False)
    message = str(e.value)
    assert origin in message, message
    assert f"training.init_state(params, optimizer, key, backend={step_backend!r}" in message
    assert "batch" not in message.split(".")[0], "the message blames the state, not the batch"


def test_fit_names_a_state_on_other_devices(devices):
    state = training.init_state(PARAMS, optax.sgd(0.1), jax.random.key(0), devices=devices[:4], backend="jit")
    step = training.make_train_step(loss_fn, optax.sgd(0.1), devices=devices, backend="jit")
    with pytest.raises(ValueError, match=re.escape("fit: state must live on the step's 8 devices, but it lives on "
                                                   "4 device(s)")):
        training.fit(step, state, data.batches(X, Y, 64, n_devices=8), progress=False)


def test_diagrams_accept_devices_described_by_another_process(devices):
    import types

    owners = [types.SimpleNamespace(id=i, process_index=i // 2, platform="cpu", device_kind="cpu") for i in range(4)]
    g = diagrams.device_topology(owners)
    assert "cluster_process1" in g.source and "dev3" in g.source


def test_fit_rejects_a_step_that_returns_no_loss(devices):
    state = training.init_state(PARAMS, optax.sgd(0.1), jax.random.key(0))
    with pytest.raises(TypeError, match=r"fit: step must return \(state, metrics\) with metrics a dict holding "
                                        r"'loss'.*Return e.g. \(new_state, \{'loss': loss\}\)"):
        training.fit(lambda s, b: (s, {"error": 0.0}), state, data.batches(X, Y, 64, n_devices=8), progress=False)


def test_fit_rejects_an_eval_fn_that_returns_no_dict(devices):
    state = training.init_state(PARAMS, optax.sgd(0.1), jax.random.key(0))
    step = training.make_train_step(loss_fn, optax.sgd(0.1))
    with pytest.raises(TypeError, match=r"fit: eval_fn must return a dict of numbers, got float.*'accuracy'"):
        training.fit(step, state, data.batches(X, Y, 64, n_devices=8), eval_fn=lambda s: 0.5, progress=False)


JUNK = [None, "x", -1, 0, True, 2.5, [], {}, object()]


def _sweep():
    """(name, function, valid keyword arguments): each argument is swapped for junk in turn."""
    mesh = sharding.device_mesh()
    return [
        ("shard", sharding.shard, {"tree": {"x": np.zeros((8, 2))}, "n_devices": 8}),
        ("unshard", sharding.unshard, {"tree": np.zeros((8, 1, 2))}),
        ("pad_batch", sharding.pad_batch, {"tree": np.zeros((5, 2)), "multiple": 8}),
        ("replicate", sharding.replicate, {"tree": {"w": np.zeros(2)}, "devices": jax.devices()}),
        ("unreplicate", sharding.unreplicate, {"tree": {"w": np.zeros((8, 2))}}),
        ("device_mesh", sharding.device_mesh, {"devices": jax.devices()}),
        ("shard_on_mesh", sharding.shard_on_mesh, {"tree": np.zeros((8, 2)), "mesh": mesh, "axis": "devices"}),
        ("replicate_on_mesh", sharding.replicate_on_mesh, {"tree": np.zeros(2), "mesh": mesh}),
        ("batches", data.batches, {"x": X, "y": Y, "batch_size": 8, "n_devices": 8, "epochs": 1, "seed": 0,
                                   "remainder": "drop"}),
        ("num_batches", data.num_batches, {"n_examples": 10, "batch_size": 2, "remainder": "drop"}),
        ("regression_data", data.regression_data, {"n": 16, "d": 2, "noise": 0.1, "seed": 0}),
        ("init_state", training.init_state, {"params": PARAMS, "optimizer": optax.sgd(0.1),
                                             "key": jax.random.key(0), "devices": jax.devices(), "backend": "pmap"}),
        ("make_train_step", training.make_train_step, {"loss_fn": loss_fn, "optimizer": optax.sgd(0.1),
                                                       "devices": jax.devices(), "backend": "jit"}),
        ("psum", C.psum, {"xs": np.zeros((4, 2))}),
        ("all_gather", C.all_gather, {"xs": np.zeros((4, 2)), "axis": 0}),
        ("psum_scatter", C.psum_scatter, {"xs": np.zeros((4, 4)), "scatter_dimension": 0}),
        ("ppermute", C.ppermute, {"xs": np.zeros((4, 2)), "perm": [(0, 1)]}),
        ("all_to_all", C.all_to_all, {"xs": np.zeros((4, 4)), "split_axis": 0, "concat_axis": 0}),
        ("ring_permutation", C.ring_permutation, {"n": 4, "shift": 1}),
        ("ring_allreduce_bytes", C.ring_allreduce_bytes, {"n_devices": 4, "message_bytes": 100}),
        ("device_topology", diagrams.device_topology, {"devices": jax.devices()}),
        ("spmd_overview", diagrams.spmd_overview, {"devices": jax.devices(), "batch": np.zeros((8, 2))}),
        ("mpmd_overview", diagrams.mpmd_overview, {"programs": [abs, abs]}),
        ("array_placement", diagrams.array_placement, {"x": jnp.zeros(8), "name": "x", "max_values": 8}),
        ("collective", diagrams.collective, {"op": jax.lax.psum, "xs": np.zeros((4, 2)), "axis_name": "i"}),
        ("simulate_devices", cdev.simulate_devices, {"n": 8}),
        ("bench.allreduce_ms", bench.allreduce_ms, {"sizes": {"one": 1}, "device_counts": [2], "iters": 2,
                                                     "repeats": 1}),
        ("bench.buffer_size", bench.buffer_size, {"name": "mlp"}),
        ("Launcher", distributed.Launcher, {"num_processes": 2, "devices_per_process": 2, "args": [],
                                            "timeout": 10.0, "env": None, "module": "course_lib.train_dp"}),
    ]


@pytest.mark.parametrize("junk", JUNK, ids=[type(j).__name__ + repr(j)[:6] for j in JUNK])
def test_no_raw_python_error_for_any_junk_argument(devices, junk):
    """Each argument of each function, swapped for junk, gives a clear error or a correct result, never a raw one."""
    unclear = unclear_errors(_sweep(), junk)  # each must be course_lib's own check, which names the function first
    assert not unclear, "\n".join(unclear)
