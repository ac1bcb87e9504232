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
    for s in profile.summarise(fused).values():
        assert s["dispatches"] == 2 and s["steps"] == 10           # five all-reduces inside each dispatch
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
