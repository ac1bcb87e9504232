"""course_lib.checkpoint: save on 8 devices, restore on 4 and 1, resume exactly; safe saves; clear errors."""

import os
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from course_lib import checkpoint, checkpoint_worker, data, distributed, training

X, Y, _ = data.regression_data(n=1024)
OPT = optax.adam(0.05)


def loss_fn(params, batch, key):
    return training.masked_mean((batch["x"] @ params["w"] + params["b"] - batch["y"]) ** 2, batch["mask"])


def fresh(devs):
    return training.init_state({"w": jnp.zeros(3), "b": jnp.float32(0.0)}, OPT, jax.random.key(1), devs,
                               backend="shard_map")


def make_batches(n):
    return lambda: data.batches(X, Y, 64, n_devices=n, seed=3, epochs=None)


def run(state, devs, batches, steps):
    step = training.make_train_step(loss_fn, OPT, devices=devs, backend="shard_map")
    return training.fit(step, state, batches, num_steps=steps, progress=False)


def bits(tree):
    return [np.asarray(x).tobytes() for x in jax.tree.leaves(jax.tree.map(
        lambda v: jax.random.key_data(v) if jax.dtypes.issubdtype(v.dtype, jax.dtypes.prng_key) else v, tree))]


def test_save_on_8_restore_on_4_and_1_and_resume_equals_uninterrupted(tmp_path, devices):
    whole, whole_hist = run(fresh(devices), devices, make_batches(8)(), 150)
    first, _ = run(fresh(devices), devices, make_batches(8)(), 100)
    checkpoint.save(tmp_path / "run", 100, first, {"position": 100})
    assert checkpoint.latest_step(tmp_path / "run") == 100
    for n in (4, 1):
        state, extra = checkpoint.restore(tmp_path / "run", fresh(devices), devices=devices[:n])
        assert extra == {"position": 100}
        assert all(set(x.devices()) == set(devices[:n]) for x in jax.tree.leaves(state))
        assert bits(state) == bits(first)                      # what was saved, bit for bit
    state, extra = checkpoint.restore(tmp_path / "run", fresh(devices), devices=devices)
    resumed, hist = run(state, devices, checkpoint.resume(make_batches(8), extra["position"]), 50)
    assert [h["loss"] for h in hist["train"]] == [h["loss"] for h in whole_hist["train"][100:]]
    assert bits(resumed) == bits(whole)                         # same devices: bitwise
    # On 4 devices the same global batches are summed in another order: equal to float tolerance.
    state4, _ = checkpoint.restore(tmp_path / "run", fresh(devices), devices=devices[:4])
    resumed4, _ = run(state4, devices[:4], checkpoint.resume(make_batches(4), 100), 50)
    np.testing.assert_allclose(resumed4.params["w"], whole.params["w"], rtol=1e-4, atol=1e-5)


def test_resume_skips_the_batches_already_used():
    again = list(checkpoint.resume(lambda: iter(range(10)), 7))
    assert again == [7, 8, 9]
    with pytest.raises(ValueError, match="position must be a whole number"):
        checkpoint.resume(lambda: iter(range(3)), -1)


def test_keep_and_asynchronous_save(tmp_path, devices):
    state = fresh(devices)
    with checkpoint.Checkpoints(tmp_path / "run", keep=2, asynchronous=True) as ckpt:
        for step in (10, 20, 30):
            ckpt.save(step, state, {"position": step})
        ckpt.wait()
        assert ckpt.steps() == [20, 30]
    assert sorted(os.listdir(tmp_path / "run")) == ["20", "30"]


def test_a_save_killed_mid_way_leaves_the_previous_checkpoint_restorable(tmp_path):
    directory = tmp_path / "run"
    checkpoint.save(directory, 100, {"w": jnp.arange(3.0)}, {"position": 100})
    report = checkpoint_worker.crash_mid_save(directory, 200, megabytes=32)
    assert report["returncode"] == -9 and report["killed_mid_save"], report
    assert any(name.startswith("200" + checkpoint.TMP_MARKER) for name in report["left_behind"])
    assert checkpoint.steps(directory) == [100]                 # the half-written step does not count
    state, extra = checkpoint.restore(directory, {"w": jnp.zeros(3)})
    assert extra == {"position": 100} and state["w"].tolist() == [0.0, 1.0, 2.0]


