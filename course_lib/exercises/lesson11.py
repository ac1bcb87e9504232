"""Lesson 11 exercises: restore a checkpoint onto given devices; read a trace (collectives, the stalled step);
restore a sharded state with Orbax straight onto a mesh of another size."""

import contextlib
import copy
import pathlib
import tempfile
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from .. import checkpoint, profile
from . import Case, Mismatch, Mistake, Said, call, diagnose, exercise, placement, same
from .lesson08 import _split, mixed_devices

HINTS = {
    "11.1": ["Orbax reads each array straight onto the devices you ask for: you do not need to move it afterwards.",
             "Section 1, 'Restoring: where it was, or where you say': read which of checkpoint.restore's "
             "arguments decides where the arrays land.",
             "Where the arrays land is decided by the placement the restore is given, not by the arrays of like "
             "nor by what the checkpoint recorded; and the restore gives back more than the state."],
    "11.2": ["A fraction of time: which time goes above the line, which below, and does the idle time between "
             "dispatches belong to either?",
             "Section 3: profile.summarise reports per device what the trace's ops add up to. Print it for one "
             "trace and read its keys.",
             "Test your function on a trace where one device was busy far longer than the others: should that "
             "device count for more in the share over all devices than a device that was busy briefly?"],
    "11.3": ["The host marks where each step began and how long it took: trace.markers.",
             "Section 3, 'Profiling the step', prints the host's step marks (trace.markers). While the host "
             "stalls, the devices wait idle and the next step cannot begin: the stall is in the host's time for "
             "that one step, which each Marker records itself, not in the devices' dispatches.",
             "A marker's place in the list is not its step: the checker's runs do not start at step 0, and each "
             "marker carries its own number."],
    "11.4": ["Without a target Orbax puts each array back where it was saved (the checkpoint stores the "
             "sharding); a target with another sharding overrides that.",
             "Section 2, 'A sharded state onto another mesh', builds such a target for a mesh of 4, with a rule "
             "that does not fit every leaf here. Each leaf of like carries its own .sharding.spec; "
             "CheckpointManager.all_steps and latest_step say which steps a directory holds.",
             "Orbax reads onto whatever shardings the target names, each device only its part: the target's "
             "shardings decide the mesh and the split, leaf by leaf. Step directories are named by numbers: "
             "10 comes after 9 as a number, not as text."],
}


# ----------------------------------------------------------------------------------------------
# 11.1 Restore a checkpoint onto the devices you are given


def solution_restore_onto(directory, like, devices):
    state, extra = checkpoint.restore(directory, like, devices=devices)
    return state


def _watch(module, attribute, calls):
    """Record the keyword arguments of every call of ``module.attribute`` (still calling it) while inside."""
    original = getattr(module, attribute)
    return mock.patch.object(module, attribute, lambda *a, **k: calls.append(k) or original(*a, **k))


MISTAKES_11_1 = [
    Mistake("state and extra", "It returned (state, extra); return only the state.",
            lambda d, like, devs: checkpoint.restore(d, like, devices=devs)),
    Mistake("like's devices", "Those are the devices of like='s arrays: given like= alone, the restore puts each "
            "array where like='s array is. Pass the devices to the restore.",
            lambda d, like, devs: checkpoint.restore(d, like)[0]),
    Mistake("the first devices", "Those are the first {n} device(s), not the ones you were given (the checker "
            "gives you others): use the devices argument itself.",
            lambda d, like, devs: checkpoint.restore(d, like, devices=jax.devices()[:len(devs)])[0]),
    Mistake("devices reversed", "Those are the devices given, in reverse order: jit refuses to combine such "
            "arrays with arrays on the devices in the order given.",
            lambda d, like, devs: checkpoint.restore(d, like, devices=list(devs)[::-1])[0]),
    Mistake("where it was saved", "Those are the devices it was saved from: with no placement asked for, the "
            "restore puts each array back where it was saved.", lambda d, like, devs: _orbax_restore(d)["state"]),
    Mistake("like, not restored", "These are like='s values (zeros): restore the checkpoint, not like=.",
            lambda d, like, devs: jax.device_put(like, checkpoint.replicated_on(devs))),
    Mistake("the oldest step", "These are the oldest step's values; restore the newest step in the directory "
            "(where steps 9 and 10 are saved, 10: numbers, not text, decide).",
            lambda d, like, devs: checkpoint.restore(d, like, step=checkpoint.steps(d)[0], devices=devs)[0]),
]


