"""Wrong arguments to the modules of lessons 10 and 11: sharded_state, checkpoint and profile.

Every case asserts the exception type and the words of its message: the function, the argument's name, the value
and the fix. None may come out as a raw IndexError, KeyError, ZeroDivisionError or AttributeError, or as an error
from inside JAX or Orbax.
"""

import gzip
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from course_lib import checkpoint as ck, checkpoint_worker as cw, profile as pr, sharded_state as ss, training
from conftest import RAW, unclear_errors

PARAMS = {"w": jnp.zeros(3), "b": jnp.float32(0.0)}
OPT = optax.sgd(0.1)
BATCH = {"x": np.zeros((16, 3), np.float32), "y": np.zeros(16, np.float32)}


def loss_fn(params, batch):
    return jnp.mean((batch["x"] @ params["w"] + params["b"] - batch["y"]) ** 2)


@pytest.fixture(scope="module")
def state(devices):
    return ss.init_state(PARAMS, OPT, ss.data_mesh(devices))


@pytest.fixture(scope="module")
def step():
    return ss.make_train_step(loss_fn, OPT)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, devices):
    directory = tmp_path_factory.mktemp("faults") / "run"
    ck.save(directory, 5, {"w": jnp.arange(3.0), "b": jnp.float32(1.0)}, {"position": 5})
    return directory


@pytest.fixture(scope="module")
def trace():
    ops = [pr.Op(d, "run0", "fusion", 0.0, 10.0, False) for d in range(2)]
    return pr.from_ops(ops, [pr.Marker(0, 0.0, 12.0)])


def _mesh2d():
    return jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))