def test_truncated_or_corrupted_checkpoint_gets_a_clear_error(tmp_path):
    directory = tmp_path / "run"
    for step in (1, 2):
        checkpoint.save(directory, step, {"w": jnp.arange(3.0)})
    for f in (directory / "2").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(f.read_bytes()[:10])                  # truncated data files
    with pytest.raises(checkpoint.CheckpointError, match=r"step 2 in run/ could not be read; it looks damaged"):
        checkpoint.restore(directory, {"w": jnp.zeros(3)}, step=2)
    (directory / "1" / "state" / "_METADATA").write_text("{not json")
    with pytest.raises(checkpoint.CheckpointError, match=r"step 1 in run/ .*damaged.*Restore another step \(\[2\]\)"):
        checkpoint.restore(directory, {"w": jnp.zeros(3)}, step=1)


def test_clear_errors(tmp_path, devices):
    directory = tmp_path / "run"
    with pytest.raises(checkpoint.CheckpointError, match="does not exist"):
        checkpoint.restore(directory, {"w": jnp.zeros(3)})
    checkpoint.save(directory, 5, {"w": jnp.arange(8.0), "b": jnp.float32(1)})
    with pytest.raises(checkpoint.CheckpointError, match="step=7 is not in run/; the steps there are \\[5\\]"):
        checkpoint.restore(directory, {"w": jnp.zeros(8), "b": jnp.float32(0)}, step=7)
    with pytest.raises(checkpoint.CheckpointError, match="does not match step 5"):
        checkpoint.restore(directory, {"w": jnp.zeros(8)})
    with pytest.raises(checkpoint.CheckpointError, match="does not match step 5"):
        checkpoint.restore(directory, {"w": jnp.zeros(6), "b": jnp.float32(0)})
    with pytest.raises(ValueError, match="already holds step 5"):
        checkpoint.save(directory, 3, {"w": jnp.arange(8.0), "b": jnp.float32(1)})
    (tmp_path / "a_file").write_text("")
    with pytest.raises((NotADirectoryError, PermissionError), match="directory="):
        checkpoint.save(tmp_path / "a_file" / "run", 1, {"w": jnp.zeros(3)})
    # a file where the directory should be: said so, not "does not exist"
    with pytest.raises(NotADirectoryError, match="restore: directory='a_file' is a file, not a checkpoint directory"):
        checkpoint.restore(tmp_path / "a_file", {"w": jnp.zeros(8), "b": jnp.float32(0)})
    # devices= that is not a list: the message shows the value passed (4), not what the check turned it into
    with pytest.raises(TypeError, match=r"devices must be a list of jax.Device, got 4\. Pass e\.g\. devices="):
        checkpoint.restore(directory, {"w": jnp.zeros(8), "b": jnp.float32(0)}, devices=4)
    with pytest.raises(ValueError, match=r"devices must be a non-empty list of jax.Device, got \(\)\."):
        checkpoint.restore(directory, {"w": jnp.zeros(8), "b": jnp.float32(0)}, devices=())
    with pytest.raises(TypeError, match=r"devices must be a list of jax.Device, got \(0, 1\)\. It holds int 0"):
        checkpoint.restore(directory, {"w": jnp.zeros(8), "b": jnp.float32(0)}, devices=(0, 1))
    split3 = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(devices[:3]), ("d",)),
                                        jax.sharding.PartitionSpec("d"))
    with pytest.raises(ValueError, match="evenly divide"):
        checkpoint.restore(directory, {"w": jnp.zeros(8), "b": jnp.float32(0)},
                           sharding={"w": split3, "b": checkpoint.replicated_on(devices[:3])})


