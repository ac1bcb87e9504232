"""course_lib.bench at a tiny size: the JSON's structure, the same final loss everywhere, and the techniques it
measures (donated state, batches placed ahead) doing what they claim."""

import json
import subprocess
import sys

import jax
import numpy as np
import optax
import pytest

from course_lib import bench, data, training

VARIANTS = ["single_jit", "naive_pmap", "pmap_step", "fsdp", "accumulate",
            "single_scan", "pmap_scan", "shard_map", "shard_map_per_leaf", "jit_sharded"]


def _same(losses):
    return max(losses) - min(losses) <= 1e-5 * max(1.0, abs(losses[0]))


def test_the_command_reports_every_variant_the_overhead_and_the_same_final_loss(devices, tmp_path, capsys):
    # The command's own entry point, in this process (its 8 devices): the printed table and the JSON it writes.
    out = tmp_path / "bench.json"
    assert bench.main(["--devices", "8", "--global-batch", "64", "--steps", "10", "--repeats", "1",
                       "--extra-batches", "32", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert set(report) == {"machine", "settings", "default_variant", "workloads", "fusion_gain", "overhead",
                           "without_allreduce", "allreduce", "goals"}
    text = bench.table(report)
    assert printed.startswith(text) and printed.rstrip().endswith(f"written: {out}")
    assert report["machine"]["device_count"] == 8 and report["machine"]["simulated"]
    assert report["machine"]["jax"] and report["machine"]["device_kind"] == "cpu"
    assert report["settings"]["scan_steps"] == 10, "the default path: fit's steps_per_call"
    assert report["settings"]["device_counts"] == [1, 2, 4, 8]
    assert report["settings"]["overhead_batches"] == [64, 32]
    assert report["default_variant"] == "pmap_scan"
    for workload in ("regression", "mlp"):
        results = report["workloads"][workload]
        assert list(results) == VARIANTS
        assert all(r["step_ms"] > 0 for r in results.values())
        assert _same([r["final_loss"] for r in results.values()])
        gain = report["fusion_gain"][workload]
        assert gain == pytest.approx(results["single_jit"]["step_ms"] / results["single_scan"]["step_ms"], rel=1e-2)
        for batch in ("64", "32"):
            row = report["overhead"][workload][batch]
            assert list(row) == ["1", "2", "4", "8"]
            assert row["1"]["overhead"] == 1.0
            for r in row.values():
                assert r["overhead"] == pytest.approx(r["step_ms"] / row["1"]["step_ms"], rel=1e-2)
        # at the main batch, 1 device is single_scan and 8 are the default path: the same timed runs
        assert report["overhead"][workload]["64"]["1"]["step_ms"] == results["single_scan"]["step_ms"]
        assert report["overhead"][workload]["64"]["8"]["step_ms"] == results["pmap_scan"]["step_ms"]
        # the same path on 8 devices without its all-reduce: timed in the same rounds, over the same 1-device time
        for batch in ("64", "32"):
            bare = report["without_allreduce"][workload][batch]
            assert bare["devices"] == 8 and bare["step_ms"] > 0
            assert bare["overhead"] == pytest.approx(bare["step_ms"] / report["overhead"][workload][batch]["1"]
                                                     ["step_ms"], rel=1e-2)
    # one all-reduce on its own, for one number and each workload's buffer, on 2, 4 and 8 devices
    assert list(report["allreduce"]) == ["1 number", "regression", "mlp"]
    assert [r["size"] for r in report["allreduce"].values()] == [1, bench.buffer_size("regression"),
                                                                 bench.buffer_size("mlp")]
    for r in report["allreduce"].values():
        assert list(r["ms"]) == ["2", "4", "8"] and all(ms >= 0 for ms in r["ms"].values())
    # no overhead goal at these batches; the regression goal is there
    assert set(report["goals"]) == {"regression_naive_vs_default"}
    assert all(isinstance(g["met"], bool) for g in report["goals"].values())
    assert "8 simulated CPU devices" in text and "x single_scan" in text and "<- default" in text
    assert "one dispatch per step, x single_jit:" in text and "10 steps fused per dispatch, x single_scan:" in text
    assert "<- reference" in text and "fusion's gain" in text and "data-parallel overhead" in text
    assert "no all-reduce" in text and "one all-reduce on its own" in text and "mlp (19,212)" in text
    assert "goals:" in text


def test_the_default_path_on_every_device_count_reaches_the_same_loss(devices):
    m = bench.measure("mlp", global_batch=64, steps=10, repeats=1, variants=("single_jit",),
                      device_counts=(1, 2, 4, 8))
    assert list(m["variants"]) == ["single_jit"] and list(m["devices"]) == [1, 2, 4, 8]
    assert _same([r["final_loss"] for r in m["devices"].values()] + [m["variants"]["single_jit"]["final_loss"]])


def _result(ms):
    return {"step_ms": ms, "final_loss": 0.0}


def _report(mlp_512, mlp_256, naive, default):
    return {"workloads": {"regression": {"naive_pmap": _result(naive), "pmap_scan": _result(default)}},
            "overhead": {"mlp": {"512": {"1": {"step_ms": 1.0, "overhead": 1.0},
                                         "8": {"step_ms": mlp_512, "overhead": mlp_512}},
                                 "256": {"1": {"step_ms": 1.0, "overhead": 1.0},
                                         "8": {"step_ms": mlp_256, "overhead": mlp_256}}}}}


def test_buffer_size_is_what_the_default_step_sends_in_its_all_reduce(devices):
    """The all-reduce the benchmark times on its own carries as many numbers as the MLP step's one all-reduce."""
    params, loss_fn, x, y, opt = bench.workloads("mlp", 64)
    step = training.make_train_step(loss_fn, opt)
    state = training.init_state(params, opt, jax.random.key(0))
    hlo = step.lower(state, next(data.batches(x, y, 64))).compile().as_text()
    reduces = [line for line in hlo.splitlines() if " all-reduce(" in line]
    assert len(reduces) == 1 and f"f32[{bench.buffer_size('mlp')}]" in reduces[0], reduces


def test_without_allreduce_is_the_default_path_minus_its_collective(devices):
    """The diagnostic path runs, measure times it in the same rounds, and it does not train like the data-parallel
    path: its all-reduce is gone."""
    setup = bench.Setup("mlp", 64, 10, 10)
    start, run = setup.without_allreduce(8)
    loss = run(start())
    assert np.isfinite(loss)
    m = bench.measure("mlp", global_batch=64, steps=10, repeats=1, variants=(), device_counts=(1, 8),
                      without_allreduce=(8,))
    assert list(m["without_allreduce"]) == [8] and m["without_allreduce"][8]["step_ms"] > 0
    # each device trains on its own eighth of the batch: not the data-parallel loss
    assert m["without_allreduce"][8]["final_loss"] != pytest.approx(m["devices"][8]["final_loss"], rel=1e-5)


def test_goals_read_the_overhead_against_single_scan_and_the_naive_loop():
    g = bench.goals(_report(1.3, 1.4, 2.0, 0.5))
    assert g["mlp_overhead_8dev_batch512"] == {"ratio": 1.3, "goal": "<= 1.25", "met": False, "limit": 1.0,
                                               "from_limit": 0.3}
    assert g["mlp_overhead_8dev_batch256"]["met"] and g["mlp_overhead_8dev_batch256"]["from_limit"] == 0.4
    assert g["regression_naive_vs_default"] == {"ratio": 4.0, "goal": ">= 3", "met": True}
    g = bench.goals(_report(1.2, 1.6, 2.0, 0.8))
    assert g["mlp_overhead_8dev_batch512"]["met"] and not g["mlp_overhead_8dev_batch256"]["met"]
    assert not g["regression_naive_vs_default"]["met"]
    assert "mlp_overhead_8dev_batch512" not in bench.goals({"workloads": {}, "overhead": {}})
    # beside each overhead goal: the same path without its all-reduce, and one all-reduce over the 1-device step
    report = _report(1.6, 1.8, 2.0, 0.5)
    report["without_allreduce"] = {"mlp": {"512": {"devices": 8, "step_ms": 0.9, "overhead": 0.9},
                                           "256": {"devices": 4, "step_ms": 0.95, "overhead": 0.95}}}
    report["allreduce"] = {"mlp": {"size": 19212, "ms": {"8": 0.25}}}
    g = bench.goals(report)
    assert g["mlp_overhead_8dev_batch512"]["without_allreduce"] == 0.9
    assert g["mlp_overhead_8dev_batch512"]["allreduce_ms"] == 0.25
    assert g["mlp_overhead_8dev_batch512"]["allreduce_share"] == 0.25       # over the 1-device step, 1.0 ms
    assert "without_allreduce" not in g["mlp_overhead_8dev_batch256"], "measured on 4 devices, not the goal's 8"


def test_another_scan_steps_is_not_the_default_path_and_reports_no_goals(devices):
    report = bench.run(global_batch=64, steps=10, repeats=1, scan_steps=5, workload_names=("regression",),
                       variants=("single_scan", "naive_pmap", "pmap_scan"), extra_batches=(), device_counts=(1, 8))
    assert report["default_variant"] is None and report["goals"] == {}
    assert list(report["workloads"]["regression"]) == ["naive_pmap", "single_scan", "pmap_scan"]   # VARIANTS order
    assert list(report["overhead"]["regression"]["64"]) == ["1", "8"]
    assert "<- default" not in bench.table(report)


def test_a_new_variant_is_a_few_lines(devices, monkeypatch):
    monkeypatch.setitem(bench.VARIANTS, "pmap_scan_k5", lambda s: s.default_path(steps_per_call=5, max_ahead=10))
    res = bench.run_workload("regression", global_batch=64, steps=10, repeats=1, variants=("pmap_scan_k5",
                                                                                           "pmap_scan"))
    assert list(res) == ["pmap_scan", "pmap_scan_k5"] and _same([r["final_loss"] for r in res.values()])


@pytest.mark.parametrize("kwargs, message", [
    (dict(steps=10, scan_steps=4), r"steps \(10\) must be a multiple of scan_steps \(4\)"),
    (dict(steps=10, global_batch=60), r"global_batch \(60\) must divide over the 8 devices"),
    (dict(steps=10, device_counts=(3,)), r"global_batch \(64\) must divide .* device count in \[3\]"),
    (dict(steps=10, variants=("pmap_fast",)), r"unknown variants \['pmap_fast'\]"),
    (dict(steps=10, without_allreduce=(3,)), r"global_batch \(64\) must divide .* device count in \[3\]"),
    (dict(steps=10, without_allreduce=(16,)), r"between 1 and 8"),
])
def test_bad_settings_are_named(devices, kwargs, message):
    with pytest.raises(ValueError, match=message):
        bench.measure("regression", **{"global_batch": 64, "repeats": 1, **kwargs})


# The techniques the benchmark measures, in the library's defaults.

def _mse(p, batch, key):
    return training.masked_mean((batch["x"] @ p["w"] + p["b"] - batch["y"]) ** 2, batch["mask"])


def _setup(n=64):
    x, y, _ = data.regression_data(n=256)
    params = {"w": jax.numpy.zeros(x.shape[1]), "b": jax.numpy.float32(0.0)}
    return params, [b for b, _ in zip(data.batches(x, y, n, epochs=None), range(6))]


@pytest.mark.parametrize("backend", training.BACKENDS)
def test_a_state_donated_to_a_step_cannot_be_read_afterwards(devices, backend):
    params, batches = _setup()
    opt = optax.adam(0.1)
    step = training.make_train_step(_mse, opt, backend=backend)
    assert step.donate
    state = training.init_state(params, opt, jax.random.key(0), backend=backend)
    new, _ = step(state, batches[0])
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves((state.params, state.opt_state)))
    with pytest.raises(RuntimeError, match="deleted"):
        np.asarray(state.params["w"])
    fused, _ = step.steps(new, batches[1:3])
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(new.params))
    final, _ = training.fit(step, fused, batches[3:], progress=False)
    assert jax.tree.leaves(fused.params)[0].is_deleted() and not jax.tree.leaves(final.params)[0].is_deleted()
    # the caller's own parameters are never donated: init_state works on copies
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(params))


