"""Profiles of training steps: capture a trace with ``jax.profiler``, read it per device, plot it.

Lesson 11. ``capture(directory, run_step, steps)`` runs ``run_step(i)`` for ``i`` in ``range(steps)`` inside
``jax.profiler.trace(directory, create_perfetto_trace=True)``, each call marked with a
``jax.profiler.StepTraceAnnotation``, and returns the Perfetto trace file it wrote
(``plugins/profile/<run>/perfetto_trace.json.gz``, JSON in the Chrome trace-event format).

``load(path)`` reads that file into a ``Trace`` and says which layout it found (``Trace.layout``):

* ``"cpu"``, XLA's **CPU runtime** (the course's simulated devices): all devices are threads of one process,
  ``/host:CPU``, and the runtime tags each op with ``device_ordinal``, the ``run_id`` of its dispatch (one per
  run of a compiled program) and ``hlo_op``. Everything below reads this layout.
* ``"gpu"``: one process per device, ``/device:GPU:0``, its kernels on one line per CUDA stream
  (``Stream #14(Compute)``), each named by the kernel and tagged with its ``hlo_op``, with no ``device_ordinal``
  and no ``run_id`` (measured on one NVIDIA H200, JAX 0.11.2 (2026-11)). ``load`` keeps every event of a stream
  line, named by its ``hlo_op``; by its kernel where XLA ran it inside a command buffer (a CUDA graph: by default
  its fusions and matrix products), whose kernels all carry ``hlo_op = command_buffer_N``; and by its own name
  where it has no ``hlo_op`` (memory copies such as ``MemcpyD2H``). Tested on a file written to that description, not on a GPU's own file:
  the device processes' names in the Perfetto file are taken to be the planes' names.
* ``"tpu"``: ``/device:TPU:N`` processes, each op on a line named ``XLA Ops`` (assumed, not checked against a
  TPU trace).

For a GPU or TPU trace ``load`` gives the ops (``Trace.ops``), and the per-dispatch summaries below refuse it with
an error that says what to use instead: there is no dispatch id, and a GPU's collectives run asynchronously on
their own stream, overlapping compute, so adding up durations would count the same time twice. Read such a trace
as a timeline, in XProf or https://ui.perfetto.dev. A file with no device op in any of these layouts is an
error, never an empty ``Trace``. The ``Trace`` holds:

* ``ops``: every operation a device ran, ``Op(device, run_id, name, start_us, dur_us, collective)``; an op is a
  collective when its name is one (``all-reduce``, ``psum``, ``all-gather``, an NCCL kernel, ...);
* ``dispatches``: per device, one ``Dispatch`` per run of a compiled program (its span, its collectives; CPU only);
* ``markers``: the host's step annotations, ``Marker(step, start_us, dur_us)``: the step boundaries;
* ``host_reads``: the spans where Python waited for a value (``float(loss)``, ``np.asarray``).

``summarise(trace, steps_per_dispatch=1)`` gives, per device: dispatches, steps (``steps_per_dispatch`` per
dispatch: a fused dispatch of K steps holds K; collectives are not counted as steps, since a step holds as many
as its compiled program has: on the CPU backend 1 for the course's ``shard_map`` step, 2 for its ``jit`` step and 4
for ``sharded_state``'s FSDP step, whose two all-gathers and reduce-scatter are joined by the loss's all-reduce),
time per step, time in compute and in collectives, and the gaps between dispatches. ``plot_timeline`` draws it
with matplotlib. The same file opens in https://ui.perfetto.dev, and the directory in XProf or TensorBoard's
profile plugin; nothing here needs them.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import pathlib
import re
from typing import Callable

from . import _checks

__all__ = ["Op", "Dispatch", "Marker", "Trace", "capture", "find_trace", "load", "summarise", "collective_fraction",
           "plot_timeline", "from_ops", "COLLECTIVE"]

# HLO ops that move data between devices. `psum_invariant` is how shard_map names its psum; on a GPU, NCCL's
# kernels are named ncclDevKernel_AllReduce_..., ncclDevKernel_ReduceScatter_...
COLLECTIVE = re.compile(r"all-reduce|all_reduce|allreduce|psum|all-gather|all_gather|allgather|reduce-scatter|"
                        r"reduce_scatter|reducescatter|psum_scatter|collective-permute|ppermute|all-to-all|"
                        r"all_to_all|alltoall|nccl", re.I)
COMMAND_BUFFER = re.compile(r"command_buffer", re.I)   # GPU: hlo_op of every kernel inside a CUDA graph
DEVICE_PLANE = re.compile(r"^/device:(GPU|TPU):(\d+)$")
HOST_READ = re.compile(r"np\.asarray\(jax\.Array\)|__float__|__array__|device_get|block_until_ready")


_fail = _checks.fail  # every wrong argument: "<function>: <argument> must be ..., got ... <fix>"


@dataclasses.dataclass(frozen=True)
class Op:
    """One operation one device ran: times in microseconds from the start of the trace."""

    device: int
    run_id: str
    name: str
    start_us: float
    dur_us: float
    collective: bool

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


@dataclasses.dataclass(frozen=True)
class Dispatch:
    """One run of a compiled program on one device: from its first op to the end of its last."""

    device: int
    run_id: str
    start_us: float
    end_us: float
    collective_us: float
    collectives: int  # how many collective ops ran in it (a fused K-step dispatch of the course's step: K)

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us


@dataclasses.dataclass(frozen=True)
class Marker:
    """A host-side step annotation (``StepTraceAnnotation``): where step ``step`` began and how long it took."""

    step: int
    start_us: float
    dur_us: float


@dataclasses.dataclass
class Trace:
    """What ``load`` read: ``layout`` is ``"cpu"`` (XLA's CPU runtime), ``"gpu"`` or ``"tpu"`` (see the module's
    docstring); ``planes`` names the processes the file held (``/host:CPU``, ``/device:GPU:0``, ...)."""

    ops: list[Op]
    dispatches: dict[int, list[Dispatch]]
    markers: list[Marker]
    host_reads: list[tuple[float, float]]
    layout: str = "cpu"
    planes: tuple[str, ...] = ()

    @property
    def devices(self) -> list[int]:
        return sorted({o.device for o in self.ops} | set(self.dispatches))


def _check_trace(trace, where: str) -> None:
    if not isinstance(trace, Trace):
        hint = (" That is the file: read it first, trace = profile.load(path)."
                if isinstance(trace, (str, pathlib.Path)) else "")
        raise TypeError(f"{where}: trace must be a profile.Trace, got {type(trace).__name__}.{hint} Make one with "
                        "profile.load(profile.capture(...)) or profile.from_ops(ops).")


# What to use instead of the per-dispatch summaries on a GPU or TPU trace.
ELSEWHERE = ("Read it as a timeline instead: open the trace directory in XProf (pip install xprof; xprof --logdir "
             "<directory>) or the perfetto_trace.json.gz in https://ui.perfetto.dev, and compare where the NCCL "
             "kernels run with the idle time of the compute stream. trace.ops lists, per device, every event of its "
             "stream lines (kernels and memory copies): by its hlo_op, or by its kernel's name where it has none or "
             "ran inside a command buffer (hlo_op command_buffer_N); to see XLA's "
             "fusion names, profile with XLA_FLAGS=--xla_gpu_enable_command_buffer= (empty: no command buffers).")


def _cpu_only(trace: Trace, where: str) -> None:
    """Refuse a trace that is not in the CPU runtime's layout, or that holds no device op."""
    if trace.layout != "cpu":
        device = next((p for p in trace.planes if p.startswith("/device:")), trace.layout.upper())
        raise ValueError(
            f"{where}: this trace is a {trace.layout.upper()} trace ({device}: one process per device, ops on "
            f"{'stream lines' if trace.layout == 'gpu' else 'its XLA Ops line'}). {where} reads the CPU runtime's "
            "layout only, where each op carries device_ordinal and the run_id of its dispatch; this trace has "
            "neither, and its collectives run asynchronously beside the compute, so adding up durations would "
            f"count the same time twice. {ELSEWHERE}")
    if not trace.ops:
        raise ValueError(f"{where}: the trace holds no device ops, so there is nothing to summarise (no data, not "
                         "zero). Was anything run inside the trace? Capture a few steps with profile.capture after "
                         "a first call that compiles them.")