def test_two_processes_save_together_and_one_process_restores(tmp_path, devices):
    directory = tmp_path / "mp"
    results = distributed.launch(2, 4, module="course_lib.checkpoint_worker",
                                 args=["--directory", str(directory), "--steps", "20", "--save-every", "10"],
                                 timeout=180)
    assert [r.result["saved"] for r in results] == [[10, 20], [10, 20]]
    assert "checkpoint saved" in results[0].output and "checkpoint saved" not in results[1].output
    # the logged loss has 4 decimals: more would print the processor's rounding (lesson 11 shows these lines)
    assert re.findall(r"step (\d+): loss \d\.\d{4}, checkpoint saved", results[0].output) == ["10", "20"]
    step_dir = directory / "20" / "state"
    assert {p.name for p in step_dir.iterdir() if p.name.startswith("ocdbt.process_")} == \
        {"ocdbt.process_0", "ocdbt.process_1"}                  # both processes wrote arrays
    assert len(list(step_dir.glob("_METADATA"))) == 1          # one metadata file, by process 0
    like = {"state": training.init_state({"w": jnp.zeros(3), "b": jnp.float32(0.0)}, optax.sgd(0.1),
                                         jax.random.key(0), devices, backend="jit"),
            "last_batch_x": jnp.zeros((8, 8, 3))}
    state, extra = checkpoint.restore(directory, like, devices=devices)
    assert extra["position"] == 20
    np.testing.assert_array_equal(np.asarray(state["state"].params["w"]), results[0].result["params"]["w"])


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_unwritable_directory_gets_a_clear_error(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(PermissionError, match="cannot be written.*Pass a directory you can write to"):
            checkpoint.save(locked / "run", 1, {"w": jnp.zeros(3)})
    finally:
        locked.chmod(0o700)


def test_a_dtype_mismatch_is_an_error_not_a_silent_cast(tmp_path):
    checkpoint.save(tmp_path / "run", 1, {"w": jnp.full(3, 0.1)})
    for dtype in (jnp.int32, jnp.float16, jnp.bfloat16):
        with pytest.raises(checkpoint.CheckpointError, match=f"leaf w was saved as float32, like= asks for "
                                                             f"{jnp.dtype(dtype).name}.*does not cast"):
            checkpoint.restore(tmp_path / "run", {"w": jnp.zeros(3, dtype)})
    state, _ = checkpoint.restore(tmp_path / "run", {"w": jnp.zeros(3)})
    assert state["w"].dtype == jnp.float32 and state["w"].tolist() == np.full(3, 0.1, np.float32).tolist()


def test_two_managers_cannot_save_into_one_directory(tmp_path):
    first = checkpoint.Checkpoints(tmp_path / "run", keep=2, asynchronous=True)
    second = checkpoint.Checkpoints(tmp_path / "run", keep=2, asynchronous=True)
    try:
        first.save(10, {"w": jnp.ones(3)})
        with pytest.raises(checkpoint.CheckpointError, match="another Checkpoints .* is saving into run/"):
            second.save(10, {"w": jnp.ones(3)})                 # the same step at once: refused, nothing written
        with pytest.raises(checkpoint.CheckpointError, match="another Checkpoints"):
            second.save(20, {"w": jnp.ones(3)})
        for step in (20, 30):
            first.save(step, {"w": jnp.full(3, float(step))})
    finally:
        first.close()
    assert checkpoint.steps(tmp_path / "run") == [20, 30]      # keep=2 holds: nothing lost, nothing extra
    second.save(40, {"w": jnp.ones(3)})                          # the directory is free once the first closed
    second.close()
    assert checkpoint.steps(tmp_path / "run") == [30, 40]


def test_a_nan_state_is_refused_and_the_last_finite_step_kept(tmp_path):
    with checkpoint.Checkpoints(tmp_path / "run", keep=1) as ckpt:
        ckpt.save(1, {"w": jnp.ones(3), "k": jax.random.key(0), "n": jnp.int32(3)})
        for bad in (jnp.nan, jnp.inf, -jnp.inf):
            with pytest.raises(ValueError, match=r"state leaf \['w'\] holds NaN or infinity at step 2: not saved.*"
                                                 r"keep=1.*the newest saved step, 1, is still in run/"):
                ckpt.save(2, {"w": jnp.array([1.0, bad, 2.0]), "k": jax.random.key(0), "n": jnp.int32(3)})
        ckpt.save(2, {"w": jnp.full(3, 2.0), "k": jax.random.key(0), "n": jnp.int32(3)})   # a finite one: saved
    assert checkpoint.steps(tmp_path / "run") == [2]
    checkpoint.save(tmp_path / "debug", 1, {"w": jnp.full(3, jnp.nan)})   # keep=None: nothing deleted, saved
    assert np.isnan(checkpoint.restore(tmp_path / "debug", {"w": jnp.zeros(3)})[0]["w"]).all()


def test_a_resumed_run_removes_the_half_written_step_of_a_crash(tmp_path):
    directory = tmp_path / "run"
    checkpoint.save(directory, 100, {"w": jnp.arange(3.0)}, {"position": 100})
    report = checkpoint_worker.crash_mid_save(directory, 200, megabytes=32)
    assert "200" + checkpoint.TMP_MARKER in report["left_behind"]
    checkpoint.restore(directory, {"w": jnp.zeros(3)})               # reading leaves it alone
    assert "200" + checkpoint.TMP_MARKER in os.listdir(directory)
    with checkpoint.Checkpoints(directory) as ckpt:                  # the resumed run saves another step
        ckpt.save(150, {"w": jnp.arange(3.0) + 1}, {"position": 150})  # (a save of 200 would replace it anyway)
    assert sorted(os.listdir(directory)) == ["100", "150"]
    assert checkpoint.restore(directory, {"w": jnp.zeros(3)})[0]["w"].tolist() == [1.0, 2.0, 3.0]


def test_a_sharded_state_moves_to_another_device_count(tmp_path, devices):
    from course_lib import sharded_state as ss
    params = {"w": jnp.arange(3.0), "b": jnp.float32(1.0)}               # 4 numbers: padded to 8 on 8 devices
    adam = optax.adam(0.1)
    saved = ss.init_state(params, adam, ss.data_mesh(devices), stage="fsdp")
    step = ss.make_train_step(lambda p, b: jnp.mean((b["x"] @ p["w"] + p["b"] - b["y"]) ** 2), adam, stage="fsdp")
    batch = {"x": np.ones((24, 3), np.float32), "y": np.zeros(24, np.float32)}
    saved, _ = step(saved, batch)
    checkpoint.save(tmp_path / "run", 1, saved)
    for count in (4, 3):
        like = ss.init_state(jax.tree.map(jnp.zeros_like, params), adam, ss.data_mesh(devices[:count]), stage="fsdp")
        state, _ = checkpoint.restore(tmp_path / "run", like)
        assert state.params.shape == like.params.shape and state.params.sharding == like.params.sharding
        for got, want in zip(jax.tree.leaves(ss.params_of(state)), jax.tree.leaves(ss.params_of(saved))):
            np.testing.assert_array_equal(got, want)
        mu = [x for x in jax.tree.leaves(state.opt_state) if np.ndim(x) == 1][0]
        np.testing.assert_array_equal(np.asarray(mu)[:4], np.asarray(
            [x for x in jax.tree.leaves(saved.opt_state) if np.ndim(x) == 1][0])[:4])
        state, _ = step(state, batch)                                    # and it trains on the new mesh
        assert np.isfinite(np.asarray(state.params)).all()
    with pytest.raises(ValueError, match="like= is a sharded_state.ShardedState laid out on 8 devices.*"
                                         "devices= \\(3 device\\(s\\)\\)"):
        checkpoint.restore(tmp_path / "run", saved, devices=devices[:3])


def test_orbax_stores_the_sharding_and_a_target_overrides_it(tmp_path, devices):
    import orbax.checkpoint as ocp
    mesh8 = jax.make_mesh((8,), ("data",), devices=devices)
    x = jax.device_put(jnp.arange(32.0).reshape(16, 2), jax.NamedSharding(mesh8, jax.P("data")))
    with ocp.CheckpointManager(tmp_path / "o") as m:
        m.save(1, args=ocp.args.StandardSave({"x": x, "key": jax.random.key(5)}))
        m.wait_until_finished()
        back = m.restore(1, args=ocp.args.StandardRestore())             # no target: where it was saved
        assert back["x"].sharding.is_equivalent_to(x.sharding, 2)
        assert jax.dtypes.issubdtype(back["key"].dtype, jax.dtypes.prng_key)   # a typed key round-trips
        mesh4 = jax.make_mesh((4,), ("data",), devices=devices[4:])
        target = {"x": jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=jax.NamedSharding(mesh4, jax.P("data"))),
                  "key": jax.ShapeDtypeStruct((), jax.random.key(0).dtype,
                                              sharding=jax.NamedSharding(mesh4, jax.P()))}
        moved = m.restore(1, args=ocp.args.StandardRestore(target))
        assert set(moved["x"].devices()) == set(devices[4:]) and moved["x"].sharding.shard_shape((16, 2)) == (4, 2)
        np.testing.assert_array_equal(moved["x"], x)


