"""course_lib.bench at a tiny size: the JSON has every variant, positive times, the same final loss."""

import json
import subprocess
import sys

import pytest

from course_lib import bench

VARIANTS = ["single_jit", "naive_pmap", "pmap", "pmap_scan", "shard_map", "jit_sharded"]


def test_run_reports_every_variant_with_the_same_final_loss(devices):
    report = bench.run(global_batch=64, steps=10, repeats=1, scan_steps=5)
    assert report["machine"]["device_count"] == 8 and report["machine"]["simulated"]
    assert report["machine"]["jax"] and report["machine"]["device_kind"] == "cpu"
    for workload in ("regression", "mlp"):
        results = report["workloads"][workload]
        assert list(results) == VARIANTS
        assert all(r["step_ms"] > 0 for r in results.values())
        losses = [r["final_loss"] for r in results.values()]
        assert max(losses) - min(losses) <= 1e-5 * max(1.0, abs(losses[0])), losses
    text = bench.table(report)
    assert "8 simulated CPU devices" in text and "x single_jit" in text


def test_scan_steps_must_divide_steps(devices):
    with pytest.raises(ValueError, match=r"steps \(10\) must be a multiple of scan_steps \(4\)"):
        bench.run_workload("regression", global_batch=64, steps=10, repeats=1, scan_steps=4)


@pytest.mark.timeout(300)
def test_command_line_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "course_lib.bench", "--steps", "10", "--repeats", "1", "--scan-steps",
                        "5", "--global-batch", "64", "--json", str(out)], capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert set(report["workloads"]) == {"regression", "mlp"}
    assert "JAX" in r.stdout and "regression:" in r.stdout