def _path(path, name: str, where: str) -> pathlib.Path:
    if isinstance(path, bool) or not isinstance(path, (str, pathlib.PurePath)) or str(path) == "":
        _fail(where, name, "a path (a str or a pathlib.Path)", path,
                     f"Pass e.g. {name}=pathlib.Path(tempfile.mkdtemp()) / 'trace'.", TypeError)
    return pathlib.Path(path)


def capture(directory, run_step: Callable[[int], object], steps: int, *, name: str = "train") -> pathlib.Path:
    """Trace ``run_step(0) ... run_step(steps - 1)``, each inside ``StepTraceAnnotation(name, step_num=i)``.

    Run it once before (to compile) so that the trace holds steps, not compilation. Before the trace ends it
    waits for each call's result and for every array still alive on the devices (``jax.live_arrays()``): a step
    whose loss was read on the host from one device may still be running on the others, and their last ops would
    be missing from the trace. Returns the path of the Perfetto trace file.
    """
    import jax

    directory = _path(directory, "directory", "capture")
    if not callable(run_step):
        _fail("capture", "run_step", "a function run_step(i) that runs step i", run_step,
                     "Pass e.g. lambda i: step(state, batches[i]).", TypeError)
    steps = _checks.whole(steps, "steps", "capture", fix="It is how many steps to trace, e.g. steps=5.")
    if not isinstance(name, str):
        _fail("capture", "name", "a string", name, "Pass e.g. name='train'.", TypeError)
    # before any step runs: the profiler only fails when it writes, at the end
    _checks.writable_directory(directory, "capture", "a trace")
    results = []
    with jax.profiler.trace(str(directory), create_perfetto_trace=True):
        for i in range(steps):
            with jax.profiler.StepTraceAnnotation(name, step_num=i):
                results.append(run_step(i))
        jax.block_until_ready((results, jax.live_arrays()))   # one wait: the trace shows one read at the end
    return find_trace(directory)