def test_restore_reads_a_typed_key_that_orbax_saved_itself(tmp_path, devices):
    import orbax.checkpoint as ocp
    state = fresh(devices)
    with ocp.CheckpointManager(tmp_path / "run") as m:
        m.save(100, args=ocp.args.Composite(state=ocp.args.StandardSave(state), extra=ocp.args.JsonSave({"p": 1})))
        m.wait_until_finished()
    restored, extra = checkpoint.restore(tmp_path / "run", fresh(devices), devices=devices[:2])
    assert extra == {"p": 1} and bits(restored) == bits(state)
    assert jax.dtypes.issubdtype(restored.key.dtype, jax.dtypes.prng_key)


def test_a_step_orbax_saved_alone_is_not_called_damaged(tmp_path):
    import orbax.checkpoint as ocp
    directory = tmp_path / "run"
    with ocp.CheckpointManager(directory) as manager:                 # one unnamed item, no state/extra layout
        manager.save(7, args=ocp.args.StandardSave({"w": jnp.arange(3.0)}))
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.restore(directory, {"w": jnp.zeros(3)})
    assert "saved by Orbax directly" in str(err.value) and "damaged" not in str(err.value)
    assert "delete" not in str(err.value)
    assert checkpoint.steps(directory) == [7]                         # nothing was touched
    with ocp.CheckpointManager(directory) as manager:
        assert manager.restore(7, args=ocp.args.StandardRestore({"w": jnp.zeros(3)}))["w"].tolist() == [0.0, 1.0, 2.0]