def test_donation_off_keeps_the_state_and_computes_the_same(devices):
    params, batches = _setup()
    opt = optax.adam(0.1)
    kept = training.make_train_step(_mse, opt, donate=False)
    state = training.init_state(params, opt, jax.random.key(0))
    s_kept, m_kept = kept(state, batches[0])
    assert not state.params["w"].is_deleted()
    s_donated, m_donated = training.make_train_step(_mse, opt)(state, batches[0])
    assert state.params["w"].is_deleted()
    np.testing.assert_array_equal(np.asarray(s_kept.params["w"]), np.asarray(s_donated.params["w"]))
    assert float(m_kept["loss"][0]) == float(m_donated["loss"][0])


@pytest.mark.parametrize("backend", training.BACKENDS)
def test_batches_placed_ahead_give_the_same_training(devices, backend):
    params, batches = _setup()
    opt = optax.sgd(0.1)
    step = training.make_train_step(_mse, opt, backend=backend)
    placed = step.place(batches[0])
    assert all(isinstance(leaf, jax.Array) and len(leaf.devices()) == 8 for leaf in jax.tree.leaves(placed))
    assert step.place(placed)["x"] is placed["x"], "arrays already in place are not copied again"
    histories = []
    for prefetch in (0, 1, 2):
        state = training.init_state(params, opt, jax.random.key(0), backend=backend)
        _, h = training.fit(step, state, batches, steps_per_call=2, max_ahead=4, prefetch=prefetch, progress=False)
        histories.append([r["loss"] for r in h["train"]])
    assert histories[0] == histories[1] == histories[2] and len(histories[0]) == 6