def _onto_runner(fn, case):
    """(the state, where each leaf lives, the mechanism: whether the restore read each array straight onto the
    devices it is returned on, or elsewhere, and it was moved afterwards)."""
    restores, reads = [], []
    with _watch(checkpoint, "restore", restores), _watch(checkpoint.Checkpoints, "restore", restores), \
            _orbax_reads(reads) as watching:
        got = call(fn, *case.args, name="restore_onto", hints={"rank at least 1": (
            "The exercise asks for every leaf whole on each of the devices given, scalars too: no split.")})
    where = watching and _read_elsewhere(reads, got) or restores and not any(
        k.get("devices") is not None or k.get("sharding") is not None for k in restores) and "the arrays elsewhere"
    return got, jax.tree.map(_where_split, got), Said(
        f"the right values and devices, but the restore read {where}, and they were moved afterwards: a second "
        "copy. Pass devices= to checkpoint.restore, so that each array is read straight onto them" if where else
        "the restore reading each array straight onto the devices given")


@exercise("11.1", "Restore a checkpoint saved from 8 devices onto the devices you are given",
          solution=solution_restore_onto)
def check_restore_onto(restore_onto):
    devs = jax.devices()
    rng = np.random.default_rng(3)
    # two runs: another structure, other dtypes, steps past 9 (the newest is 10, after 9), other device counts;
    # the second saved from half the devices (so that "where it was saved" and "all devices" part)
    runs = [({"params": {"w": jnp.arange(4.0), "b": jnp.float32(0.5)}, "step": jnp.int32(100)}, [100],
             sorted({min(4, len(devs)), 1}, reverse=True)),
            ([{"w": jnp.asarray(rng.standard_normal((3, 5)), jnp.float32),
               "b": jnp.asarray(rng.standard_normal(5), jnp.bfloat16)},
              (jnp.asarray(rng.integers(0, 9, 6), jnp.int32), jnp.float32(-2.5))], [9, 10],
             [min(2, len(devs))])]
    mixed = mixed_devices()         # an answer must read the devices it is given
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for run, (saved, steps, counts) in enumerate(runs):
            directory = pathlib.Path(tmp) / f"run{run}"
            for step in steps:     # older steps hold other values: only the newest is right
                values = saved if step == steps[-1] else jax.tree.map(lambda a: (a * 0 + 7).astype(a.dtype), saved)
                checkpoint.save(directory, step, jax.device_put(values, checkpoint.replicated_on(
                    devs[:len(devs) // 2 or 1] if run else devs)), {"position": step})
            cases += [Case((directory, jax.tree.map(jnp.zeros_like, saved), mixed[:count]),
                           f"restore_onto(directory of steps {steps}, like, devices={count} device(s))", n=count)
                      for count in counts]
        diagnose(restore_onto, cases, solution=solution_restore_onto, mistakes=MISTAKES_11_1, run=_onto_runner)
    return "the saved state came back, its values and dtypes, whole on each of the devices you were given."


# ----------------------------------------------------------------------------------------------
# 11.2 The fraction of the devices' time spent in collectives


def _synthetic(n_devices, wait, seed, collectives, loop):
    """A trace of 3 dispatches per device: compute (30-50 us, times 1 to 3), then `collectives` collectives (an
    all-gather, a reduce-scatter, an all-reduce), then a 500 us gap. Every device and op its own duration.

    ``loop=True``: as in a fused ``step.steps`` dispatch, a loop op (a while) encloses its body, the fusion and the
    collectives (ops nest), and the device sits idle for a while inside the dispatch between its ops."""
    rng = np.random.default_rng(seed)
    names = ["all-reduce.1", "all-gather.2", "reduce-scatter.3", "all-reduce.4"][-collectives:]
    ops, markers = [], []
    t = 0.0
    for s in range(3):
        markers.append(profile.Marker(100 + s, t, 0.0))
        for d in range(n_devices):
            c = rng.uniform(30.0, 50.0) * (1 + d % 3)         # some devices compute longer than others
            start = t + (rng.uniform(5.0, 25.0) if loop else 0.0)
            ops.append(profile.Op(d, f"run{s}", "fusion", start, c, False))
            at = start + c
            for name in names:
                at += rng.uniform(5.0, 40.0) if loop else 0.0    # idle inside the dispatch
                w = rng.uniform(*wait)
                ops.append(profile.Op(d, f"run{s}", name, at, w, True))
                at += w
            if loop:
                ops.append(profile.Op(d, f"run{s}", "while.7", t, at - t, False))
        t += 3 * 50.0 + collectives * (wait[1] + (45.0 if loop else 0.0)) + 500.0
    return profile.from_ops(ops, markers)


def _encloses(op, ops):
    """Whether ``op`` holds another op of its device's dispatch inside it (a loop op holds its body)."""
    return any(o is not op and o.device == op.device and o.run_id == op.run_id and op.start_us <= o.start_us
               and o.end_us <= op.end_us and o.dur_us < op.dur_us for o in ops)


def solution_collective_fraction(trace):
    per_device = profile.summarise(trace)
    collective = sum(v["collective_us"] for v in per_device.values())
    busy = sum(v["busy_us"] for v in per_device.values())
    return collective / busy


def _sums(t, key):
    return sum(v[key] for v in profile.summarise(t).values())


def _share_of(t, denominator):
    return _sums(t, "collective_us") / denominator


_GAPS = ("It divides by a time that holds the idle gaps between dispatches; the exercise asks for a share of the "
         "time the devices were busy inside dispatches, the gaps left out.")
_OP_SUMS = ("It adds up op durations for the busy time. Ops nest inside others (a loop holds its body, so that "
            "counts the same time twice), and a device also sits idle inside a dispatch between its ops: the busy "
            "time is the time inside dispatches, from each dispatch's start to its end.")
MISTAKES_11_2 = [
    Mistake("share of compute", "That is the share of compute; the exercise asks for the share of collectives.",
            lambda t: _sums(t, "compute_us") / _sums(t, "busy_us")),
    Mistake("a percentage", "That is a percentage; return the fraction, a number between 0 and 1 (format it as a "
            "percentage only when you print it).", lambda t: 100 * solution_collective_fraction(t)),
    Mistake("over compute time", "It divides the collectives' time by the compute time; the busy time it should "
            "be divided by holds both, compute and collectives.", lambda t: _share_of(t, _sums(t, "compute_us"))),
    Mistake("device 0 alone", "That is the share of device 0 alone; the exercise asks for the share over all "
            "the devices of the trace.", lambda t: (lambda v: v["collective_us"] / v["busy_us"])(
                profile.summarise(t)[0])),
    Mistake("mean of shares", "It averages the devices' own fractions; a device that was busy longer must weigh "
            "more. Look at the order of the sums and the division.",
            lambda t: float(np.mean([v["collective_us"] / v["busy_us"] for v in profile.summarise(t).values()]))),
    Mistake("ops counted", "That is the share of the ops that are collectives, counted; the exercise asks for a "
            "share of time: a long collective weighs more than a short one.",
            lambda t: sum(o.collective for o in t.ops) / len(t.ops)),
    Mistake("whole trace", _GAPS, lambda t: _share_of(t, len(profile.summarise(t)) * (
        max(o.end_us for o in t.ops) - min(o.start_us for o in t.ops)))),
    Mistake("first-to-last span", _GAPS, lambda t: _share_of(t, sum(
        r[-1].end_us - r[0].start_us for r in t.dispatches.values()))),
    *[Mistake(f"busy plus gaps ({i})", _GAPS, lambda t, i=i: _share_of(t, sum(   # (dispatches - 1): the span
        v["busy_us"] + v["gap_us"] * (v["dispatches"], 1)[i] for v in profile.summarise(t).values())))
      for i in range(2)],
    *[Mistake(name, _OP_SUMS, lambda t, loops=loops: sum(o.dur_us for o in t.ops if o.collective) / sum(
        o.dur_us for o in t.ops if loops or not _encloses(o, t.ops)))
      for name, loops in (("op durations", True), ("op durations, loops left out", False))],
]


def _trace_runner(name, watched):
    """Run a function on a fresh copy of a case's trace, with a ``Mismatch`` if it changed the trace in place (a
    Trace is not a pytree, so ``call`` cannot see inside it); calls of profile.collective_fraction go to ``watched``."""
    def run(fn, case):
        trace, before = copy.deepcopy(case.args[0]), case.args[0]
        with _watch(profile, "collective_fraction", watched):
            got = call(fn, trace, name=name)
        if trace != before:
            changed = [f for f in vars(trace) if getattr(trace, f) != getattr(before, f)]
            raise Mismatch(f"{name}(trace) changed the trace it was given in place ({', '.join(changed)}). Read it "
                           "without changing it: sorted() returns a new list; list.sort changes the one you have.")
        return got
    return run


@exercise("11.2", "From a trace: the fraction of the devices' busy time spent in collectives",
          solution=solution_collective_fraction, returns="one number between 0 and 1")
def check_collective_fraction(collective_fraction):
    # the last case nests ops (a loop holds its body) and leaves the devices idle inside dispatches, as a real
    # trace of fused step.steps dispatches does
    cases = [Case((_synthetic(n_devices=n, wait=wait, seed=seed, collectives=c, loop=loop),),
                  f"collective_fraction(trace of {n} devices{', fused loops' if loop else ''})")
             for seed, wait, n, c, loop in [(0, (10.0, 70.0), 4, 1, False), (1, (100.0, 300.0), 8, 3, False),
                                            (2, (5.0, 400.0), 2, 2, False), (3, (20.0, 90.0), 4, 2, True)]]
    shortcut = []
    diagnose(collective_fraction, cases, solution=solution_collective_fraction, mistakes=MISTAKES_11_2,
             rtol=1e-6, atol=1e-9, run=_trace_runner("collective_fraction", shortcut))
    if shortcut:
        raise Mismatch("collective_fraction(trace) calls profile.collective_fraction, the function this exercise "
                       "asks you to write. Compute it yourself from what profile.summarise reports per device.")
    return "you read the collectives' share of the devices' busy time from the trace, as profile.summarise does."


# ----------------------------------------------------------------------------------------------
# 11.3 The step that stalled


def solution_stalled_step(trace):
    return max(trace.markers, key=lambda m: m.dur_us).step


def _step_of_longest(t, durations):
    return t.markers[int(np.argmax(durations))].step


def _dispatch_durations(t, device=None):
    runs = {d: [x.dur_us for x in sorted(r, key=lambda x: x.start_us)] for d, r in t.dispatches.items()}
    return runs[device] if device is not None else np.sum(list(runs.values()), axis=0)


_FROM_DEVICES = ("You picked it from the devices' dispatches, but the stall is on the host: the devices wait idle "
                 "while the host stalls. Read the host's step marks, trace.markers.")
MISTAKES_11_3 = [
    Mistake("position", "That is the marker's position in the list; the runs here do not start at step 0: return "
            "the step number the marker carries.", lambda t: int(np.argmax([m.dur_us for m in t.markers]))),
    Mistake("shortest", "You returned the shortest step: the stalled one took the longest.",
            lambda t: min(t.markers, key=lambda m: m.dur_us).step),
    *[Mistake(which, f"That is the {which} step's number{latest}, on every case: the stalled step is the one whose "
              "marker lasted longest.", lambda t, i=i: t.markers[i].step)
      for which, i, latest in (("first", 0, ""), ("last", -1, " (the marker that starts latest)"))],
    # (device 1's longest dispatch is the longest summed over the devices, by the cases' construction)
    Mistake("device 0's longest dispatch", _FROM_DEVICES, lambda t: _step_of_longest(t, _dispatch_durations(t, 0))),
    Mistake("devices' summed dispatches", _FROM_DEVICES, lambda t: _step_of_longest(t, _dispatch_durations(t))),
    *[Mistake(f"one {way}", f"That is the number of the step {way} the stalled one, on every case: the marker of "
              f"the longest step carries its own number (no {k:+}).", lambda t, k=k: solution_stalled_step(t) + k)
      for way, k in (("after", 1), ("before", -1))],
    Mistake("start to next start", "You measured each step from its start to the next step's start, and the "
            "last step has no next one: each marker carries its own duration.",
            lambda t: _step_of_longest(t, np.diff([m.start_us for m in t.markers]))),
    Mistake("gap before", "That is the step that starts after the longest gap between two steps' starts: the gap "
            "before a step holds the step before it. Each marker carries its own duration.",
            lambda t: t.markers[int(np.argmax(np.diff([m.start_us for m in t.markers]))) + 1].step),
    Mistake("duration", "That is the longest step's duration in µs (its dur_us), not its number: return the "
            "step number its marker carries.", lambda t: max(m.dur_us for m in t.markers)),
]


def _stall_trace(stalled, first, count, stall_us):
    """Host marks from step ``first``, step ``stalled`` (a position) ``stall_us`` long after a slow one, on two devices
    whose longest dispatch is at another step (not those, the first, the last, the shortest: it moves, as gaps do)."""
    markers, ops, t, slow = [], [], 0.0, stalled // 2 if stalled > 1 else None   # slow: 1.4x a step, not stalled
    durations = [stall_us if i == stalled else 1300.0 if i == slow else 900 + 37 * ((i * 7 + 3 + stalled) % 5)
                 for i in range(count)]
    others = [i for i in range(count) if i not in (stalled, slow, 0, count - 1, int(np.argmin(durations)))]
    for i, dur in enumerate(durations):
        markers.append(profile.Marker(first + i, t, dur))
        for d in range(2):
            longest = i == others[(d + stalled) % len(others)]
            work = 200.0 + 11 * ((i + 3 * d) % 4) + (350.0 + 40 * d if longest else 0.0)
            ops.append(profile.Op(d, f"run{i}", "fusion", t + 100, work, False))
            ops.append(profile.Op(d, f"run{i}", "all-reduce", t + 100 + work, 100.0, True))
        t += dur + 50 + 15 * (i % 3)
    return profile.from_ops(ops, markers)


@exercise("11.3", "From a trace: find the step that stalled", solution=solution_stalled_step,
          returns="a step number, an int")
def check_stalled_step(stalled_step):
    # the stall sits anywhere (first, middle, last), the runs start at steps past 9, and it is 1.6 to 5 times
    # a step, while the other steps' durations vary
    cases = [Case((_stall_trace(*args),), f"stalled_step(trace of {args[2]} steps from step {args[1]})")
             for args in [(3, 100, 8, 5000.0), (6, 40, 8, 1700.0), (11, 7, 12, 2600.0), (0, 1000, 5, 1800.0)]]
    diagnose(stalled_step, cases, solution=solution_stalled_step, mistakes=MISTAKES_11_3, run=_marker_runner)
    return "the longest host step, named by its own step number."


def _marker_runner(fn, case):
    """The step number ``fn`` returns (any whole number), with the marker it names and how long that lasted (a
    ratio of step numbers means nothing)."""
    from .lesson12 import _whole
    got, markers = _trace_runner("stalled_step", [])(fn, case), case.args[0].markers
    if (step := _whole(got)) is None:       # a bool too: True is no step
        return Said(f"{got!r:.60} ({type(got).__name__}), not a step number")
    found = [f"marker {i + 1} of {len(markers)}, which lasted {m.dur_us:,.0f} µs" for i, m in enumerate(markers)
             if m.step == step] or [f"which no marker carries: they run from {markers[0].step} to {markers[-1].step}"]
    return Said(f"step {step} ({found[0]})")


# ----------------------------------------------------------------------------------------------
# 11.4 Restore a sharded state with Orbax straight onto a mesh of another size


def solution_restore_resharded(directory, like, mesh):
    import orbax.checkpoint as ocp

    target = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, x.sharding.spec)), like)
    with ocp.CheckpointManager(directory) as manager:
        return manager.restore(manager.latest_step(), args=ocp.args.StandardRestore(target))


@contextlib.contextmanager
def _orbax_reads(reads):
    """Record every array Orbax reads: ``(the sharding asked for, None for the stored one; the array read)``, or
    ``"host"`` (a NumPy array). Nothing is recorded if this Orbax names its handlers otherwise."""
    try:
        from orbax.checkpoint._src.serialization import jax_array_handlers, type_handlers
        targets = [(jax_array_handlers.ArrayHandler, "array"), (type_handlers.NumpyHandler, "host")]
    except Exception:
        targets = []

    def make(original, kind):
        async def deserialize(self, infos, args=None):
            out = await original(self, infos, args)
            for arg, array in zip(args or [None] * len(infos), out):
                restore_type = getattr(arg, "restore_type", None)
                host = kind == "host" or (restore_type is not None and restore_type is not jax.Array)
                reads.append("host" if host else (getattr(arg, "sharding", None), array))
            return out
        return deserialize

    patched = [(cls, kind) for cls, kind in targets if "deserialize" in cls.__dict__]
    with contextlib.ExitStack() as stack:
        for cls, kind in patched:
            stack.enter_context(mock.patch.object(cls, "deserialize", make(cls.__dict__["deserialize"], kind)))
        yield bool(patched)


def _read_elsewhere(reads, got, like=None):
    """None if every array leaf of ``got`` is an array Orbax read onto that leaf's own sharding (same devices, same
    order, same split); else, in words, where Orbax read the first other one (``like``: the saved shardings)."""
    read = [r for r in reads if r != "host"]
    for leaf in [x for x in jax.tree.leaves(got) if isinstance(x, jax.Array)]:
        same_shape = [r for r in read if r[1].shape == leaf.shape]
        match = next((r for r in same_shape if r[1].sharding.is_equivalent_to(leaf.sharding, leaf.ndim)), None)
        if match is None:
            stored = same_shape and (same_shape[0][0] is None or any(
                x.shape == leaf.shape and same_shape[0][1].sharding.is_equivalent_to(x.sharding, leaf.ndim)
                for x in jax.tree.leaves(like)))
            onto = "on the host (NumPy)" if "host" in reads else "as no array of that shape" if not same_shape else (
                "onto the sharding stored in the checkpoint, " if stored else "") + _where_split(same_shape[0][1])
            return f"a leaf of shape {leaf.shape} {onto} (you return it {_where_split(leaf)})"
        read = [r for r in read if r is not match]
    return None


# Orbax errors a learner meets when opening the manager's directory another way, and what they mean.
_ORBAX_LAYOUT = {
    "subdirectory not found": "A CheckpointManager that saved one unnamed item keeps it in a sub-directory of the "
                              "step, named 'default'; open the directory with a CheckpointManager, as it was saved, "
                              "and it finds the item itself.",
    "Composite": "Orbax says this for a step the directory does not hold (it holds steps {steps}), and for a "
                 "restore that does not match the save (one unnamed item, StandardSave alone, no Composite).",
    "not found in mesh": "The mesh you were given names its axis differently from the one you wrote: take the "
                         "axis names from like= and the mesh, not from the lesson.",
}


def _case_a():
    """Lesson-like leaves on axis "data": split along the first axis, the second, and whole."""
    values = {"w": np.arange(16 * 8, dtype=np.float32).reshape(16, 8) / 7,
              "b": np.linspace(-1, 1, 16, dtype=np.float32),
              "scale": np.linspace(0.5, 2.0, 16, dtype=np.float32),
              "v": np.arange(4 * 16, dtype=np.float32).reshape(4, 16), "count": np.int32(12)}
    specs = {"w": ("data", None), "b": ("data",), "scale": (), "v": (None, "data"), "count": ()}
    return "data", values, specs


def _case_b():
    """Another structure on another axis name: nested lists and dicts, bfloat16 and int32 leaves, a 3-D leaf split
    along its last axis."""
    rng = np.random.default_rng(11)
    layer = lambda i: {"w": rng.standard_normal((8, 16)).astype(np.float32) + i,
                       "b": rng.standard_normal(16).astype(np.float32)}
    values = {"layers": [layer(0), layer(1)],
              "embed": rng.standard_normal((16, 4)).astype(jnp.bfloat16),
              "moments": {"mu": rng.standard_normal((2, 3, 8)).astype(np.float32),
                          "count": np.int32(100)}}
    specs = {"layers": [{"w": (None, "fsdp"), "b": ("fsdp",)}, {"w": ("fsdp", None), "b": ()}],
             "embed": ("fsdp", None), "moments": {"mu": (None, None, "fsdp"), "count": ()}}
    return "fsdp", values, specs


def _bump(values, k):
    """Other per-element values for another step, of the same dtypes."""
    return jax.tree.map(lambda v: (np.asarray(v, np.float32) * (k + 2) + k + np.arange(np.size(v)).reshape(
        np.shape(v)) % 5).astype(np.asarray(v).dtype), values)


def _orbax_restore(directory, target=None, step=None):
    """Orbax's restore of the newest step (or of ``step(all steps)``): onto ``target``, else as it was saved."""
    import orbax.checkpoint as ocp
    with ocp.CheckpointManager(directory) as manager:
        step = manager.latest_step() if step is None else step(manager.all_steps())
        return manager.restore(step, args=None if target is None else ocp.args.StandardRestore(target))


def _onto(like, mesh, spec=lambda x: x.sharding.spec):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, spec(x))), like)


