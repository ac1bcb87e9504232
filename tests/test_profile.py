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


# ---- GPU and TPU traces (issue 33). Laid out as measured on one NVIDIA H200, JAX 0.11.2 (2026-11):
# shared/hardware/measured.md section 2. One process per device, /device:GPU:0, with ONE line
# "Stream #14(Compute)"; each kernel event is named by the kernel and carries correlation_id, scope_range_id,
# context_id, cuda_graph_id, cuda_graph_node_id, kernel_details, occupancy figures, tf_op, hlo_module and
# hlo_op = command_buffer_1; no event carries device_ordinal or run_id; host step annotations carry step_num;
# a few host events carry device and num_commands.

GPU_KERNELS = ["gemm_fusion_dot_2", "loop_select_subtract_fusion", "loop_multiply_fusion", "input_reduce_fusion"]


def _meta(pid, name, tid=None):
    event = {"ph": "M", "pid": pid, "name": "thread_name" if tid is not None else "process_name",
             "args": {"name": name}}
    if tid is not None:
        event["tid"] = tid
    return event


def _kernel(pid, tid, ts, dur, name, hlo_op, correlation_id):
    return {"ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur, "name": name,
            "args": {"context_id": "1", "correlation_id": str(correlation_id), "cuda_graph_id": "3",
                     "cuda_graph_node_id": str(correlation_id % 7), "scope_range_id": "12",
                     "kernel_details": "regs:184 static_shared:0 dynamic_shared:65536 grid:132,1,1 block:384,1,1",
                     "theoretical_occupancy_pct": "18.75", "occupancy_min_grid_size": "132",
                     "tf_op": "jit(step)/jit(main)/dot_general", "hlo_module": "jit_step", "hlo_op": hlo_op}}