def test_prefetch_is_checked_and_a_bad_batch_is_named_before_any_transfer(devices):
    params, batches = _setup()
    opt = optax.sgd(0.1)
    step = training.make_train_step(_mse, opt)
    state = training.init_state(params, opt, jax.random.key(0))
    with pytest.raises(ValueError, match=r"prefetch must be a whole number >= 0.*-1"):
        training.fit(step, state, batches, prefetch=-1, progress=False)
    flat = [{k: v.reshape((-1,) + v.shape[2:]) for k, v in b.items()} for b in batches]
    with pytest.raises(ValueError, match=r"must be sharded as \(n_devices=8"):
        training.fit(step, state, flat, prefetch=2, progress=False)


def test_each_variant_is_compared_with_the_reference_of_its_group(devices):
    """Like with like: unfused variants against the unfused one-device step, fused ones against single_scan."""
    assert {v for v in VARIANTS if bench.reference_of(v) == "single_jit"} == {
        "single_jit", "naive_pmap", "pmap_step", "fsdp", "accumulate"}
    assert bench.reference_of("a_new_fused_variant") == "single_scan"
    report = {"machine": bench.machine(), "default_variant": "pmap_scan",
              "settings": {"global_batch": 64, "steps": 10, "repeats": 1, "scan_steps": 10},
              "workloads": {"mlp": {"single_jit": _result(2.0), "pmap_step": _result(3.0),
                                    "single_scan": _result(1.0), "pmap_scan": _result(1.5)}}}
    lines = bench.table(report).splitlines()
    row = {line.split()[0]: line for line in lines if line.startswith("    ")}
    assert "( 1.50x)" in row["pmap_step"], "3.0 ms over single_jit's 2.0, not over single_scan's 1.0"
    assert "( 1.50x)" in row["pmap_scan"] and "<- reference" in row["single_jit"] and "<- reference" in row["single_scan"]