_SPECS = "Keep each leaf's PartitionSpec (they differ from leaf to leaf) and change only the mesh."
_NEWEST = " Restore the newest step, whatever its number."
MISTAKES_11_4 = [
    Mistake("the saved mesh", "Those are the devices it was saved from: Orbax puts each array back on the "
            "sharding stored with it unless the restore's target names another (like='s arrays name the old mesh "
            "too). Give the restore a target whose shardings name the new mesh.",
            lambda d, like, mesh: _orbax_restore(d, like)),
    Mistake("every leaf whole", "Every leaf came back whole on every device. " + _SPECS,
            lambda d, like, mesh: _orbax_restore(d, _onto(like, mesh, lambda x: P()))),
    Mistake("the lesson's rule", "The leaves are split by one rule (the first axis, where it divides): " + _SPECS,
            lambda d, like, mesh: _orbax_restore(d, _onto(like, mesh, lambda x: P(
                *[mesh.axis_names[0]][:x.ndim and x.shape[0] % mesh.size == 0])))),
    Mistake("newest by text", "If you picked the step by the directories' names: compared as text, '8' comes after "
            "'11' and '99' after '100' (the first characters decide); step numbers must be compared as numbers."
            + _NEWEST, lambda d, like, mesh: _orbax_restore(d, _onto(like, mesh), lambda steps: max(
                steps, key=str))),
    Mistake("the oldest step", "You restored the oldest step the directory holds." + _NEWEST,
            lambda d, like, mesh: _orbax_restore(d, _onto(like, mesh), min)),
]