def gpu_trace_events(steps=3, devices=(0,), nccl=False):
    """A Perfetto trace of ``steps`` jitted steps on ``devices``, laid out as measured.md section 2 describes.

    With ``nccl=True`` each device also has an NCCL stream running the step's all-reduce (its hlo_op
    ``all-reduce-start.1``: NCCL collectives are not in XLA's default command-buffer list), overlapping compute.
    """
    events = [_meta(701, "/host:CPU"), _meta(701, "python3", tid=1), _meta(701, "Host Threads/4242", tid=2),
              _meta(702, "/host:metadata"), _meta(703, "Task Environment")]
    for d in devices:
        events += [_meta(d + 1, f"/device:GPU:{d}"), _meta(d + 1, "Stream #14(Compute)", tid=14)]
        if nccl:
            events.append(_meta(d + 1, "Stream #20(Nccl)", tid=20))
    correlation = 100
    for s in range(steps):
        t = 1000.0 * s
        events.append({"ph": "X", "pid": 701, "tid": 1, "ts": t, "dur": 400.0, "name": "train",
                       "args": {"step_num": str(s), "_r": "1"}})
        events.append({"ph": "X", "pid": 701, "tid": 2, "ts": t + 50, "dur": 20.0, "name": "CommandBufferThunk",
                       "args": {"device": "0", "num_commands": "17"}})
        for d in devices:
            k = t + 100.0
            for name in GPU_KERNELS * 4:
                events.append(_kernel(d + 1, 14, k, 9.5, name, "command_buffer_1", correlation))
                correlation += 1
                k += 10.0
            if nccl:
                events.append(_kernel(d + 1, 20, t + 150.0, 80.0, "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                                      "all-reduce-start.1", correlation))
                correlation += 1
    return {"displayTimeUnit": "ns", "traceEvents": events}


def _write_trace(path, trace):
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    return path


def test_load_reads_a_gpu_trace_its_devices_and_kernel_names(tmp_path):
    trace = profile.load(_write_trace(tmp_path / "perfetto_trace.json.gz", gpu_trace_events()))
    assert trace.layout == "gpu" and "/device:GPU:0" in trace.planes
    assert trace.devices == [0]
    assert len(trace.ops) == 3 * 16                              # every kernel of the 3 steps, none of the host's
    # inside a command buffer every kernel's hlo_op is command_buffer_1: the op is named by its kernel
    assert {o.name for o in trace.ops} == set(GPU_KERNELS)
    assert not any(o.collective for o in trace.ops)
    assert [m.step for m in trace.markers] == [0, 1, 2]
    assert trace.dispatches == {}                                # no run_id on a GPU: no dispatches to make


def test_a_gpu_trace_with_nccl_streams_names_the_collectives_on_each_device(tmp_path):
    trace = profile.load(_write_trace(tmp_path / "t.json.gz", gpu_trace_events(2, devices=(0, 1), nccl=True)))
    assert trace.devices == [0, 1]
    coll = [o for o in trace.ops if o.collective]
    assert len(coll) == 4 and {o.name for o in coll} == {"all-reduce-start.1"}   # the HLO name where there is one
    assert {o.device for o in coll} == {0, 1}


def test_load_keeps_a_gpu_streams_events_without_hlo_op_named_by_themselves(tmp_path):
    """measured.md section 2: 54 events on the GPU's stream carry a correlation_id, 51 an hlo_op. The others
    (memory copies) are device work too: trace.ops keeps every event of a stream line, as its errors say."""
    trace = gpu_trace_events(steps=1)
    trace["traceEvents"] += [{"ph": "X", "pid": 1, "tid": 14, "ts": 50.0, "dur": 4.0, "name": "MemcpyD2H",
                              "args": {"correlation_id": "99", "context_id": "1"}},
                             {"ph": "X", "pid": 1, "tid": 14, "ts": 60.0, "dur": 2.0, "name": "MemsetD32",
                              "args": {"correlation_id": "98"}}]
    got = profile.load(_write_trace(tmp_path / "t.json.gz", trace))
    names = [o.name for o in got.ops]
    assert names[:2] == ["MemcpyD2H", "MemsetD32"] and len(names) == 16 + 2
    assert not any(o.collective for o in got.ops[:2]) and {o.device for o in got.ops} == {0}
    with pytest.raises(ValueError) as error:
        profile.summarise(got)
    assert "every event of its stream lines (kernels and memory copies)" in str(error.value)


def test_a_gpu_plane_whose_only_line_is_not_a_stream_and_holds_no_hlo_op_is_no_device_op(tmp_path):
    events = [_meta(1, "/device:GPU:0"), _meta(1, "Launch Stats", tid=3),
              {"ph": "X", "pid": 1, "tid": 3, "ts": 0.0, "dur": 5.0, "name": "occupancy", "args": {}}]
    with pytest.raises(ValueError, match=r"holds no device op.*'Stream' line.*\['/device:GPU:0'\]"):
        profile.load(_write_trace(tmp_path / "t.json.gz", {"traceEvents": events}))


@pytest.mark.parametrize("reader", ["summarise", "collective_fraction", "plot_timeline"])
def test_summaries_refuse_a_gpu_trace_and_say_what_to_use(tmp_path, reader):
    trace = profile.load(_write_trace(tmp_path / "t.json.gz", gpu_trace_events(nccl=True)))
    with pytest.raises(ValueError) as error:
        getattr(profile, reader)(trace)
    message = str(error.value)
    assert message.startswith(f"{reader}: this trace is a GPU trace (/device:GPU:0")
    assert "CPU runtime's layout only" in message and "device_ordinal" in message
    assert "count the same time twice" in message                # async collectives overlap compute
    assert "XProf" in message and "ui.perfetto.dev" in message
    assert "XLA_FLAGS=--xla_gpu_enable_command_buffer=" in message


def test_load_reads_a_tpu_trace_from_its_xla_ops_line(tmp_path):
    events = [_meta(1, "/device:TPU:0"), _meta(1, "XLA Modules", tid=1), _meta(1, "XLA Ops", tid=2),
              _meta(2, "/device:TPU:1"), _meta(2, "XLA Modules", tid=1), _meta(2, "XLA Ops", tid=2)]
    for pid in (1, 2):
        events.append({"ph": "X", "pid": pid, "tid": 1, "ts": 0.0, "dur": 100.0, "name": "jit_step(1)",
                       "args": {}})
        events += [{"ph": "X", "pid": pid, "tid": 2, "ts": 10.0, "dur": 30.0, "name": "fusion.3", "args": {}},
                   {"ph": "X", "pid": pid, "tid": 2, "ts": 40.0, "dur": 50.0, "name": "all-reduce.1", "args": {}}]
    trace = profile.load(_write_trace(tmp_path / "t.json.gz", {"traceEvents": events}))
    assert trace.layout == "tpu" and trace.devices == [0, 1]
    assert [o.name for o in trace.ops if o.device == 1] == ["fusion.3", "all-reduce.1"]   # not the module line
    assert [o.collective for o in trace.ops if o.device == 0] == [False, True]
    with pytest.raises(ValueError, match="summarise: this trace is a TPU trace"):
        profile.summarise(trace)


def test_a_cpu_fallback_on_a_gpu_machine_reads_the_cpu_ops(tmp_path):
    """The lessons fall back to simulated CPU devices on a one-GPU machine (measured.md section 5): the
    trace then holds an idle GPU plane beside the CPU runtime's ops, and those are what load reads."""
    trace = gpu_trace_events(steps=1)
    trace["traceEvents"] += [
        {"ph": "X", "pid": 701, "tid": 3, "ts": 5000.0 + 10 * k, "dur": 8.0, "name": name,
         "args": {"device_ordinal": str(d), "hlo_op": name, "run_id": "7", "hlo_module": "jit_step"}}
        for d in range(2) for k, name in enumerate(["fusion", "psum_invariant"])]
    got = profile.load(_write_trace(tmp_path / "t.json.gz", trace))
    assert got.layout == "cpu" and got.devices == [0, 1]
    assert profile.summarise(got)[1]["collectives"] == 1


def test_load_without_any_device_op_raises_naming_the_layouts_and_what_it_found(tmp_path):
    host_only = {"traceEvents": [_meta(701, "/host:CPU"), _meta(9, "/device:GPU:0"),
                                 {"ph": "X", "pid": 701, "tid": 1, "ts": 0, "dur": 5, "name": "train",
                                  "args": {"step_num": "0"}},
                                 {"ph": "X", "pid": 9, "tid": 1, "ts": 0, "dur": 5, "name": "MemcpyH2D",
                                  "args": {"correlation_id": "4"}}]}
    with pytest.raises(ValueError) as error:
        profile.load(_write_trace(tmp_path / "host_only.json.gz", host_only))
    message = str(error.value)
    assert "load: path='host_only.json.gz' holds no device op" in message
    assert "device_ordinal" in message and "/device:GPU:N" in message and "XLA Ops" in message
    assert "['/device:GPU:0', '/host:CPU']" in message and "XProf" in message


def test_summarise_of_a_trace_without_ops_raises_instead_of_returning_empty():
    with pytest.raises(ValueError, match="summarise: the trace holds no device ops.*not zero"):
        profile.summarise(profile.from_ops([]))


# ---- lesson 11's own reader (the notebook's device_ops), run on planes laid out as measured.md section 2

import pathlib
import types

NOTEBOOK = pathlib.Path(__file__).resolve().parent.parent / "notebooks" / "11_checkpoints_and_profiles.ipynb"


def notebook_device_ops():
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    source = ["".join(c["source"]) for c in cells
              if c["cell_type"] == "code" and "def device_ops(" in "".join(c["source"])]
    assert len(source) == 1, "lesson 11 has one cell that defines device_ops"
    namespace = {}
    exec(source[0], namespace)                  # the cell only defines: imports and the function
    return namespace["device_ops"]


def _plane(name, lines):
    return types.SimpleNamespace(name=name, lines=[types.SimpleNamespace(name=n, events=e) for n, e in lines])


def _event(name, start_ns, stats):
    return types.SimpleNamespace(name=name, start_ns=start_ns, duration_ns=9_500, stats=list(stats.items()))


def test_the_lessons_reader_names_gpu_kernels_inside_a_command_buffer_by_the_kernel():
    device_ops = notebook_device_ops()
    kernels = [_event(k, 1_000 * i, {"correlation_id": i, "scope_range_id": 12, "context_id": 1,
                                     "cuda_graph_id": 3, "kernel_details": "regs:184 static_shared:0",
                                     "tf_op": "jit(step)/dot_general", "hlo_module": "jit_step",
                                     "hlo_op": "command_buffer_1"})
               for i, k in enumerate(GPU_KERNELS * 3)]
    nccl = [_event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 500, {"hlo_op": "all-reduce-start.1",
                                                                    "hlo_module": "jit_step"})]
    memcpy = [_event("MemcpyH2D", 0, {"correlation_id": 99})]       # no hlo_op: named by itself
    planes = [_plane("/host:metadata", []),
              _plane("/host:CPU", [("python3", [_event("train", 0, {"step_num": 0})])]),
              _plane("/device:GPU:0", [("Stream #14(Compute)", kernels + memcpy), ("Stream #20(Nccl)", nccl)])]
    ops = device_ops(planes)
    assert type(ops) is dict and list(ops) == [0]                    # keyed by device number, as on the CPU
    names = [name for name, _, _ in ops[0]]
    assert len(names) == 14                                           # 12 kernels, the copy, the all-reduce
    assert set(names) == ({f"{k} [command_buffer_1]" for k in GPU_KERNELS} | {"all-reduce-start.1", "MemcpyH2D"})
    start, duration = ops[0][1][1:]
    assert start == pytest.approx(1e-3) and duration == pytest.approx(9.5e-3)   # ms
    with pytest.raises(KeyError):                                     # no other device: not an empty list
        ops[1]


def test_the_lessons_reader_keeps_the_cpu_ops_beside_an_idle_gpu_plane_and_reads_tpu_lines():
    device_ops = notebook_device_ops()
    cpu_ops = [_event(name, 10 * k, {"device_ordinal": d, "hlo_op": name, "run_id": 7})
               for d in range(2) for k, name in enumerate(["fusion", "psum_invariant"])]
    planes = [_plane("/host:CPU", [("tf_XLAExecute/1", cpu_ops)]), _plane("/device:GPU:0", [("Stream #14", [])])]
    ops = device_ops(planes)
    assert sorted(ops) == [0, 1] and [n for n, _, _ in ops[1]] == ["fusion", "psum_invariant"]
    tpu = [_plane("/device:TPU:0", [("XLA Modules", [_event("jit_step(1)", 0, {})]),
                                    ("XLA Ops", [_event("fusion.3", 0, {}), _event("all-reduce.1", 5, {})])])]
    assert [n for n, _, _ in device_ops(tpu)[0]] == ["fusion.3", "all-reduce.1"]


def test_the_lessons_reader_keys_gpu_planes_by_device_number_and_reads_only_stream_lines():
    device_ops = notebook_device_ops()
    kernel = {"hlo_op": "fusion.2", "hlo_module": "jit_step"}
    planes = [_plane(f"/device:GPU:{d}", [("Stream #14(Compute)", [_event("loop_fusion", 10 * d, kernel)]),
                                          ("Launch Stats", [_event("occupancy", 0, {})])])
              for d in (3, 11)]
    ops = device_ops(planes)
    assert sorted(ops) == [3, 11] and ops[11] == [("fusion.2", pytest.approx(1.1e-4), pytest.approx(9.5e-3))]   # 110 ns, in ms


@pytest.mark.parametrize("planes, found", [
    ([], "none"),                                                                 # no planes at all
    ([_plane("/host:CPU", [("python3", [_event("train", 0, {"step_num": 0})])])], "['/host:CPU']"),  # host only
    ([_plane("/host:CPU", [("tf_XLAExecute/1", [_event("fusion", 0, {"hlo_op": "fusion"})])]),   # no ordinal
      _plane("/device:GPU:0", [("Stream #14(Compute)", [])])], "['/host:CPU', '/device:GPU:0']"),  # idle GPU
])
def test_the_lessons_reader_raises_naming_the_planes_when_it_reads_nothing(planes, found):
    device_ops = notebook_device_ops()
    with pytest.raises(ValueError) as error:
        device_ops(planes)
    assert str(error.value).startswith(f"device_ops: no device op in these planes: {found}.")


def test_the_lessons_reader_names_the_lines_of_a_device_plane_it_cannot_read():
    """A GPU plane whose lines are not named "Stream..." (another profiler's layout): the error lists each device
    plane's lines, so that the learner sees what to read instead of being asked whether anything ran."""
    device_ops = notebook_device_ops()
    planes = [_plane("/host:CPU", [("python3", [_event("train", 0, {"step_num": 0})])]),
              _plane("/device:GPU:0", [("Kernels", [_event("loop_fusion", 0, {"hlo_op": "fusion.2"})]),
                                       ("Launch Stats", [])]),
              _plane("/device:GPU:1", [])]
    with pytest.raises(ValueError) as error:
        device_ops(planes)
    message = str(error.value)
    assert message.startswith("device_ops: no device op in these planes: ['/host:CPU', '/device:GPU:0', "
                              "'/device:GPU:1'].")
    assert "Lines on /device:GPU:0: ['Kernels', 'Launch Stats']." in message
    assert "Lines on /device:GPU:1: none." in message and "'Stream' lines" in message
