"""Profiles of training steps: capture a trace with ``jax.profiler``, read it per device, plot it.

Lesson 11. ``capture(directory, run_step, steps)`` runs ``run_step(i)`` for ``i`` in ``range(steps)`` inside
``jax.profiler.trace(directory, create_perfetto_trace=True)``, each call marked with a
``jax.profiler.StepTraceAnnotation``, and returns the Perfetto trace file it wrote
(``plugins/profile/<run>/perfetto_trace.json.gz``, JSON in the Chrome trace-event format).

``load(path)`` reads that file into a ``Trace``:

* ``ops``: every operation a device ran, ``Op(device, run_id, name, start_us, dur_us, collective)``. This parser
  reads the XLA **CPU runtime**'s tags: on the CPU all simulated devices share one process in the trace, and the
  runtime tags each op with ``device_ordinal``, the program's ``run_id`` (one per dispatch) and ``hlo_op``. A GPU or
  TPU trace is laid out differently (one plane per device, ``/device:GPU:0``; a TPU's ops on its "XLA Ops" line,
  a GPU's kernels on one line per stream, each tagged with its ``hlo_op``): lesson 11 shows how to read that with
  ``jax.profiler.ProfileData``. An op is a collective when its name is one
  (``all-reduce``, ``psum``, ``all-gather``, ...);
* ``dispatches``: per device, one ``Dispatch`` per run of a compiled program (its span, its collectives);
* ``markers``: the host's step annotations, ``Marker(step, start_us, dur_us)``: the step boundaries;
* ``host_reads``: the spans where Python waited for a value (``float(loss)``, ``np.asarray``).

``summarise(trace, steps_per_dispatch=1)`` gives, per device: dispatches, steps (``steps_per_dispatch`` per
dispatch: a fused dispatch of K steps holds K; collectives are not counted as steps, since a step holds as many
as its program has: 1 for the ``shard_map`` backend's one buffer, 2 for the ``jit`` backend, 3 for FSDP), time
per step, time in compute and in collectives, and the gaps between dispatches. ``plot_timeline`` draws it with matplotlib. The same file opens in https://ui.perfetto.dev,
and the directory in TensorBoard's profile plugin or XProf; nothing here needs them.
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

# HLO ops that move data between devices. `psum_invariant` is how shard_map names its psum.
COLLECTIVE = re.compile(r"all-reduce|all_reduce|allreduce|psum|all-gather|all_gather|reduce-scatter|"
                        r"reduce_scatter|psum_scatter|collective-permute|ppermute|all-to-all|all_to_all", re.I)
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
    ops: list[Op]
    dispatches: dict[int, list[Dispatch]]
    markers: list[Marker]
    host_reads: list[tuple[float, float]]

    @property
    def devices(self) -> list[int]:
        return sorted(self.dispatches)


def _check_trace(trace, where: str) -> None:
    if not isinstance(trace, Trace):
        hint = (" That is the file: read it first, trace = profile.load(path)."
                if isinstance(trace, (str, pathlib.Path)) else "")
        raise TypeError(f"{where}: trace must be a profile.Trace, got {type(trace).__name__}.{hint} Make one with "
                        "profile.load(profile.capture(...)) or profile.from_ops(ops).")


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
    _checks.writable_directory(directory, "capture", "a trace")      # before any step runs: the profiler only fails when it writes, at the end
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
    """Parse a Perfetto/Chrome trace file (``.json`` or ``.json.gz``) into ops, dispatches, markers, host reads."""
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
    ops, markers, reads = [], [], []
    for i, e in enumerate(events):
        try:
            if e.get("ph") != "X":
                continue
            args = e.get("args") or {}
            name = str(e.get("name", ""))
            if "device_ordinal" in args and "hlo_op" in args:
                ops.append(Op(int(args["device_ordinal"]), str(args.get("run_id", "")), name, float(e["ts"]),
                              float(e.get("dur", 0.0)), bool(COLLECTIVE.search(name))))
            elif "step_num" in args:
                markers.append(Marker(int(args["step_num"]), float(e["ts"]), float(e.get("dur", 0.0))))
            elif HOST_READ.search(name):
                reads.append((float(e["ts"]), float(e.get("dur", 0.0))))
        except (AttributeError, KeyError, TypeError, ValueError) as error:
            raise ValueError(f"load: path={path.name!r} is not a trace in the Chrome trace-event format: event {i} "
                             f"is {_checks.shown(e)} ({type(error).__name__}: {error}). {fix}") from None
    ops.sort(key=lambda o: (o.device, o.start_us))
    return Trace(ops, _dispatches(ops), sorted(markers, key=lambda m: m.start_us), _outermost(sorted(reads)))


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
    """Per device: ``{"dispatches", "steps", "collectives", "busy_us", "compute_us", "collective_us", "step_us",
    "gap_us"}``.

    ``steps = dispatches * steps_per_dispatch`` (pass ``steps_per_dispatch=K`` for a fused ``step.steps`` of K
    steps); ``collectives`` counts the collective ops that ran (how many a step holds depends on its program:
    1 for the course's ``shard_map`` step, 2 for its ``jit`` step, 3 for FSDP); ``busy_us`` is the time inside
    dispatches, ``collective_us`` the part of it inside collectives (on simulated devices mostly waiting for the
    other devices to arrive), ``compute_us`` the rest; ``step_us = busy_us / steps``; ``gap_us`` the median idle
    time between the end of one dispatch and the start of the next.
    """
    import numpy as np

    _check_trace(trace, "summarise")
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

    Raises ``ValueError`` for a trace with no device ops (no data: nothing ran inside the trace, or it is not a
    CPU-runtime trace that ``load`` can read), rather than answering 0.
    """
    _check_trace(trace, "collective_fraction")
    s = summarise(trace)
    busy = sum(v["busy_us"] for v in s.values())
    if not busy:
        raise ValueError("collective_fraction: the trace holds no device ops, so there is no fraction to give (not "
                         "0: no data). Was anything run inside the trace? Capture a few steps with profile.capture "
                         "after a first call that compiles them; a GPU/TPU trace needs another reader (lesson 11).")
    return sum(v["collective_us"] for v in s.values()) / busy


def plot_timeline(trace: Trace, ax=None, *, title: str = "what each device did"):
    """One row per device: compute (blue) and collectives (orange) of each dispatch; host reads and step marks.

    Times are in milliseconds from the trace's first event (host or device); the legend sits above the axes, clear
    of the bars. Returns the matplotlib ``Axes``.
    """
    import matplotlib.pyplot as plt

    _check_trace(trace, "plot_timeline")
    if not trace.ops:
        raise ValueError("plot_timeline: the trace holds no device ops: was anything run inside the trace? Capture "
                         "a few steps with profile.capture after a first call that compiles them.")
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