def _resharded_runner(fn, case):
    """(which saved step the values are, the values, where each leaf lives and how it is split, the mechanism:
    whether each device read its own part straight onto the new mesh). course_lib's restore is refused here: the
    exercise is Orbax itself."""
    directory, like, mesh, saved = case.args
    reads, through_course_lib = [], []
    with _orbax_reads(reads) as watching, _watch(checkpoint, "restore", through_course_lib), \
            _watch(checkpoint.Checkpoints, "restore", through_course_lib):
        try:
            got = call(fn, directory, like, mesh, name="restore_resharded", hints={
                **_ORBAX_LAYOUT, "Composite": _ORBAX_LAYOUT["Composite"].format(steps=sorted(saved))})
        except Mismatch:
            if not through_course_lib:
                raise
    if through_course_lib:
        raise Mismatch("restore_resharded called course_lib's checkpoint.restore, which reads only checkpoints "
                       "that course_lib's save wrote: this exercise asks for Orbax itself.")
    step = next((Said(f"the values of step {k}") for k, v in saved.items()
                 if same(got, v, rtol=1e-2, atol=1e-2, dtype=False)), Said("values that no saved step holds"))
    where = watching and reads and _read_elsewhere(reads, got, like)
    return step, got, jax.tree.map(lambda a: _where_split(a, mesh), got), Said(
        "the right values and shardings, but Orbax read no array in your function: restore from the checkpoint in "
        "directory" if watching and not reads else f"the right values and shardings, but Orbax read {where}, and you "
        "placed it afterwards: the whole state through other memory (on fewer devices, it fails). Give Orbax a target "
        "of jax.ShapeDtypeStructs with the shardings you return, so that each device reads only its own part" if where
        else "each device reading only its own part, straight onto the new mesh")


