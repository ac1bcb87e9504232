"""course_lib.bench at a tiny size: the JSON has every variant, positive times, the same final loss."""

import json
import subprocess
import sys

import pytest

from course_lib import bench

VARIANTS = ["single_jit", "naive_pmap", "pmap_step", "pmap_scan", "shard_map", "jit_sharded", "fsdp", "accumulate"]


def test_run_reports_every_variant_with_the_same_final_loss(devices):
    report = bench.run(global_batch=64, steps=10, repeats=1)
    assert report["machine"]["device_count"] == 8 and report["machine"]["simulated"]
    assert report["machine"]["jax"] and report["machine"]["device_kind"] == "cpu"
    assert report["settings"]["scan_steps"] == 10, "the default path: fit's steps_per_call"
    assert report["default_variant"] == "pmap_scan"
    for workload in ("regression", "mlp"):
        results = report["workloads"][workload]
        assert list(results) == VARIANTS
        assert all(r["step_ms"] > 0 for r in results.values())
        losses = [r["final_loss"] for r in results.values()]
        assert max(losses) - min(losses) <= 1e-5 * max(1.0, abs(losses[0])), losses
    assert set(report["goals"]) == {"mlp_default_vs_single_jit", "regression_naive_vs_default"}
    for g in report["goals"].values():
        assert g["ratio"] > 0 and isinstance(g["met"], bool)
    text = bench.table(report)
    assert "8 simulated CPU devices" in text and "x single_jit" in text and "<- default" in text
    assert "goals:" in text


def test_goals_compare_the_default_path_with_the_two_references():
    def result(ms):
        return {"step_ms": ms, "final_loss": 0.0}

    report = {"workloads": {"mlp": {"single_jit": result(1.0), "pmap_scan": result(1.3)},
                            "regression": {"naive_pmap": result(2.0), "pmap_scan": result(0.5)}}}
    g = bench.goals(report)
    assert g["mlp_default_vs_single_jit"] == {"ratio": 1.3, "goal": "<= 1.25", "met": False}
    assert g["regression_naive_vs_default"] == {"ratio": 4.0, "goal": ">= 3", "met": True}
    report["workloads"]["mlp"]["pmap_scan"] = result(1.2)
    report["workloads"]["regression"]["pmap_scan"] = result(0.8)
    g = bench.goals(report)
    assert g["mlp_default_vs_single_jit"]["met"] and not g["regression_naive_vs_default"]["met"]


def test_another_scan_steps_is_not_the_default_path_and_reports_no_goals(devices):
    report = bench.run(global_batch=64, steps=10, repeats=1, scan_steps=5, workload_names=("regression",),
                       variants=("naive_pmap", "pmap_scan"))
    assert report["default_variant"] is None and report["goals"] == {}
    assert list(report["workloads"]["regression"]) == ["naive_pmap", "pmap_scan"]
    assert "<- default" not in bench.table(report)


@pytest.mark.parametrize("kwargs, message", [
    (dict(steps=10, scan_steps=4), r"steps \(10\) must be a multiple of scan_steps \(4\)"),
    (dict(steps=10, global_batch=60), r"global_batch \(60\) must divide over the 8 devices"),
    (dict(steps=10, variants=("pmap_fast",)), r"unknown variants \['pmap_fast'\]"),
])
def test_bad_settings_are_named(devices, kwargs, message):
    with pytest.raises(ValueError, match=message):
        bench.run_workload("regression", **{"global_batch": 64, "repeats": 1, **kwargs})


@pytest.mark.timeout(300)
def test_command_line_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "course_lib.bench", "--steps", "10", "--repeats", "1",
                        "--global-batch", "64", "--json", str(out)], capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert set(report["workloads"]) == {"regression", "mlp"}
    assert all(list(w) == VARIANTS for w in report["workloads"].values())
    assert "JAX" in r.stdout and "regression:" in r.stdout and "goals:" in r.stdout
