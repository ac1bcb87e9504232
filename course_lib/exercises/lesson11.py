"""Lesson 11 exercises: restore a checkpoint onto given devices; read a trace: collectives, the stalled step."""

import contextlib
import pathlib
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from .. import checkpoint, profile
from . import Mismatch, call, describe, exercise

# Graded hints, weakest first (the exercise framework shows them one at a time).
HINTS = {
    "11.1": ["Orbax reads each array straight onto the devices you ask for: you do not need to move it afterwards.",
             "checkpoint.restore(directory, like, devices=devices) returns (state, extra); return the state."],
    "11.2": ["Add up, over every device, the time inside collectives and the time inside dispatches.",
             "profile.summarise(trace) gives per device 'collective_us' and 'busy_us'; divide the sums."],
    "11.3": ["The host marks where each step began and how long it took: trace.markers.",
             "max(trace.markers, key=lambda m: m.dur_us).step: the step's own number, not its position."],
}


# ----------------------------------------------------------------------------------------------
# 11.1 Restore a checkpoint onto the devices you are given


def solution_restore_onto(directory, like, devices):
    state, extra = checkpoint.restore(directory, like, devices=devices)
    return state


@contextlib.contextmanager
def _watch(module, attribute, calls):
    """Record the keyword arguments of every call of ``module.attribute`` (still calling it) while inside."""
    original = getattr(module, attribute)

    def watched(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    setattr(module, attribute, watched)
    try:
        yield
    finally:
        setattr(module, attribute, original)


@exercise("11.1", "Restore a checkpoint saved from 8 devices onto the devices you are given",
          solution=solution_restore_onto)
def check_restore_onto(restore_onto):
    devs = jax.devices()
    saved = {"params": {"w": jnp.arange(4.0), "b": jnp.float32(0.5)}, "step": jnp.int32(100)}
    like = jax.tree.map(jnp.zeros_like, saved)
    on_all = checkpoint.replicated_on(devs)
    with tempfile.TemporaryDirectory() as tmp:
        directory = pathlib.Path(tmp) / "run"
        checkpoint.save(directory, 100, jax.device_put(saved, on_all), {"position": 100})
        for count in sorted({min(4, len(devs)), 1}, reverse=True):
            target = devs[len(devs) - count:]   # the last devices, so "the first n" or "all" is caught
            restores = []
            with _watch(checkpoint, "restore", restores), _watch(checkpoint.Checkpoints, "restore", restores):
                got = call(restore_onto, directory, like, target, name="restore_onto")
            what = f"restore_onto(directory, like, devices={count} device(s))"
            if isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], dict):
                raise Mismatch(f"{what} returned (state, extra); return only the state.")
            try:
                same = jax.tree.structure(got) == jax.tree.structure(saved)
            except Exception:
                same = False
            if not same:
                raise Mismatch(f"{what} should return the state with the saved structure "
                               f"{jax.tree.structure(saved)}; got {describe(got)}.")
            for path, leaf in jax.tree_util.tree_flatten_with_path(got)[0]:
                name = jax.tree_util.keystr(path)
                if not isinstance(leaf, jax.Array):
                    raise Mismatch(f"{what}: leaf {name} is {describe(leaf)}, not a jax.Array on the devices.")
                if set(leaf.devices()) != set(target):
                    raise Mismatch(f"{what}: leaf {name} lives on devices {sorted(d.id for d in leaf.devices())}; "
                                   f"expected ids {[d.id for d in target]}. Pass the devices to the restore.")
                if not leaf.sharding.is_fully_replicated:
                    raise Mismatch(f"{what}: leaf {name} is split over the devices; the saved state is replicated.")
            for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(saved)):
                try:
                    a = np.asarray(a)
                except Exception as e:  # e.g. an array that was deleted or donated
                    raise Mismatch(f"{what} returned an array that cannot be read ({type(e).__name__}).") from None
                if a.tobytes() != np.asarray(b).tobytes():
                    raise Mismatch(f"{what} returned values that differ from the saved ones, e.g. {np.asarray(a)} "
                                   f"instead of {np.asarray(b)}: restore the checkpoint, not like=.")
            if restores and not any(k.get("devices") is not None or k.get("sharding") is not None
                                    for k in restores):
                raise Mismatch(f"{what}: the values and devices are right, but checkpoint.restore read the arrays "
                               "onto the devices of like= and they were moved afterwards: a second copy, and on "
                               "a large model a second trip through device memory. Pass devices= to "
                               "checkpoint.restore, so that Orbax reads each array straight onto those devices.")
    return "the saved state came back bit for bit, whole on each of the devices you were given."


# ----------------------------------------------------------------------------------------------
# 11.2 The fraction of the devices' time spent in collectives


