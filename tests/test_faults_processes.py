"""Processes under faults: the coordinator listens on loopback only, workers die with their launcher, a wrong
argument stops every worker, a worker without a result fails the job, and the command lines reject bad counts
before any work starts."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from course_lib import bench, distributed, train_dp
from conftest import gone

LOOPBACK_V4 = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it (little-endian hex)
LOOPBACK_V6 = {"00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}  # ::1, ::ffff:127.0.0.1


def listening(port=None):
    """(family, local address hex, port, inode) of every listening TCP socket, from /proc/net/tcp and tcp6."""
    out = []
    for family in ("tcp", "tcp6"):
        with open(f"/proc/net/{family}") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                address, port_hex = fields[1].split(":")
                if fields[3] == "0A" and (port is None or int(port_hex, 16) == port):  # 0A: LISTEN
                    out.append((family, address, int(port_hex, 16), fields[9]))
    return out


def socket_inodes(pid):
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def wait_for(condition, seconds, what):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads Linux's /proc/net")
@pytest.mark.timeout(120)
def test_the_coordinator_listens_on_loopback_only():
    launcher = distributed.Launcher(2, 2, args=["--steps", "10000000"], timeout=100)
    with launcher:
        for i in range(2):
            wait_for(lambda: f"process {i} of 2" in launcher.output(i), 60, f"worker {i} never started training")
        port = int(launcher.coordinator_address.rsplit(":", 1)[1])
        sockets = listening(port)
        assert sockets, f"nothing listens on the coordinator's port {port}"
        for family, address, _, _ in sockets:
            assert (address == LOOPBACK_V4) if family == "tcp" else (address in LOOPBACK_V6), \
                f"the coordinator listens on {family} {address}, not on loopback only"
        # And no other socket of any worker listens beyond loopback.
        worker_sockets = set().union(*(socket_inodes(p.pid) for p in launcher.processes))
        for family, address, port, inode in listening():
            if inode in worker_sockets:
                assert address == LOOPBACK_V4 or address in LOOPBACK_V6, \
                    f"a worker listens on {family} {address}:{port}"


PARENT = """
import sys, time
from course_lib import distributed
launcher = distributed.Launcher(2, 2, args=["--steps", "10000000"], timeout=600, env=ENV)
launcher.start()
print(" ".join(str(p.pid) for p in launcher.processes), flush=True)
deadline = time.monotonic() + 90
while not all(f"process {i} of 2" in launcher.output(i) for i in range(2)):
    assert time.monotonic() < deadline, [launcher.output(i) for i in range(2)]
    time.sleep(0.1)
print("READY", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("parent_death_signal", ["1", "0"], ids=["signal-and-pipe", "pipe-alone"])
@pytest.mark.timeout(150)
def test_a_sigkilled_parent_leaves_no_worker(parent_death_signal):
    env = {**os.environ, "COURSE_PARENT_DEATH_SIGNAL": parent_death_signal}
    code = PARENT.replace("ENV", repr(env))
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    workers = []
    try:
        workers = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(workers) == 2, "the parent did not start two workers"
        assert parent.stdout.readline().strip() == "READY", "the workers never started training"
        assert not any(gone(pid) for pid in workers)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        wait_for(lambda: all(gone(pid) for pid in workers), 10, "a worker outlived its SIGKILLed parent")
    finally:
        for pid in workers:  # only if the test failed: leave nothing behind
            if not gone(pid):
                os.killpg(pid, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        parent.stdout.close()


@pytest.mark.timeout(60)
def test_a_bad_argument_to_wait_stops_every_worker():
    launcher = distributed.Launcher(2, 2, args=["--steps", "10000000"], timeout=60)
    with launcher:
        with pytest.raises(TypeError, match=r"Launcher.wait: poll must be a number of seconds > 0, got None\. "
                                            r"Pass e.g. poll=0.1"):
            launcher.wait(poll=None)
        assert all(p.poll() is not None for p in launcher.processes), "a worker was left running"


@pytest.mark.timeout(60)
def test_a_worker_that_exits_without_a_result_fails_the_job():
    # `python -m this` prints the Zen of Python, ignores its arguments and exits 0: a worker with no RESULT line.
    with pytest.raises(distributed.WorkerFailed) as e:
        distributed.launch(2, 1, module="this", timeout=30)
    message = str(e.value)
    assert "worker 0 (process 0 of 2) exited with code 0 but printed no 'RESULT {json}' line" in message
    assert "must end by printing one" in message and "Namespaces are one honking great idea" in message


@pytest.mark.timeout(180)
def test_non_adjacent_device_rows_train_as_one_process(devices):
    results = distributed.launch(2, 4, args=["--steps", "20", "--interleave-devices"], timeout=150)
    assert "this process feeds device rows 0, 2, 4, 6" in results[0].output
    assert "this process feeds device rows 1, 3, 5, 7" in results[1].output
    assert [owner[1] for owner in results[0].result["device_owners"]] == [0, 1, 0, 1, 0, 1, 0, 1]
    single = train_dp.train(steps=20, log=lambda *_: None)
    for r in results:
        np.testing.assert_allclose(r.result["losses"], single["losses"], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("argv, words", [
    (["--local-devices", "0"], "argument --local-devices: must be a whole number >= 1, got 0; pass 1 or more"),
    (["--local-devices", "two"], "argument --local-devices: must be a whole number >= 1, got 'two'"),
    (["--steps", "-5"], "argument --steps: must be a whole number >= 1, got -5; pass 1 or more"),
    (["--num-processes", "2", "--process-id", "2"], "--process-id must be in 0..1 (--num-processes 2), got 2"),
    (["--coordinator-address", "localhost"], "--coordinator-address must be host:port, e.g. 127.0.0.1:12345"),
])
def test_train_dp_command_line_rejects_bad_values(capsys, argv, words):
    with pytest.raises(SystemExit) as e:
        train_dp.parse_args(argv)
    assert e.value.code == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["--devices", "-1"], "argument --devices: must be a whole number >= 1, got -1; pass 1 or more"),
    (["--devices", "0"], "argument --devices: must be a whole number >= 1, got 0"),
    (["--steps", "0"], "argument --steps: must be a whole number >= 1, got 0"),
    (["--repeats", "-2"], "argument --repeats: must be a whole number >= 1, got -2"),
    (["--scan-steps", "0"], "argument --scan-steps: must be a whole number >= 1, got 0"),
    (["--steps", "15"], "--steps must be a multiple of --scan-steps (10), got 15; pass e.g. --steps 10"),
    (["--global-batch", "100"], "--global-batch must split evenly over every device count the overhead is measured on with --devices 8 (1, 2, 4, 8), got 100; pass a multiple of 8"),
    (["--json", "/nonexistent-folder/bench.json"], "--json must be a file that can be written"),
])
def test_bench_command_line_rejects_bad_values_before_running(capsys, argv, words):
    started = time.monotonic()
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2
    assert words in capsys.readouterr().err
    assert time.monotonic() - started < 5, "rejected before any benchmark ran"


def test_bench_json_folder_is_rejected(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--json", str(tmp_path)])
    assert f"--json must be a file that can be written, got {str(tmp_path)!r}" in capsys.readouterr().err
