"""course_lib.distributed and train_dp: real multi-process training on this machine, and clean failure."""

import os
import signal
import time

import numpy as np
import pytest

from course_lib import distributed, train_dp
from conftest import gone


@pytest.mark.timeout(180)
def test_two_processes_train_to_the_same_loss_as_one_process(devices):
    results = distributed.launch(num_processes=2, devices_per_process=4, args=["--steps", "40"], timeout=150)
    assert [r.returncode for r in results] == [0, 0]
    assert [r.result["process_index"] for r in results] == [0, 1]
    assert all(r.result["devices"] == 8 and r.result["local_devices"] == 4 for r in results)
    assert "this process feeds device rows 4..7" in results[1].output
    single = train_dp.train(steps=40, log=lambda *_: None)          # this process: 8 local devices, one process
    assert single["process_count"] == 1 and single["devices"] == 8
    for r in results:
        np.testing.assert_allclose(r.result["losses"], single["losses"], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(r.result["params"]["w"], single["params"]["w"], rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(120)
def test_a_killed_worker_fails_the_job_fast_and_leaves_nothing_behind():
    launcher = distributed.Launcher(2, 4, args=["--steps", "10000000"], timeout=100)
    launcher.start()
    try:
        deadline = time.monotonic() + 60
        while "process 1 of 2" not in launcher.output(1):
            assert time.monotonic() < deadline, "worker 1 never started training"
            time.sleep(0.1)
        time.sleep(0.5)
        os.killpg(launcher.processes[1].pid, signal.SIGKILL)
        killed_at = time.monotonic()
        with pytest.raises(distributed.WorkerFailed) as e:
            launcher.wait()
        assert time.monotonic() - killed_at < 10, "the launcher noticed within seconds"
        message = str(e.value)
        assert "worker 1 (process 1 of 2) exited with code -9" in message
        assert "the other workers were stopped" in message and "process 1 of 2: 4 local devices" in message
        assert all(p.poll() is not None for p in launcher.processes)
        assert all(gone(p.pid) for p in launcher.processes)
    finally:
        launcher.close()


@pytest.mark.timeout(60)
def test_timeout_stops_every_worker():
    launcher = distributed.Launcher(2, 2, args=["--steps", "10000000"], timeout=4)
    with pytest.raises(distributed.WorkerFailed, match=r"timed out after 4 s with workers \[0, 1\] still running"):
        with launcher:
            launcher.wait()
    assert all(p.poll() is not None for p in launcher.processes)


@pytest.mark.timeout(60)
def test_keyboard_interrupt_stops_every_worker(monkeypatch):
    launcher = distributed.Launcher(2, 2, args=["--steps", "10000000"], timeout=60)

    def interrupted(_):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        with launcher:
            monkeypatch.setattr(distributed, "_sleep", interrupted)
            launcher.wait()
    assert all(p.poll() is not None for p in launcher.processes)


@pytest.mark.timeout(120)
def test_proxy_variables_do_not_reach_the_workers():
    env = {**os.environ, "http_proxy": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
           "grpc_proxy": "http://127.0.0.1:9", "NO_PROXY": "example.invalid"}
    cleaned = distributed.worker_env(4, env)
    assert not {k for k in cleaned if k.lower() in distributed.PROXY_VARIABLES}
    results = distributed.launch(2, 2, args=["--steps", "5"], env=env, timeout=100)
    assert [r.returncode for r in results] == [0, 0]
    assert "proxy" not in results[0].output.lower()


def test_worker_cli_needs_all_three_coordinator_flags_or_none():
    with pytest.raises(SystemExit, match="give all three of --coordinator-address"):
        train_dp.start(train_dp.parse_args(["--process-id", "0"]))


def test_free_port_is_on_loopback_and_free():
    import socket
    port = distributed.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