def test_jit_sharded_is_fused_and_sends_one_all_reduce_like_shard_map_per_leaf(devices):
    """The fair sharded-jit path: steps fused with lax.scan, and the count of real rows sent with the gradients."""
    setup = bench.Setup("mlp", 64, 10, 10)
    programs = {}
    for backend, options in [("jit", {"loss_reduction": "sum"}), ("shard_map", {"allreduce": "per_leaf"}),
                             ("jit", {})]:
        loss_fn = bench.workloads("mlp", 64, loss_reduction=options.get("loss_reduction", "mean"))[1]
        step = training.make_train_step(loss_fn, setup.opt, backend=backend, **options)
        state = training.init_state(setup.params, setup.opt, jax.random.key(0), backend=backend)
        fused = step._many.lower(state, step.place(setup.batches()[:10])).compile().as_text()
        assert " while(" in fused or "while" in fused.split("ENTRY")[1], "10 steps in one program, a lax.scan"
        programs[backend, tuple(options)] = [line for line in step.lower(state, setup.batches()[0]).compile()
                                             .as_text().splitlines() if " all-reduce(" in line]
    assert len(programs["jit", ("loss_reduction",)]) == 1
    assert len(programs["shard_map", ("allreduce",)]) == 1
    assert len(programs["jit", ()]) == 2, "a mean over the global batch: the count first, then the gradients"
    res = bench.run_workload("mlp", global_batch=64, steps=10, repeats=1,
                             variants=("single_scan", "shard_map_per_leaf", "jit_sharded"))
    assert _same([r["final_loss"] for r in res.values()])