def find_trace(directory) -> pathlib.Path:
    """The newest ``perfetto_trace.json.gz`` under ``directory``."""
    directory = _path(directory, "directory", "find_trace")
    found = sorted(directory.glob("plugins/profile/*/perfetto_trace.json.gz"))
    if not found:
        raise FileNotFoundError(f"find_trace: directory={directory.name!r} holds no plugins/profile/*/"
                                "perfetto_trace.json.gz: capture one with jax.profiler.trace(directory, "
                                "create_perfetto_trace=True).")
    return found[-1]


def load(path) -> Trace:
    """Parse a Perfetto/Chrome trace file (``.json`` or ``.json.gz``) into ops, dispatches, markers, host reads.

    Reads the CPU runtime's layout (ops tagged with ``device_ordinal``) and a GPU's or TPU's (one
    ``/device:GPU:N`` process per device); see the module's docstring. Raises ``ValueError`` for a file that holds
    no device op in either layout, naming the processes it found.
    """
    path = _path(path, "path", "load")
    fix = "Pass the perfetto_trace.json.gz that jax.profiler.trace wrote (profile.find_trace(directory))."
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            events = json.load(f)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0][:120]
        raise ValueError(f"load: path={path.name!r} is not a readable trace file ({type(e).__name__}: {why}). "
                         f"{fix}") from None
    events = events.get("traceEvents", []) if isinstance(events, dict) else events
    if not isinstance(events, list):
        raise ValueError(f"load: path={path.name!r} is JSON but not a trace: it holds no list of events. {fix}")
    processes, threads = {}, {}          # pid -> process name, (pid, tid) -> thread (line) name
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M" and isinstance(e.get("args"), dict):
            if e.get("name") == "process_name":
                processes[e.get("pid")] = str(e["args"].get("name", ""))
            elif e.get("name") == "thread_name":
                threads[(e.get("pid"), e.get("tid"))] = str(e["args"].get("name", ""))
    cpu_ops, device_ops, markers, reads, kinds = [], [], [], [], set()
    for i, e in enumerate(events):
        try:
            if e.get("ph") != "X":
                continue
            args = e.get("args") or {}
            name = str(e.get("name", ""))
            plane = DEVICE_PLANE.match(processes.get(e.get("pid"), ""))
            if "device_ordinal" in args and "hlo_op" in args:                 # the CPU runtime
                cpu_ops.append(Op(int(args["device_ordinal"]), str(args.get("run_id", "")), name, float(e["ts"]),
                                  float(e.get("dur", 0.0)), bool(COLLECTIVE.search(name))))
            elif plane:                                                        # a GPU's or a TPU's own process
                line = threads.get((e.get("pid"), e.get("tid")), "")
                hlo_op = str(args.get("hlo_op", ""))
                # a GPU: every event on a stream line (kernels, and copies such as MemcpyD2H, which carry no
                # hlo_op) or tagged with an hlo_op; a TPU: its XLA Ops line
                if line == "XLA Ops" or (plane.group(1) == "GPU" and (hlo_op or line.startswith("Stream"))):
                    # inside a command buffer every kernel's hlo_op is command_buffer_N: name it by its kernel
                    op_name = name if not hlo_op or COMMAND_BUFFER.search(hlo_op) else hlo_op
                    device_ops.append((line, Op(int(plane.group(2)), "", op_name, float(e["ts"]),
                                                float(e.get("dur", 0.0)),
                                                bool(COLLECTIVE.search(f"{name} {hlo_op}")))))
                    kinds.add(plane.group(1).lower())
            elif "step_num" in args:
                markers.append(Marker(int(args["step_num"]), float(e["ts"]), float(e.get("dur", 0.0))))
            elif HOST_READ.search(name):
                reads.append((float(e["ts"]), float(e.get("dur", 0.0))))
        except (AttributeError, KeyError, TypeError, ValueError) as error:
            raise ValueError(f"load: path={path.name!r} is not a trace in the Chrome trace-event format: event {i} "
                             f"is {_checks.shown(e)} ({type(error).__name__}: {error}). {fix}") from None
    planes = tuple(sorted(set(processes.values())))
    if cpu_ops:        # simulated CPU devices (also on a GPU machine, where the lessons fall back to them)
        ops, layout = cpu_ops, "cpu"
    elif device_ops:
        # a TPU has its own XLA Ops line: where a device has one, its other lines repeat the same work
        with_xla_line = {o.device for line, o in device_ops if line == "XLA Ops"}
        ops = [o for line, o in device_ops if line == "XLA Ops" or o.device not in with_xla_line]
        layout = "tpu" if kinds == {"tpu"} else "gpu"
    else:
        raise ValueError(
            f"load: path={path.name!r} holds no device op that this reader knows: no event carries "
            "device_ordinal and hlo_op (XLA's CPU runtime), and no /device:GPU:N or /device:TPU:N process holds "
            f"kernels on a 'Stream' line, kernels with an hlo_op, or an 'XLA Ops' line. Its processes: {list(planes) or 'none named'}. Was "
            "anything run inside the trace (after a first call that compiles it)? Another runtime's trace: open "
            "it in XProf or https://ui.perfetto.dev.")
    ops.sort(key=lambda o: (o.device, o.start_us))
    return Trace(ops, _dispatches(ops) if layout == "cpu" else {}, sorted(markers, key=lambda m: m.start_us),
                 _outermost(sorted(reads)), layout, planes)


