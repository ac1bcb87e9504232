"""course_lib.profile: a trace captured here holds the all-reduce, the step boundaries and the host reads."""

import gzip
import json

import jax
import jax.numpy as jnp
import optax
import pytest

from course_lib import data, profile, training


@pytest.fixture(scope="module")
def traces(tmp_path_factory, devices):
    x, y, _ = data.regression_data(n=2048)

    def loss_fn(params, batch, key):
        return training.masked_mean((batch["x"] @ params["w"] + params["b"] - batch["y"]) ** 2, batch["mask"])

    opt = optax.sgd(0.1)
    step = training.make_train_step(loss_fn, opt, backend="shard_map")
    state = training.init_state({"w": jnp.zeros(3), "b": jnp.float32(0.0)}, opt, jax.random.key(0),
                                backend="shard_map")
    bs = [b for b, _ in zip(data.batches(x, y, 128, epochs=None), range(30))]
    holder = {"state": state}
    # Compile first, on a copy: the step donates (takes over) the state it is given.
    s, m = step(jax.tree.map(jnp.copy, state), bs[0]); s, m = step.steps(s, bs[:5]); jax.block_until_ready(m)

    def one_and_read(i):                  # the tutorial loop: one step, then read the loss on the host
        holder["state"], m = step(holder["state"], bs[i])
        return float(m["loss"])

    def five_fused(i):                    # fit's way: five steps in one dispatch, nothing read
        holder["state"], m = step.steps(holder["state"], bs[5 * i:5 * i + 5])
        return m

    root = tmp_path_factory.mktemp("traces")
    return (profile.load(profile.capture(root / "naive", one_and_read, 4)),
            profile.load(profile.capture(root / "fused", five_fused, 2)))


def test_finds_the_all_reduce_and_the_step_boundaries(traces, devices):
    naive, fused = traces
    assert naive.devices == list(range(len(devices)))
    assert [m.step for m in naive.markers] == [0, 1, 2, 3]
    assert all(any(o.collective for o in naive.ops if o.device == d) for d in naive.devices)
    summary = profile.summarise(naive)
    for d, s in summary.items():
        assert s["dispatches"] == 4 and s["steps"] == 4            # one all-reduce per step
        assert s["collective_us"] > 0 and s["compute_us"] > 0 and s["busy_us"] > s["collective_us"]
        runs = naive.dispatches[d]
        # every dispatch lies inside one host step (the step boundaries order the device work)
        assert all(m.start_us <= r.start_us for m, r in zip(naive.markers, runs))
    assert 0 < profile.collective_fraction(naive) < 1


def test_fused_steps_and_host_reads(traces):
    naive, fused = traces
    for s in profile.summarise(fused, steps_per_dispatch=5).values():
        assert s["dispatches"] == 2 and s["steps"] == 10           # five steps fused into each dispatch
        assert s["collectives"] == 10                              # the shard_map step: one all-reduce each
    assert len(naive.host_reads) >= 4                              # a read after every step
    assert len(fused.host_reads) <= 1                              # none inside the loop


def test_plot_timeline_draws_one_row_per_device_and_the_host(traces):
    import matplotlib
    matplotlib.use("Agg")
    ax = profile.plot_timeline(traces[0])
    assert len(ax.get_yticks()) == len(traces[0].devices) + 1
    import matplotlib.pyplot as plt
    plt.close(ax.figure)


def test_bad_input_gets_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="perfetto_trace.json.gz"):
        profile.find_trace(tmp_path)
    bad = tmp_path / "t.json.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="not a readable trace file"):
        profile.load(bad)
    with pytest.raises(ValueError, match="steps must be a whole number"):
        profile.capture(tmp_path, lambda i: None, 0)
    good = tmp_path / "t.json"
    good.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "ts": 0, "dur": 5, "name": "all-reduce.1", "args": {"device_ordinal": "0", "hlo_op": "x",
                                                                          "run_id": "1"}},
        {"ph": "X", "ts": 5, "dur": 15, "name": "fusion", "args": {"device_ordinal": "0", "hlo_op": "y",
                                                                     "run_id": "1"}}]}))
    assert profile.collective_fraction(profile.load(good)) == pytest.approx(0.25)


def test_steps_are_not_counted_from_collectives():
    """A step with 3 collectives (FSDP) is one step, not three: steps come from the dispatches."""
    ops = []
    for run in range(4):
        t = 1000.0 * run
        ops += [profile.Op(0, f"r{run}", "all-gather.1", t, 10.0, True), profile.Op(0, f"r{run}", "fusion", t + 10, 50.0, False),
                profile.Op(0, f"r{run}", "all-gather.2", t + 60, 10.0, True),
                profile.Op(0, f"r{run}", "reduce-scatter.1", t + 70, 10.0, True)]
    s = profile.summarise(profile.from_ops(ops))[0]
    assert s["steps"] == 4 and s["collectives"] == 12 and s["step_us"] == pytest.approx(80.0)
    assert profile.summarise(profile.from_ops(ops), steps_per_dispatch=2)[0]["steps"] == 8
    with pytest.raises(ValueError, match="summarise: steps_per_dispatch must be a whole number >= 1, got 0"):
        profile.summarise(profile.from_ops(ops), steps_per_dispatch=0)


def test_collective_fraction_without_device_ops_is_no_data_not_zero():
    with pytest.raises(ValueError, match="collective_fraction: the trace holds no device ops.*no data"):
        profile.collective_fraction(profile.from_ops([], [profile.Marker(0, 0.0, 5.0)]))


def test_capture_refuses_a_bad_directory_before_any_step_runs(tmp_path):
    ran = []
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    with pytest.raises(NotADirectoryError, match="capture: directory='a_file' cannot hold a trace"):
        profile.capture(a_file, ran.append, 3)
    with pytest.raises(NotADirectoryError, match="capture: directory='t' cannot hold a trace: 'a_file' is a file"):
        profile.capture(a_file / "t", ran.append, 3)
    import os
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        try:
            with pytest.raises(PermissionError, match="capture: directory='t' cannot be written"):
                profile.capture(locked / "t", ran.append, 3)
        finally:
            locked.chmod(0o700)
    assert ran == []                                               # no step ran


def test_timeline_starts_at_zero_and_its_legend_is_above_the_bars(traces):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ax = profile.plot_timeline(traces[1])
    assert ax.get_xlim()[0] == 0
    legend = ax.get_legend()
    ax.figure.canvas.draw()
    box, axes_box = legend.get_window_extent(), ax.get_window_extent()
    assert box.y0 >= axes_box.y1                                   # the legend does not cover any bar
    plt.close(ax.figure)