def test_workloads_sum_and_mean_losses_agree(devices):
    for name in bench.WORKLOADS:
        params, mean_fn, x, y, _ = bench.workloads(name, 64)
        sum_fn = bench.workloads(name, 64, loss_reduction="sum")[1]
        batch = {k: v.reshape((-1,) + v.shape[2:]) for k, v in next(data.batches(x, y, 64)).items()}
        assert float(sum_fn(params, batch, None)) / 64 == pytest.approx(float(mean_fn(params, batch, None)), rel=1e-5)
    with pytest.raises(ValueError, match="loss_reduction"):
        bench.workloads("mlp", 64, loss_reduction="median")


def test_every_batch_must_split_over_every_device_count_measured(devices):
    """The overhead runs on 1, 2, 4 and 8 devices: a batch must split over each, checked before any timing."""
    with pytest.raises(ValueError, match=r"extra_batches must split evenly over every device count .*\(1, 2, 4, 8\), "
                                         r"got 36; pass a multiple of 8"):
        bench.run(global_batch=64, steps=10, repeats=1, extra_batches=(36,), workload_names=("regression",))
    with pytest.raises(ValueError, match=r"global_batch must split evenly .*\(1, 2, 4, 6, 8\), got 40; pass a "
                                         r"multiple of 24"):
        bench.run(global_batch=40, steps=10, repeats=1, extra_batches=(), device_counts=(2, 4, 6, 8),
                  workload_names=("regression",))


def test_command_line_names_the_real_requirement_before_any_work():
    """6 devices: the overhead is measured on 1, 2, 4 and 6, so a global batch must be a multiple of 12, not 6."""
    r = subprocess.run([sys.executable, "-m", "course_lib.bench", "--devices", "6", "--global-batch", "18",
                        "--extra-batches"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "--global-batch must split evenly over every device count" in r.stderr
    assert "(1, 2, 4, 6), got 18; pass a multiple of 12" in r.stderr
    r = subprocess.run([sys.executable, "-m", "course_lib.bench", "--devices", "6", "--global-batch", "24",
                        "--extra-batches", "30"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--extra-batches must split evenly" in r.stderr and "got 30" in r.stderr