def from_ops(ops, markers=(), host_reads=()) -> Trace:
    """A ``Trace`` from ``Op``s, ``Marker``s and host-read spans ``(start_us, dur_us)`` you made yourself."""
    for name, items, kind in [("ops", ops, Op), ("markers", markers, Marker)]:
        try:
            items = list(items)
        except TypeError:
            _fail("from_ops", name, f"a list of profile.{kind.__name__}", items,
                         f"Pass e.g. {name}=[profile.{kind.__name__}(...), ...].", TypeError)
        wrong = [x for x in items if not isinstance(x, kind)]
        if wrong:
            _fail("from_ops", name, f"a list of profile.{kind.__name__}", items,
                         f"It holds {type(wrong[0]).__name__} {_checks.shown(wrong[0])}; build each with "
                         f"profile.{kind.__name__}(...).", TypeError)
    try:
        host_reads = [(float(s), float(d)) for s, d in host_reads]
    except (TypeError, ValueError):
        _fail("from_ops", "host_reads", "a list of (start_us, dur_us) pairs", host_reads,
                     "Pass e.g. host_reads=[(1200.0, 35.0)].", TypeError)
    ops = sorted(ops, key=lambda o: (o.device, o.start_us))
    return Trace(ops, _dispatches(ops), sorted(markers, key=lambda m: m.start_us), _outermost(sorted(host_reads)))


def _outermost(spans):
    """Drop spans nested inside an earlier one (``__float__`` calls ``np.asarray``: one read, not two)."""
    out = []
    for start, dur in spans:
        if out and start < out[-1][0] + out[-1][1]:
            continue
        out.append((start, dur))
    return out


def _dispatches(ops) -> dict[int, list[Dispatch]]:
    groups: dict[tuple[int, str], list[Op]] = {}
    for op in ops:
        groups.setdefault((op.device, op.run_id), []).append(op)
    out: dict[int, list[Dispatch]] = {}
    for (device, run_id), group in groups.items():
        collectives = _outermost(sorted((o.start_us, o.dur_us) for o in group if o.collective))
        out.setdefault(device, []).append(Dispatch(device, run_id, min(o.start_us for o in group),
                                                   max(o.end_us for o in group), sum(d for _, d in collectives),
                                                   len(collectives)))
    return {d: sorted(v, key=lambda x: x.start_us) for d, v in sorted(out.items())}