# (id, call(state, step, saved, trace, tmp_path), exception type, words the message must hold)
CASES = [
    # sharded_state
    ("data-mesh-device-ids", lambda *_: ss.data_mesh([0, 1]), TypeError,
     ["data_mesh: devices must be a list of jax.Device", "[0, 1]", "not their indices"]),
    ("data-mesh-empty", lambda *_: ss.data_mesh([]), ValueError,
     ["data_mesh: devices must be a non-empty list", "got []", "devices=jax.devices()"]),
    ("data-mesh-axis-int", lambda *_: ss.data_mesh(None, 3), TypeError,
     ["data_mesh: axis must be a non-empty string", "got 3", "axis='data'"]),
    ("init-stage-unknown", lambda *_: ss.init_state(PARAMS, OPT, stage="zero3"), ValueError,
     ["init_state: stage must be one of 'replicated', 'zero1', 'zero2', 'fsdp'", "got 'zero3'", "'fsdp' also"]),
    ("init-stage-int", lambda *_: ss.init_state(PARAMS, OPT, stage=2), ValueError,
     ["init_state: stage must be one of", "got 2"]),
    ("init-optimizer-uncalled", lambda *_: ss.init_state(PARAMS, optax.adam), TypeError,
     ["init_state: optimizer must be an optax.GradientTransformation", "the function adam", "optax.adam(1e-3)"]),
    ("init-optimizer-name", lambda *_: ss.init_state(PARAMS, "adam"), TypeError,
     ["init_state: optimizer must be an optax.GradientTransformation", "got 'adam'", "optax.adam(1e-3)"]),
    ("init-mesh-device-list", lambda *_: ss.init_state(PARAMS, OPT, jax.devices()), TypeError,
     ["init_state: mesh must be a jax.sharding.Mesh", "data_mesh(devices)"]),
    ("init-mesh-2d", lambda *_: ss.init_state(PARAMS, OPT, _mesh2d()), ValueError,
     ["init_state: mesh must be 1-D", "'a', 'b'", "data_mesh(devices)"]),
    ("init-int-params", lambda *_: ss.init_state({"w": jnp.arange(3)}, OPT), ValueError,
     ["init_state: params must be a non-empty pytree of float arrays", "int32", "astype(jnp.float32)"]),
    ("init-no-params", lambda *_: ss.init_state(None, OPT), ValueError,
     ["init_state: params must be a non-empty pytree of float arrays", "[]"]),
    ("init-string-leaf", lambda *_: ss.init_state({"w": jnp.zeros(3), "name": "mlp"}, OPT), TypeError,
     ["init_state: params leaf ['name'] must be an array", "'mlp'", "float array"]),
    ("init-state-as-params", lambda s, *_: ss.init_state(s, OPT), TypeError,
     ["init_state: params must be a pytree of float arrays, got a ShardedState", "params_of(state)"]),
    ("params-of-dict", lambda *_: ss.params_of(PARAMS), TypeError,
     ["params_of: state must be a ShardedState, got dict", "init_state"]),
    ("params-of-train-state", lambda *_: ss.params_of(training.init_state(PARAMS, OPT, jax.random.key(0),
                                                                          backend="jit")), TypeError,
     ["params_of: state must be a ShardedState, got TrainState", "training.make_train_step", "init_state"]),
    ("step-accumulate-zero", lambda *_: ss.make_train_step(loss_fn, OPT, accumulate=0), ValueError,
     ["make_train_step: accumulate must be a whole number >= 1, got 0", "micro-batches per step"]),
    ("step-accumulate-bool", lambda *_: ss.make_train_step(loss_fn, OPT, accumulate=True), TypeError,
     ["make_train_step: accumulate must be a whole number", "got True"]),
    ("step-accumulate-float", lambda *_: ss.make_train_step(loss_fn, OPT, accumulate=2.0), TypeError,
     ["make_train_step: accumulate must be a whole number", "got 2.0", "accumulate=4"]),
    ("step-compute-int", lambda *_: ss.make_train_step(loss_fn, OPT, compute_dtype=jnp.int32), ValueError,
     ["make_train_step: compute_dtype must be a float dtype", "int32", "jnp.bfloat16"]),
    ("step-compute-typo", lambda *_: ss.make_train_step(loss_fn, OPT, compute_dtype="bfloat61"), ValueError,
     ["make_train_step: compute_dtype must be a float dtype", "'bfloat61'", "jnp.bfloat16"]),
    ("step-loss-not-callable", lambda *_: ss.make_train_step(loss_fn(PARAMS, BATCH), OPT), TypeError,
     ["make_train_step: loss_fn must be a function", "not the result of calling it"]),
    ("step-stage-unknown", lambda *_: ss.make_train_step(loss_fn, OPT, stage="ZeRO-2"), ValueError,
     ["make_train_step: stage must be one of", "got 'ZeRO-2'"]),
    ("step-dict-state", lambda s, st, *_: st(PARAMS, BATCH), TypeError,
     ["step: state must be a ShardedState, got dict", "init_state"]),
    ("step-state-of-another-stage", lambda s, *_: ss.make_train_step(loss_fn, OPT, stage="fsdp")(s, BATCH),
     ValueError, ["step: the state was made for stage 'replicated' but this step is for 'fsdp'", "stage='fsdp'"]),
    ("step-batch-indivisible", lambda s, st, *_: st(s, {"x": np.zeros((15, 3), np.float32),
                                                         "y": np.zeros(15, np.float32)}), ValueError,
     ["step: batch leaf ['x'] has shape (15, 3)", "a multiple of 8", "global batch of 8"]),
    ("step-batch-sizes-differ", lambda s, st, *_: st(s, {"x": np.zeros((16, 3), np.float32),
                                                          "y": np.zeros(8, np.float32)}), ValueError,
     ["step: the leaves of batch must share one batch size", "16 rows in ['x']", "8 in ['y']", "Cut or pad"]),
    ("step-batch-empty", lambda s, st, *_: st(s, {}), TypeError,
     ["step: batch must be a pytree of arrays", "got {}", "{'x': x, 'y': y}"]),
    ("step-batch-string-leaf", lambda s, st, *_: st(s, {"x": np.zeros((16, 3)), "y": "labels"}), TypeError,
     ["step: batch leaf ['y'] must be an array", "'labels'", "np.asarray"]),
    ("state-bytes-dict", lambda *_: ss.state_bytes(PARAMS), TypeError,
     ["state_bytes: state must be a ShardedState, got dict"]),
    ("compiled-memory-not-a-step", lambda s, *_: ss.compiled_memory(loss_fn, s, BATCH), TypeError,
     ["compiled_memory: step must be a step from sharded_state.make_train_step", "the function loss_fn"]),
    ("compiled-memory-dict-state", lambda s, st, *_: ss.compiled_memory(st, PARAMS, BATCH), TypeError,
     ["compiled_memory: state must be a ShardedState, got dict"]),
    ("formula-negative-params", lambda *_: ss.formula_bytes(-1, 8, "zero1"), ValueError,
     ["formula_bytes: n_params must be a whole number >= 0, got -1", "number of parameters"]),
    ("formula-float-params", lambda *_: ss.formula_bytes(1.5, 8, "zero1"), TypeError,
     ["formula_bytes: n_params must be a whole number", "got 1.5"]),
    ("formula-string-params", lambda *_: ss.formula_bytes("19210", 8, "zero1"), TypeError,
     ["formula_bytes: n_params must be a whole number", "got '19210'"]),
    ("formula-zero-devices", lambda *_: ss.formula_bytes(10, 0, "zero1"), ValueError,
     ["formula_bytes: n_devices must be a whole number >= 1, got 0", "n_devices=1 or more"]),
    ("formula-bool-devices", lambda *_: ss.formula_bytes(10, True, "zero1"), TypeError,
     ["formula_bytes: n_devices must be a whole number", "got True"]),
    ("formula-negative-copies", lambda *_: ss.formula_bytes(10, 8, "zero1", optimizer_copies=-2), ValueError,
     ["formula_bytes: optimizer_copies must be a whole number >= 0, got -2", "Adam: 2"]),
    ("formula-stage", lambda *_: ss.formula_bytes(10, 8, "zero3"), ValueError,
     ["formula_bytes: stage must be one of", "got 'zero3'"]),
    ("collectives-compiled-object", lambda s, st, *_: ss.collectives(st.compile(s, BATCH)), TypeError,
     ["collectives: hlo_text must be the compiled program's text, a str, got Compiled", ".as_text()"]),
    ("collectives-zero-devices", lambda *_: ss.collectives("", 0), ValueError,
     ["collectives: n_devices must be a whole number >= 1, got 0"]),
    ("communication-none", lambda *_: ss.communication(None), TypeError,
     ["hlo_text must be the compiled program's text", "NoneType"]),
    ("ring-bytes-op-spelling", lambda *_: ss.ring_bytes("allreduce", 100, 8), ValueError,
     ["ring_bytes: op must be one of 'all-reduce'", "got 'allreduce'", "op='all-reduce'"]),
    ("ring-bytes-zero-group", lambda *_: ss.ring_bytes("all-reduce", 100, 0), ValueError,
     ["ring_bytes: group must be a whole number >= 1, got 0", "number of devices"]),
    ("ring-bytes-string-payload", lambda *_: ss.ring_bytes("all-reduce", "100", 8), TypeError,
     ["ring_bytes: payload must be a number of bytes >= 0", "got '100'"]),
    ("ring-bytes-negative-payload", lambda *_: ss.ring_bytes("all-gather", -4, 8), ValueError,
     ["ring_bytes: payload must be a number of bytes >= 0", "got -4"]),
    ("dataflow-zero-devices-shown", lambda s, st, *_: ss.dataflow(st, s, BATCH, show_devices=0), ValueError,
     ["dataflow: show_devices must be a whole number >= 1, got 0"]),
    ("dataflow-loss-as-step", lambda s, *_: ss.dataflow(loss_fn, s, BATCH), TypeError,
     ["dataflow: step must be a step from sharded_state.make_train_step", "the function loss_fn"]),
    ("dataflow-dict-state", lambda s, st, *_: ss.dataflow(st, PARAMS, BATCH), TypeError,
     ["dataflow: state must be a ShardedState, got dict"]),
    ("bench-variants-zero-accumulate", lambda *_: ss.bench_variants(PARAMS, None, OPT, [], accumulate=0),
     ValueError, ["bench_variants: accumulate must be a whole number >= 1, got 0"]),
    ("bench-variants-no-batches", lambda *_: ss.bench_variants(PARAMS, None, OPT, []), ValueError,
     ["bench_variants: host_batches must be a non-empty list", "got []"]),
    # checkpoint
    ("checkpoints-directory-none", lambda *_: ck.Checkpoints(None), TypeError,
     ["Checkpoints: directory must be a path", "got None", "tempfile.mkdtemp()"]),
    ("checkpoints-keep-zero", lambda *a: ck.Checkpoints(a[4] / "k", keep=0), ValueError,
     ["Checkpoints: keep must be a whole number >= 1, got 0", "None for all"]),
    ("checkpoints-keep-float", lambda *a: ck.Checkpoints(a[4] / "k", keep=2.5), TypeError,
     ["Checkpoints: keep must be a whole number", "got 2.5"]),
    ("checkpoints-asynchronous-string", lambda *a: ck.Checkpoints(a[4] / "k", asynchronous="yes"), TypeError,
     ["Checkpoints: asynchronous must be True or False, got 'yes'", "asynchronous=True"]),
    ("save-negative-step", lambda *a: ck.save(a[4] / "s", -1, PARAMS), ValueError,
     ["save: step must be a whole number >= 0, got -1", "step=100"]),
    ("save-float-step", lambda *a: ck.save(a[4] / "s", 10.0, PARAMS), TypeError,
     ["save: step must be a whole number", "got 10.0", "step=100"]),
    ("save-bool-step", lambda *a: ck.save(a[4] / "s", True, PARAMS), TypeError,
     ["save: step must be a whole number", "got True"]),
    ("save-older-step", lambda s, st, d, *_: ck.save(d, 3, PARAMS), ValueError,
     ["save: step=3, but run/ already holds step 5", "Resume from step 5"]),
    ("save-extra-array", lambda *a: ck.save(a[4] / "s", 1, PARAMS, {"seen": np.arange(3)}), ValueError,
     ["save: extra must hold only JSON values", "ndarray", ".tolist()"]),
    ("save-extra-not-dict", lambda *a: ck.save(a[4] / "s", 1, PARAMS, [100]), TypeError,
     ["save: extra must be a dict of JSON values", "got [100]", "extra={'position': 100}"]),
    ("save-no-state", lambda *a: ck.save(a[4] / "s", 1, None), TypeError,
     ["save: state must be a pytree of arrays", "got None", "pass the state itself"]),
    ("save-string-leaf", lambda *a: ck.save(a[4] / "s", 1, {"w": jnp.zeros(3), "note": "best"}), TypeError,
     ["save: state leaf ['note'] must be an array or a number", "'best'", "extra="]),
    ("restore-missing-directory", lambda *a: ck.restore(a[4] / "never_saved", PARAMS), ck.CheckpointError,
     ["restore: directory='never_saved' does not exist", "the directory the run saved to"]),
    ("restore-directory-int", lambda *_: ck.restore(3, PARAMS), TypeError,
     ["restore: directory must be a path", "got 3"]),
    ("restore-step-string", lambda s, st, d, *_: ck.restore(d, PARAMS, step="5"), TypeError,
     ["restore: step must be a whole number >= 0, got '5'", "None for the newest"]),
    ("restore-step-missing", lambda s, st, d, *_: ck.restore(d, PARAMS, step=7), ck.CheckpointError,
     ["restore: step=7 is not in run/; the steps there are [5]", "step=None for the newest"]),
    ("restore-device-ids", lambda s, st, d, *_: ck.restore(d, PARAMS, devices=[0, 1]), TypeError,
     ["restore: devices must be a list of jax.Device", "not their indices"]),
    ("restore-one-device", lambda s, st, d, *_: ck.restore(d, PARAMS, devices=jax.devices()[0]), TypeError,
     ["restore: devices must be a list of jax.Device", "devices=[device]"]),
    ("restore-no-devices", lambda s, st, d, *_: ck.restore(d, PARAMS, devices=[]), ValueError,
     ["restore: devices must be a non-empty list", "got []"]),
    ("restore-devices-and-sharding", lambda s, st, d, *_: ck.restore(
        d, PARAMS, devices=jax.devices(), sharding=ck.replicated_on(jax.devices())), ValueError,
     ["restore: give devices= or sharding=, not both"]),
    ("restore-spec-as-sharding", lambda s, st, d, *_: ck.restore(d, PARAMS, sharding=jax.P()), TypeError,
     ["restore: sharding must be a jax.sharding.Sharding", "got P()", "NamedSharding(mesh, spec)"]),
    ("restore-sharding-tree-mismatch", lambda s, st, d, *_: ck.restore(
        d, PARAMS, sharding={"w": ck.replicated_on(jax.devices())}), ValueError,
     ["restore: sharding must be one Sharding or a pytree of them shaped like the state", "one Sharding per leaf"]),
    ("restore-no-like", lambda s, st, d, *_: ck.restore(d, None), TypeError,
     ["restore: like must be a pytree of arrays", "got None"]),
    ("restore-like-other-shape", lambda s, st, d, *_: ck.restore(d, {"w": jnp.zeros(4), "b": jnp.float32(0)}),
     ck.CheckpointError, ["restore: the state given as like= does not match step 5 in run/",
                          "leaf w was saved with shape (3,), like= asks for (4,)", "same model"]),
    ("restore-like-of-another-form", lambda s, st, d, *_: ck.restore(d, s), ck.CheckpointError,
     ["restore: the state given as like= does not match step 5 in run/", "tree structures do not match",
      "same model, optimizer and backend"]),
    ("restore-like-python-numbers", lambda s, st, d, *_: ck.restore(d, {"w": [0.0, 0.0, 0.0], "b": 0.0}),
     ck.CheckpointError, ["restore: the state given as like= does not match step 5"]),
    ("restore-like-int32", lambda s, st, d, *_: ck.restore(d, {"w": jnp.zeros(3, jnp.int32), "b": jnp.float32(0)}),
     ck.CheckpointError, ["leaf w was saved as float32, like= asks for int32", "does not cast"]),
    ("restore-like-float16", lambda s, st, d, *_: ck.restore(d, {"w": jnp.zeros(3, jnp.float16), "b": jnp.float32(0)}),
     ck.CheckpointError, ["leaf w was saved as float32, like= asks for float16"]),
    ("restore-sharded-state-onto-3", lambda s, st, d, *_: ck.restore(d, s, devices=jax.devices()[:3]),
     ValueError, ["restore: like= is a sharded_state.ShardedState laid out on 8 devices", "devices= (3 device(s))",
                  "sharded_state.data_mesh(devices)"]),
    ("save-nan-state-keep-1", lambda *a: ck.Checkpoints(a[4] / "nan", keep=1).save(1, {"w": jnp.array([0.0, jnp.nan])}),
     ValueError, ["save: state leaf ['w'] holds NaN or infinity at step 1: not saved", "keep=1", "keep=None"]),
    ("steps-a-file", lambda *_: ck.steps(__file__), NotADirectoryError,
     ["steps: directory='test_faults_new_modules.py' is a file", "the directory the run saved to"]),
    ("latest-step-a-file", lambda *_: ck.latest_step(__file__), NotADirectoryError,
     ["latest_step: directory='test_faults_new_modules.py' is a file"]),
    ("resume-negative-position", lambda *_: ck.resume(lambda: iter(range(3)), -1), ValueError,
     ["resume: position must be a whole number >= 0, got -1", "extra['position']"]),
    ("resume-float-position", lambda *_: ck.resume(lambda: iter(range(3)), 1.0), TypeError,
     ["resume: position must be a whole number", "got 1.0"]),
    ("resume-an-iterator", lambda *_: ck.resume(iter(range(3)), 1), TypeError,
     ["resume: make_batches must be a function that returns the batches", "lambda: data.batches"]),
    ("replicated-on-device-ids", lambda *_: ck.replicated_on([0, 1]), TypeError,
     ["replicated_on: devices must be a list of jax.Device", "not their indices"]),
    ("replicated-on-empty", lambda *_: ck.replicated_on([]), ValueError,
     ["replicated_on: devices must be a non-empty list", "got []"]),
    ("crash-mid-save-older-step", lambda s, st, d, *_: cw.crash_mid_save(d, 3), ValueError,
     ["crash_mid_save: step=3, but run/ already holds step 5", "step=105"]),
    ("crash-mid-save-negative-step", lambda *a: cw.crash_mid_save(a[4], -1), ValueError,
     ["crash_mid_save: step must be a whole number >= 0, got -1"]),
    ("crash-mid-save-zero-megabytes", lambda *a: cw.crash_mid_save(a[4], 1, megabytes=0), ValueError,
     ["crash_mid_save: megabytes must be a whole number >= 1, got 0"]),
    ("crash-mid-save-timeout-string", lambda *a: cw.crash_mid_save(a[4], 1, timeout="60"), TypeError,
     ["crash_mid_save: timeout must be a number of seconds > 0, got '60'"]),
    ("crash-mid-save-directory-none", lambda *_: cw.crash_mid_save(None, 1), TypeError,
     ["crash_mid_save: directory must be a path", "got None"]),
    # profile
    ("capture-zero-steps", lambda *a: pr.capture(a[4] / "t", lambda i: i, 0), ValueError,
     ["capture: steps must be a whole number >= 1, got 0", "steps=5"]),
    ("capture-float-steps", lambda *a: pr.capture(a[4] / "t", lambda i: i, 2.0), TypeError,
     ["capture: steps must be a whole number", "got 2.0"]),
    ("capture-result-not-function", lambda *a: pr.capture(a[4] / "t", 3, 2), TypeError,
     ["capture: run_step must be a function run_step(i)", "got 3", "lambda i:"]),
    ("capture-directory-none", lambda *_: pr.capture(None, lambda i: i, 2), TypeError,
     ["capture: directory must be a path", "got None"]),
    ("capture-onto-a-file", lambda *a: pr.capture(_write(a[4] / "f.json", []), lambda i: 1 / 0, 2),
     NotADirectoryError, ["capture: directory='f.json' cannot hold a trace", "is a file"]),
    ("summarise-zero-steps-per-dispatch", lambda s, st, d, t, *_: pr.summarise(t, steps_per_dispatch=0), ValueError,
     ["summarise: steps_per_dispatch must be a whole number >= 1, got 0"]),
    ("collective-fraction-no-ops", lambda *_: pr.collective_fraction(pr.from_ops([])), ValueError,
     ["collective_fraction: the trace holds no device ops", "no data"]),
    ("find-trace-empty-directory", lambda *a: pr.find_trace(a[4]), FileNotFoundError,
     ["find_trace: directory=", "holds no plugins/profile/*/perfetto_trace.json.gz", "create_perfetto_trace=True"]),
    ("load-missing-file", lambda *a: pr.load(a[4] / "missing.json.gz"), ValueError,
     ["load: path='missing.json.gz' is not a readable trace file", "No such file", "profile.find_trace"]),
    ("load-none", lambda *_: pr.load(None), TypeError, ["load: path must be a path", "got None"]),
    ("load-json-not-a-trace", lambda *a: pr.load(_write(a[4] / "numbers.json", [1, 2])), ValueError,
     ["load: path='numbers.json' is not a trace in the Chrome trace-event format", "event 0 is 1"]),
    ("load-json-object-not-a-trace", lambda *a: pr.load(_write(a[4] / "obj.json", {"traceEvents": 3})), ValueError,
     ["load: path='obj.json' is JSON but not a trace", "profile.find_trace"]),
    ("load-event-without-time", lambda *a: pr.load(_write(a[4] / "nots.json.gz", [
        {"ph": "X", "name": "fusion", "args": {"device_ordinal": 0, "hlo_op": "fusion"}}])), ValueError,
     ["load: path='nots.json.gz' is not a trace", "KeyError: 'ts'"]),
    ("summarise-a-path", lambda *a: pr.summarise(a[4] / "trace.json.gz"), TypeError,
     ["summarise: trace must be a profile.Trace, got", "trace = profile.load(path)"]),
    ("collective-fraction-none", lambda *_: pr.collective_fraction(None), TypeError,
     ["collective_fraction: trace must be a profile.Trace, got NoneType", "profile.from_ops"]),
    ("plot-timeline-a-string", lambda *_: pr.plot_timeline("trace.json.gz"), TypeError,
     ["plot_timeline: trace must be a profile.Trace, got str", "profile.load(path)"]),
    ("plot-timeline-empty", lambda *_: pr.plot_timeline(pr.from_ops([])), ValueError,
     ["plot_timeline: the trace holds no device ops", "profile.capture"]),
    ("from-ops-tuples", lambda *_: pr.from_ops([(0, "r", "fusion", 0.0, 1.0, False)]), TypeError,
     ["from_ops: ops must be a list of profile.Op", "It holds tuple", "profile.Op(...)"]),
    ("from-ops-none", lambda *_: pr.from_ops(None), TypeError, ["from_ops: ops must be a list of profile.Op",
                                                                 "got None"]),
    ("from-ops-bad-reads", lambda *_: pr.from_ops([], host_reads=[1.0]), TypeError,
     ["from_ops: host_reads must be a list of (start_us, dur_us) pairs", "got [1.0]"]),
]