def _synthetic(n_devices=4, steps=3, compute=(30.0, 50.0), wait=(10.0, 70.0), gap=500.0, seed=0):
    """A trace of `steps` dispatches per device: compute, then one all-reduce, then a gap. Times in us."""
    rng = np.random.default_rng(seed)
    ops, markers = [], []
    t = 0.0
    for s in range(steps):
        markers.append(profile.Marker(100 + s, t, 0.0))
        for d in range(n_devices):
            c, w = rng.uniform(*compute), rng.uniform(*wait)
            ops.append(profile.Op(d, f"run{s}", "fusion", t, c, False))
            ops.append(profile.Op(d, f"run{s}", "all-reduce.1", t + c, w, True))
        t += compute[1] + wait[1] + gap
    return profile.from_ops(ops, markers)


def solution_collective_fraction(trace):
    per_device = profile.summarise(trace)
    collective = sum(v["collective_us"] for v in per_device.values())
    busy = sum(v["busy_us"] for v in per_device.values())
    return collective / busy


@exercise("11.2", "From a trace: the fraction of the devices' busy time spent in collectives",
          solution=solution_collective_fraction)
def check_collective_fraction(collective_fraction):
    for seed, wait in [(0, (10.0, 70.0)), (1, (100.0, 300.0))]:
        trace = _synthetic(wait=wait, seed=seed)
        shortcut = []
        with _watch(profile, "collective_fraction", shortcut):
            got = call(collective_fraction, trace, name="collective_fraction")
        if shortcut:
            raise Mismatch("collective_fraction(trace) calls profile.collective_fraction, the function this exercise "
                           "asks you to write. Compute it from profile.summarise(trace): per device, collective_us "
                           "and busy_us.")
        try:
            value = float(got)
        except Exception:
            raise Mismatch(f"collective_fraction(trace) should return one number between 0 and 1; "
                           f"got {describe(got)}.") from None
        expected = profile.collective_fraction(trace)
        s = profile.summarise(trace)
        compute = sum(v["compute_us"] for v in s.values()) / sum(v["busy_us"] for v in s.values())
        if abs(value - compute) < 1e-6 and abs(compute - expected) > 1e-3:
            raise Mismatch(f"collective_fraction(trace) = {value:.3f} is the share of compute; the exercise asks for "
                           f"the share of collectives ({expected:.3f}).")
        span = max(o.end_us for o in trace.ops) - min(o.start_us for o in trace.ops)
        coll = sum(v["collective_us"] for v in s.values())
        if abs(value - coll / (span * len(s))) < 1e-6:
            raise Mismatch(f"collective_fraction(trace) = {value:.3f} divides by the whole trace, idle gaps "
                           f"included; divide by the time inside dispatches (busy_us): {expected:.3f}.")
        if abs(value - 100 * expected) < 1e-4:
            raise Mismatch(f"collective_fraction(trace) = {value:.2f} is a percentage; return the fraction, "
                           f"{expected:.4f} (format it with :.0% when you print it).")
        per_device = float(np.mean([v["collective_us"] / v["busy_us"] for v in s.values()]))
        if abs(value - per_device) < 1e-6 and abs(per_device - expected) > 1e-6:
            raise Mismatch(f"collective_fraction(trace) = {value:.4f} averages the devices' own fractions; a device "
                           f"that was busy longer must weigh more. Add up collective_us over all devices, then "
                           f"busy_us, then divide: {expected:.4f}.")
        if not abs(value - expected) <= 1e-6:
            raise Mismatch(f"collective_fraction(trace) = {value:.4f}; course_lib's parse gives {expected:.4f} "
                           "(the sum over devices of collective_us over the sum of busy_us).")
    return "you read the collectives' share of the devices' busy time from the trace, as profile.summarise does."


# ----------------------------------------------------------------------------------------------
# 11.3 The step that stalled


def solution_stalled_step(trace):
    return max(trace.markers, key=lambda m: m.dur_us).step


@exercise("11.3", "From a trace: find the step that stalled", solution=solution_stalled_step)
def check_stalled_step(stalled_step):
    for stalled, first in [(3, 100), (6, 40)]:
        markers, ops, t = [], [], 0.0
        for i in range(8):
            dur = 5000.0 if i == stalled else 900.0 + 10 * i
            markers.append(profile.Marker(first + i, t, dur))
            for d in range(2):
                ops.append(profile.Op(d, f"run{i}", "fusion", t + 100, 200.0, False))
                ops.append(profile.Op(d, f"run{i}", "all-reduce", t + 300, 100.0, True))
            t += dur + 50
        trace = profile.from_ops(ops, markers)
        got = call(stalled_step, trace, name="stalled_step")
        want = first + stalled
        if isinstance(got, (bool, np.bool_)) or not isinstance(got, (int, np.integer)):
            raise Mismatch(f"stalled_step(trace) should return a step number (an int, like {want}); "
                           f"got {describe(got)}.")
        if int(got) == stalled:
            raise Mismatch(f"stalled_step(trace) returned {int(got)}, the marker's position in the list; return its "
                           f"step number, marker.step ({want}).")
        if int(got) != want:
            raise Mismatch(f"stalled_step(trace) returned {int(got)}; the longest step is step {want}.")
    return "the longest host step, named by its own step number."