def summarise(trace: Trace, steps_per_dispatch: int = 1) -> dict[int, dict]:
    """For a trace in the CPU runtime's layout (a GPU or TPU trace, or one with no device op, raises
    ``ValueError`` saying why and what to read instead), per device: ``{"dispatches", "steps", "collectives",
    "busy_us", "compute_us", "collective_us", "step_us", "gap_us"}``.

    ``steps = dispatches * steps_per_dispatch`` (pass ``steps_per_dispatch=K`` for a fused ``step.steps`` of K
    steps); ``collectives`` counts the collective ops that ran (how many a step holds depends on its program; on
    the CPU backend: 1 for the course's ``shard_map`` step, 2 for its ``jit`` step, 4 for ``sharded_state``'s
    FSDP step: two all-gathers, a reduce-scatter and the loss's all-reduce); ``busy_us`` is the time inside
    dispatches, ``collective_us`` the part of it inside collectives (on simulated devices mostly waiting for the
    other devices to arrive), ``compute_us`` the rest; ``step_us = busy_us / steps``; ``gap_us`` the median idle
    time between the end of one dispatch and the start of the next.
    """
    import numpy as np

    _check_trace(trace, "summarise")
    _cpu_only(trace, "summarise")
    steps_per_dispatch = _checks.whole(steps_per_dispatch, "steps_per_dispatch", "summarise",
                                       fix="It is how many training steps one dispatch runs, e.g. 10 for "
                                           "step.steps over 10 batches.")
    out = {}
    for device, runs in trace.dispatches.items():
        busy = sum(r.dur_us for r in runs)
        coll = sum(r.collective_us for r in runs)
        steps = len(runs) * steps_per_dispatch
        gaps = [b.start_us - a.end_us for a, b in zip(runs, runs[1:])]
        out[device] = {"dispatches": len(runs), "steps": steps, "collectives": sum(r.collectives for r in runs),
                       "busy_us": busy, "collective_us": coll, "compute_us": busy - coll, "step_us": busy / steps,
                       "gap_us": float(np.median(gaps)) if gaps else 0.0}
    return out


def collective_fraction(trace: Trace) -> float:
    """The share of the devices' busy time spent in collectives, over all devices: in ``[0, 1]``.

    Raises ``ValueError`` for a trace with no device ops (no data: nothing ran inside the trace), rather than
    answering 0, and for a GPU or TPU trace, whose asynchronous collectives overlap compute (the error says what
    to read instead).
    """
    _check_trace(trace, "collective_fraction")
    _cpu_only(trace, "collective_fraction")
    s = summarise(trace)
    busy = sum(v["busy_us"] for v in s.values())
    if not busy:
        raise ValueError("collective_fraction: the trace's device ops all last 0 us, so there is no fraction to "
                         "give (not 0: no data). Capture a few steps with profile.capture.")
    return sum(v["collective_us"] for v in s.values()) / busy


def plot_timeline(trace: Trace, ax=None, *, title: str = "what each device did"):
    """One row per device: compute (blue) and collectives (orange) of each dispatch; host reads and step marks.

    Times are in milliseconds from the trace's first event (host or device); the legend sits above the axes, clear
    of the bars. Returns the matplotlib ``Axes``.
    """
    import matplotlib.pyplot as plt

    _check_trace(trace, "plot_timeline")
    _cpu_only(trace, "plot_timeline")
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.45 * (len(trace.devices) + 2) + 1.4))
    t0 = min([o.start_us for o in trace.ops] + [m.start_us for m in trace.markers] + [s for s, _ in trace.host_reads])
    for row, device in enumerate(trace.devices):
        runs = trace.dispatches[device]
        ax.broken_barh([((r.start_us - t0) / 1e3, r.dur_us / 1e3) for r in runs], (row - 0.35, 0.7),
                       color="tab:blue", label="compute" if row == 0 else None)
        coll = [((o.start_us - t0) / 1e3, o.dur_us / 1e3) for o in trace.ops if o.device == device and o.collective]
        ax.broken_barh(coll, (row - 0.35, 0.7), color="tab:orange", label="collective" if row == 0 else None)
    host = len(trace.devices)
    ax.broken_barh([((s - t0) / 1e3, d / 1e3) for s, d in trace.host_reads], (host - 0.35, 0.7), color="tab:red",
                   label="host waits for a value")
    for m in trace.markers:
        ax.axvline((m.start_us - t0) / 1e3, color="grey", lw=0.6, ls=":")
    ax.set_yticks(range(host + 1), [f"device {d}" for d in trace.devices] + ["host (Python)"])
    ax.invert_yaxis()
    ax.set_xlim(left=0)
    ax.set_xlabel("ms since the trace's first event (dotted: a step begins on the host)")
    ax.set_title(title)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.08), fontsize=8, ncol=3, frameon=False)
    return ax