def _write(path: pathlib.Path, events) -> pathlib.Path:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt") as f:
        json.dump(events, f)
    return path


@pytest.mark.parametrize("call, error, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_wrong_argument_gets_a_clear_error(state, step, saved, trace, tmp_path, call, error, words):
    with pytest.raises(Exception) as caught:
        call(state, step, saved, trace, tmp_path)
    assert not isinstance(caught.value, RAW), f"a raw {type(caught.value).__name__}: {caught.value}"
    assert type(caught.value) is error, f"{type(caught.value).__name__}: {caught.value}"
    message = str(caught.value)
    for w in words:
        assert w in message, f"{w!r} not in {message!r}"
    assert " at 0x" not in message, f"a memory address in {message!r}"


def test_nothing_is_written_for_a_refused_save(tmp_path):
    """A save refused for its arguments creates no directory (Orbax would otherwise make one)."""
    for call in (lambda: ck.save(tmp_path / "a", -1, PARAMS), lambda: ck.save(tmp_path / "b", 1, None)):
        with pytest.raises((TypeError, ValueError)):
            call()
    assert list(tmp_path.iterdir()) == []


def test_accepted_values_still_work(state, step, saved, trace, devices):
    """The checks let through what the functions document: NumPy integers, one device, a whole-number step."""
    assert ss.formula_bytes(np.int64(10), np.int32(8), "fsdp")["params"] == 5.0
    assert ss.ring_bytes("all-reduce", np.float32(100.0), np.int64(4)) == 150.0
    assert ss.ring_bytes("all-gather", 100, 1) == 0.0
    assert ss.data_mesh(devices[:1]).size == 1
    restored, extra = ck.restore(saved, {"w": jnp.zeros(3), "b": jnp.float32(0)}, step=np.int64(5),
                                 devices=devices[:2])
    assert extra == {"position": 5} and restored["w"].tolist() == [0.0, 1.0, 2.0]
    assert list(ck.resume(lambda: iter(range(5)), np.int64(3))) == [3, 4]
    assert pr.summarise(trace)[0]["dispatches"] == 1
    assert ss.params_of(state)["w"].shape == (3,)


JUNK = [None, "x", -1, 0, True, 2.5, [], {}, object()]


def _sweep(state, step, saved, tmp_path):
    """(name, function, valid keyword arguments): each argument is swapped for junk in turn."""
    return [
        ("data_mesh", ss.data_mesh, {"devices": jax.devices(), "axis": "data"}),
        ("init_state", ss.init_state, {"params": PARAMS, "optimizer": OPT, "mesh": ss.data_mesh(),
                                       "stage": "zero1"}),
        ("make_train_step", ss.make_train_step, {"loss_fn": loss_fn, "optimizer": OPT, "stage": "zero1",
                                                 "accumulate": 2, "compute_dtype": jnp.float32}),
        ("params_of", ss.params_of, {"state": state}),
        ("state_bytes", ss.state_bytes, {"state": state}),
        ("compiled_memory", ss.compiled_memory, {"step": step, "state": state, "batch": BATCH}),
        ("formula_bytes", ss.formula_bytes, {"n_params": 10, "n_devices": 8, "stage": "zero2", "param_bytes": 4,
                                             "grad_bytes": 4, "optimizer_copies": 2, "optimizer_bytes": 4}),
        ("collectives", ss.collectives, {"hlo_text": "", "n_devices": 8}),
        ("ring_bytes", ss.ring_bytes, {"op": "all-reduce", "payload": 100, "group": 8}),
        ("dataflow", ss.dataflow, {"step": step, "state": state, "batch": BATCH, "show_devices": 3}),
        ("Checkpoints", ck.Checkpoints, {"directory": tmp_path / "c", "keep": 2, "asynchronous": False}),
        ("save", ck.save, {"directory": tmp_path / "s", "step": 1, "state": PARAMS, "extra": {"position": 1}}),
        ("restore", ck.restore, {"directory": saved, "like": {"w": jnp.zeros(3), "b": jnp.float32(0)}, "step": 5,
                                 "devices": jax.devices()[:2]}),
        ("steps", ck.steps, {"directory": saved}),
        ("latest_step", ck.latest_step, {"directory": saved}),
        ("resume", ck.resume, {"make_batches": lambda: iter(range(5)), "position": 1}),
        ("replicated_on", ck.replicated_on, {"devices": jax.devices()}),
        ("capture", pr.capture, {"directory": tmp_path / "t", "run_step": lambda i: jnp.float32(i), "steps": 1,
                                 "name": "train"}),
        ("find_trace", pr.find_trace, {"directory": tmp_path}),
        ("load", pr.load, {"path": tmp_path / "none.json"}),
        ("summarise", pr.summarise, {"trace": pr.from_ops([])}),
        ("collective_fraction", pr.collective_fraction, {"trace": pr.from_ops([])}),
        ("from_ops", pr.from_ops, {"ops": [], "markers": [], "host_reads": []}),
    ]


@pytest.mark.parametrize("junk", JUNK, ids=[type(j).__name__ + repr(j)[:6] for j in JUNK])
def test_no_raw_python_error_for_any_junk_argument(state, step, saved, tmp_path, monkeypatch, junk):
    """Each argument of each function, swapped for junk, gives course_lib's own error (its message starts with the
    function's name) or a correct result, never a raw one."""
    monkeypatch.chdir(tmp_path)         # a junk str is a valid relative path: keep what it writes out of the tree
    unclear = unclear_errors(_sweep(state, step, saved, tmp_path), junk)
    assert not unclear, "\n".join(unclear)