def _where_split(a, mesh=None) -> Said:
    """Where ``a`` lives: on one device (or placed without a mesh), its ``placement``; else its ``_split`` ("split
    as P('data',) over devices [4, 5, 6, 7]", "whole on devices [5, 2]")."""
    sharding = getattr(a, "sharding", None)
    if getattr(sharding, "spec", None) is None or len(sharding.device_set) == 1:
        return placement(a)
    return _split(sharding, mesh)


@exercise("11.4", "Restore a state saved sharded on 8 devices straight onto a mesh of another size",
          solution=solution_restore_resharded)
def check_restore_resharded(restore_resharded):
    import orbax.checkpoint as ocp

    devs = jax.devices()
    n = len(devs)
    smaller = [c for c in (4, 2) if c < n] or [n]
    mixed = mixed_devices()
    # (case, devices it is saved from, the steps saved in order (the newest last, as Orbax requires), mesh sizes)
    plans = [(_case_a, devs, [7], [smaller[0]]),
             (_case_a, devs, [7, 8, 10, 11], smaller[1:] or smaller),  # text: "8" > "11"; 7 the oldest; 10 next
             (_case_b, devs[:n // 2 or 1], [9, 99, 100], [n])]      # as text "99" > "100"; saved from fewer devices
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for index, (case, from_devices, steps, sizes) in enumerate(plans):
            directory, (axis, values, specs) = pathlib.Path(tmp) / f"run{index}", case()
            saved_mesh = jax.make_mesh((len(from_devices),), (axis,), devices=from_devices)
            saved = {step: values if step == steps[0] else _bump(values, step) for step in steps}
            with ocp.CheckpointManager(directory) as manager:      # closing it waits for the saves
                for step in steps:
                    placed = jax.tree.map(lambda v, spec: jax.device_put(v, NamedSharding(saved_mesh, P(*spec))),
                                          saved[step], specs, is_leaf=lambda x: isinstance(x, tuple))
                    manager.save(step, args=ocp.args.StandardSave(placed))
            like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), placed)
            cases += [Case((directory, like, jax.make_mesh((count,), (axis,), devices=mixed[:count]), saved),
                           f"restore_resharded(directory of steps {steps}, like, mesh of {count} devices '{axis}')",
                           n=count) for count in sizes]
        diagnose(restore_resharded, cases, solution=solution_restore_resharded, mistakes=MISTAKES_11_4,
                 run=_resharded_runner)
    return ("each device read its own part of the saved state straight onto the new mesh, with the same "
            "PartitionSpecs, from the newest step (steps past 9, other structures and axis names, onto smaller "
            "and larger meshes).")
