"""tools/measure_hardware.py: its HLO reader on the GPU program lines of notebooks/hardware.md, its wait rule,
and its CPU path end to end (the CPU client's 32; no GPU -> says so, exits 0). The GPU path needs a GPU."""

import importlib.util
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "measure_hardware.py"
spec = importlib.util.spec_from_file_location("measure_hardware", SCRIPT)
mh = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mh)

# Lines of XLA's GPU programs, as hardware.md §3 quotes them.
GPU_LINES = """
  %all-reduce-start = ((f32[19211]{0}), f32[19211]{0}) all-reduce-start(%bitcast.1), channel_id=1
  %all-reduce-done = f32[19211]{0} all-reduce-done(%all-reduce-start)
  %reduce-scatter-start = ((f32[1024,1024]{1,0}), f32[128,1024]{1,0}) reduce-scatter-start(%gemm_fusion_dot.2), channel_id=3
  %reduce-scatter-done = f32[128,1024]{1,0} reduce-scatter-done(%reduce-scatter-start)
  %all-gather.1 = f32[64,192]{1,0} all-gather(%p.3), channel_id=4, dimensions={0}
  %add.2 = f32[8]{0} add(%a, %b)
"""


def test_collectives_reads_async_and_sync_ops_once_each():
    found = mh.collectives(GPU_LINES)
    assert [(op, kind) for op, kind, _ in found] == [
        ("all-reduce", "async"), ("reduce-scatter", "async"), ("all-gather", "sync")]
    assert mh._result(found[1][2]) == "f32[128,1024]", "a -start's arriving half is its result"
    assert mh._result(found[2][2]) == "f32[64,192]"


def test_first_wait_ignores_one_slow_call_and_cannot_tell_when_dispatch_costs_a_step():
    fast, step = 1e-5, 1e-2
    times = [fast] * 5 + [step] + [fast] * 26 + [step] * 10  # one busy moment at #5, the queue full at #32
    assert mh.first_wait(times, step) == 32
    times[31] = step / 8  # busy just before the queue filled up
    assert mh.first_wait(times, step) == 32
    assert mh.first_wait([fast] * 40, step) is None
    assert mh.first_wait([step / 2] * 40, step) == -1


def run(*args, **env):
    e = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=e,
                          timeout=300)


def test_cpu_path_finds_the_cpu_clients_32():
    r = run("--platform", "cpu", "--only", "inflight", "--calls", "40")
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if "matmuls, unrolled" in line or "fori_loop" in line]
    assert len(rows) == 4, r.stdout
    for row in rows:   # counted with is_ready, not timed: the first wait's timing can shift on a busy host
        assert row.split(" | ")[3] == "32 |", f"the CPU client queues 32 executions: {row}"


def test_without_a_gpu_it_says_so_and_exits_0():
    r = run(JAX_PLATFORMS="cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("No GPU here") and "nothing was measured" in r.stdout
    assert "|" not in r.stdout, "no table when nothing was measured"


def test_bad_calls_is_refused_naming_the_argument():
    r = run("--platform", "cpu", "--calls", "1")
    assert r.returncode == 2 and "--calls 1" in r.stderr


class _NoisyJax:
    """Writes to file descriptor 2 as libtpu does from C++ when JAX starts its backends."""

    def __init__(self, found):
        self.found = found

    def devices(self, platform):
        os.write(2, b"Failed to find host bounds for accelerator type\n")
        if not self.found:
            raise RuntimeError(f"Unknown backend: '{platform}' requested\nPlatforms present are: cpu")
        return [f"{platform} device 0"]


def test_backend_start_up_noise_is_held_back_when_there_is_no_gpu(capfd):
    assert mh._start_backends(_NoisyJax(found=False), "gpu") == (None, "Unknown backend: 'gpu' requested")
    assert capfd.readouterr().err == "", "the 'No GPU here' message stands alone"


def test_backend_start_up_output_is_shown_when_the_gpu_is_found(capfd):
    assert mh._start_backends(_NoisyJax(found=True), "gpu") == ("gpu device 0", None)
    assert "host bounds" in capfd.readouterr().err
