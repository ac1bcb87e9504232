"""Lesson 08 exercises: which part of a global batch each process loads, and the global array built from it."""

import contextlib
import dis
from unittest import mock

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from . import Case, Mismatch, Mistake, Said, call, describe_tree, diagnose, exercise


# ----------------------------------------------------------------------------------------------
# 08.1 The rows of a global batch that one process loads


def solution_process_rows(global_batch, num_processes, process_id):
    per_process = global_batch // num_processes
    return slice(process_id * per_process, (process_id + 1) * per_process)


@exercise("08.1", "The rows of the global batch one process loads", solution=solution_process_rows,
          returns="a slice(start, stop): one contiguous block of global_batch // num_processes rows",
          hints=["Every process loads the same number of rows, one contiguous block, in process order.",
                 "Python's built-in slice(start, stop) selects rows start to stop - 1. How many rows does each "
                 "process get, and how many rows come before process process_id's block?",
                 "The cell to read: lesson 08, section 1, \"Each process loads its own part of the batch\"; "
                 "Python's slice documentation for what stop means."])
def check_process_rows(process_rows):
    cases = [Case((batch, procs, pid), f"process_rows({batch}, {procs}, {pid})")
             for batch, procs in [(64, 2), (96, 4), (30, 3), (8, 8), (48, 12)] for pid in range(procs)]
    diagnose(process_rows, cases, solution=solution_process_rows, mistakes=MISTAKES_08_1, run=_selected_rows,
             name="process_rows")
    return "each process loads one contiguous block of batch // num_processes rows."


def _selected_rows(fn, case):
    """The rows ``fn``'s slice selects from a batch of ``case``'s size."""
    got = call(fn, *case.args, name="process_rows")
    if not isinstance(got, slice):
        raise Mismatch(f"{case.label} should return a slice, like slice(start, stop); got {describe_tree(got)}.")
    try:
        return np.arange(case.args[0])[got]
    except (TypeError, ValueError, IndexError) as e:
        raise Mismatch(f"{case.label} returned {got!r}, which cannot select rows ({e}): start and stop must be "
                       "ints.") from None


MISTAKES_08_1 = [
    Mistake("interleaved", "It takes every num_processes-th row (interleaved): its rows do not line up with the "
            "devices it owns.", lambda b, n, p: slice(p, b, n)),
    Mistake("one row too many", "It selects one row too many: a slice stops before its stop.",
            lambda b, n, p: slice(p * (b // n), (p + 1) * (b // n) + 1)),
    Mistake("one row short", "It selects one row short: stop is exclusive, so a block of k rows from start "
            "stops at start + k.", lambda b, n, p: slice(p * (b // n), (p + 1) * (b // n) - 1)),
    Mistake("divided by 1", "Its blocks are the whole batch long: it divides by 1 (jax.process_count() is 1 in "
            "this single process), not by the num_processes it is given.", lambda b, n, p: slice(p * b, (p + 1) * b)),
    Mistake("divided by 8", "Its blocks are global_batch // 8 rows in every case: it divides by 8, not by the "
            "num_processes it is given.", lambda b, n, p: slice(p * (b // 8), (p + 1) * (b // 8))),
    Mistake("ids from 1", "It counts processes from 1: process_id starts at 0, so process 0 got no rows and "
            "every other block is one block early.", lambda b, n, p: slice((p - 1) * (b // n), p * (b // n))),
    Mistake("start at the process id", "It starts at row process_id: process p's block comes right after the "
            "blocks of the p processes before it, in process order.", lambda b, n, p: slice(p, p + b // n)),
]


# ----------------------------------------------------------------------------------------------
# 08.2 The local part of a sharded batch, read from the devices' owners


class FakeDevice:
    """A stand-in for a jax.Device with the one attribute the exercise reads."""

    def __init__(self, id, process_index):
        self.id, self.process_index = id, process_index

    def __repr__(self):
        return f"Device(id={self.id}, process_index={self.process_index})"


def solution_local_part(batch, devices, process_index):
    rows = [i for i, d in enumerate(devices) if d.process_index == process_index]
    return batch[rows]


def _stacked(got):
    """A list (or tuple) of rows stands for the array of them."""
    if isinstance(got, (list, tuple)) and got and all(isinstance(r, np.ndarray) for r in got):
        return np.stack(got)
    return got


def _rows(pick):
    """A local_part that returns the rows at the positions ``pick(devices, process_index)``."""
    return lambda batch, devices, p: batch[list(pick(devices, p))]


_IDS = ("It returns the rows at positions computed from the devices' ids. Device ids are labels, not positions "
        "(lesson 08, section 3): use each device's position in the list.")
MISTAKES_08_2 = [
    Mistake("contiguous", "It returns a contiguous block of rows, but this process owns the devices at other "
            "positions: read each device's process_index instead of assuming an order.",
            lambda batch, devices, p: batch[p * (len(devices) // len({d.process_index for d in devices})):][
                :len([d for d in devices if d.process_index == p])]),
    Mistake("contiguous, 2 processes written in", "It returns a contiguous block of rows, as if there were 2 "
            "processes whose devices sit in order: read each device's process_index instead of assuming an order.",
            lambda batch, devices, p: batch[p * (len(devices) // 2):(p + 1) * (len(devices) // 2)]),
    Mistake("whole batch", "It returns the whole batch, every process's rows; a process feeds only its own "
            "devices, those of the list given whose process_index is this process's.",
            lambda batch, devices, p: batch),
    Mistake("ids modulo the count", _IDS, _rows(lambda ds, p: [d.id % len(ds) for d in ds if d.process_index == p])),
    Mistake("sorted by id", "It returns the right rows in another order: keep mesh order, the order of the "
            "devices list.", _rows(lambda ds, p: [i for i, d in sorted(enumerate(ds), key=lambda t: t[1].id)
                                                  if d.process_index == p])),
    Mistake("process 0", "It returns the rows of process 0's devices whatever process it is asked for: use the "
            "process_index the function is given.", lambda batch, devices, p: solution_local_part(batch, devices, 0)),
    Mistake("owner test reversed", "It returns the rows of the other processes' devices: the owner test is "
            "reversed.", _rows(lambda ds, p: [i for i, d in enumerate(ds) if d.process_index != p])),
    Mistake("id compared with process_index", "It compares each device's id with process_index: an id names a "
            "device, not its process. The owner is the device's process_index.",
            _rows(lambda ds, p: [i for i, d in enumerate(ds) if d.id == p])),
    Mistake("owner from the id", "It reads the owner from the id; which process owns a device is its "
            "process_index, whatever its id.", _rows(lambda ds, p: [i for i, d in enumerate(ds) if d.id // 2048 == p])),
]


@exercise("08.2", "This process's rows of a sharded batch, from the devices it owns",
          solution=solution_local_part,
          returns="an array of shape (number of devices this process owns, ...): row i of batch for each "
                  "position i whose device belongs to this process, in order",
          hints=["Do not assume the devices of one process sit next to each other: ask each device which "
                 "process owns it.",
                 "Every jax.Device has a process_index attribute (lesson 08, section 1). NumPy indexing with a "
                 "list of positions picks those rows, in the list's order.",
                 "The API to read: jax.Device's process_index and NumPy's integer-array indexing; lesson 08, "
                 "section 1, \"Processes and devices, local and global\"."])
def check_local_part(local_part):
    def job(owners):
        """Devices with ids as the CPU backend numbers them (lesson 08): process p's k-th device has id 2048 p + k."""
        return [FakeDevice(2048 * p + owners[:i].count(p), p) for i, p in enumerate(owners)]

    layouts = {
        "2 processes x 4 devices, in order": job([i // 4 for i in range(8)]),
        "2 processes, devices interleaved": job([i % 2 for i in range(8)]),
        "4 processes x 2 devices": job([i // 2 for i in range(8)]),
        "2 processes, mesh in reverse id order": list(reversed(job([i // 4 for i in range(8)]))),
        "3 processes, ids with no pattern": [FakeDevice(i, p) for i, p in zip([17, 3, 40, 9, 5, 21, 11, 38],
                                                                             [2, 0, 1, 1, 0, 2, 0, 1])],
    }
    rng = np.random.default_rng(8)    # rows of another shape and other values in each layout (each call gets a copy)
    cases = [Case((batch, devices, pid), f"local_part for process {pid} ({name})")
             for (name, devices), tail in zip(layouts.items(), [(3, 2), (2,), (4,), (3,), (2, 2)])
             for batch in [rng.integers(-99, 100, size=(len(devices), *tail))]
             for pid in sorted({d.process_index for d in devices})]
    hints = {f"index {d.id} is out of bounds": "A device's id is a label, not its position: here process 1's devices "
             "have ids from 2048 on (lesson 08, section 3). Use each device's position in the list."
             for ds in layouts.values() for d in ds if d.id >= 8}       # an id used as an index, not any bad index
    try:
        diagnose(local_part, cases, solution=solution_local_part, mistakes=MISTAKES_08_2, name="local_part",
                 run=lambda fn, c: _stacked(call(fn, c.args[0].copy(), list(c.args[1]), c.args[2], name="local_part",
                                                 hints=hints)))
    except Mismatch as e:
        if "dtype int32 where int64" not in str(e):
            raise
        raise Mismatch(f"{e} JAX's default integer is int32 (unless jax_enable_x64 is set): a jnp function "
                       "narrowed the int64 rows. NumPy indexing keeps their dtype.") from None
    return "each process feeds exactly the devices it owns, wherever they sit in the mesh, whatever their ids."


# ----------------------------------------------------------------------------------------------
# 08.3 The global batch from each process's rows, in the global layout of lessons 06-07

DATA = "data"


def solution_global_batch(local_rows, mesh):
    split = NamedSharding(mesh, P("data"))                      # rows split over the mesh, as in lessons 06-07
    global_shape = (local_rows.shape[0] * jax.process_count(),) + local_rows.shape[1:]
    return jax.make_array_from_process_local_data(split, local_rows, global_shape)


def _names(fn) -> dict:
    """{name: jax's name} for jax's own functions that ``fn`` names (in a branch that runs or not) by a global name
    bound before the call (an import, or ``f = jax.f``) rather than as jax.<name>."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return {}
    names = dict(getattr(fn, "__globals__", {}))
    for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
        with contextlib.suppress(ValueError):          # an empty cell
            names[name] = cell.cell_contents
    found, todo = set(), [code]
    while todo:                                        # fn's code and the functions and lambdas nested in it
        c = todo.pop()
        todo += [k for k in c.co_consts if hasattr(k, "co_code")]
        found |= {i.argval for i in dis.get_instructions(c) if i.opname in ("LOAD_GLOBAL", "LOAD_DEREF")}
    return {name: api for name in found for api in ("make_array_from_process_local_data", "process_count")
            if names.get(name) is getattr(jax, api)}


def _patched(calls, devices, process=None):
    """jax.make_array_from_process_local_data, each call recorded in ``calls`` as (sharding, rows, global shape), in
    a simulated job on ``devices``: one process, or with ``process`` that process of 2, where it returns what that
    process would get (a ShapeDtypeStruct of the global shape; None asked for is both processes' rows)."""
    real = jax.make_array_from_process_local_data

    def record(sharding, local_data, global_shape=None):
        if process is not None and global_shape is None:
            global_shape = (2 * len(local_data), *np.shape(local_data)[1:])
        calls.append((sharding, local_data, global_shape))
        if global_shape is not None and not isinstance(global_shape, tuple):
            raise TypeError(f"global_shape {global_shape!r} is not a tuple: it is a tuple of ints, like an array's "
                            ".shape: the whole batch's row count, then the other axes unchanged.")
        if process is None:
            return real(sharding, local_data, global_shape)
        return jax.ShapeDtypeStruct(global_shape, np.asarray(local_data).dtype)

    mine = [d for i, d in enumerate(devices) if process is None or i * 2 // len(devices) == process]
    job = dict(process_count=lambda *a, **k: 1 + (process is not None), process_index=lambda *a, **k: process or 0,
               local_device_count=lambda *a, **k: len(mine), local_devices=lambda *a, **k: list(mine),
               device_count=lambda *a, **k: len(devices), devices=lambda *a, **k: list(devices))
    return mock.patch.multiple(jax, make_array_from_process_local_data=record, **job)


def mixed_devices(n=None) -> list:
    """``n`` of ``jax.devices()`` (all by default), neither the first nor the last ones nor in id order
    ([5, 2, 6, 1] of 8): an answer that ignores the devices or the mesh it is given cannot match them."""
    devices = jax.devices()
    return list(dict.fromkeys(devices[i % len(devices)] for i in (5, 2, 6, 1, 3, 4, 0, 7)))[:n]


def _split(sharding, mesh=None) -> Said:
    """How ``sharding`` lays an array out: "split as P('data',) over devices [4, 5, 6, 7]", or "whole on devices
    [...]" (a copy on each), the devices in mesh order: another order is another layout. Trailing whole axes are
    left out, and an axis in the place of ``mesh``'s is named as ``mesh`` names it: only the placement counts."""
    spec, own = getattr(sharding, "spec", None), getattr(sharding, "mesh", None)
    if spec is None:
        return Said(f"placed as {type(sharding).__name__}")
    names = dict(zip(getattr(own, "axis_names", ()), getattr(mesh or own, "axis_names", ())))
    spec = P(*[names.get(x, x) if isinstance(x, str) else x for x in spec][
        :max([i + 1 for i, x in enumerate(spec) if x] or [0])])
    devices = [d.id for d in own.devices.flat] if isinstance(own, jax.sharding.Mesh) else own
    whole = not spec or getattr(sharding, "is_fully_replicated", False)
    return Said(f"whole on devices {devices}" if whole else f"split as {spec} over devices {devices}")


def _batch_runner(fn, case):
    """One process (the real API): (the array, its split, how often the API was called). As process p of a
    simulated 2-process job: (the rows it passed, the global shape it asked for, the split, the calls)."""
    n, full, process = case.args
    mesh = jax.make_mesh((n,), (DATA,), axis_types=(jax.sharding.AxisType.Explicit,), devices=mixed_devices(n))
    calls = []
    if process is None:
        try:
            with _patched(calls, list(mesh.devices.flat)):      # a job of one process, on the mesh
                got = call(fn, full.copy(), mesh, name="global_batch", hints=_batch_hints(full, n))
        except Mismatch as e:       # a mesh of its own: its split is not the given mesh's
            own = [getattr(c[0], "mesh", mesh) for c in calls if getattr(c[0], "mesh", mesh) != mesh]
            if own:
                raise Mismatch(str(e).replace(f" {_ROWS_SPLIT}", "") + " The sharding asked for names a mesh "
                               f"of its own ({own[0].size} device(s)), not the mesh you were given: use that "
                               "one.") from None
            raise
        if not isinstance(got, jax.Array):
            raise Mismatch(f"global_batch returned {describe_tree(got)}; expected a jax.Array on the mesh's devices.")
        if got.ndim == full.ndim + 1 and got.shape[:2] == (n, len(full) // n):
            raise Mismatch(f"global_batch returned shape {got.shape}: the stacked (n, B // n, ...) layout is "
                           "pmap's. Lessons 06 and 07 keep the global shape (B, ...) and let the sharding say "
                           "which rows each device holds.")
        return got, _split(got.sharding), Said(f"the API called {len(calls)} time(s)")
    half = full.shape[0] // 2
    with _patched(calls, sorted(mesh.devices.flat, key=lambda d: d.id), process):
        call(fn, full[process * half:(process + 1) * half].copy(), mesh, name="global_batch")
    if len(calls) != 1:
        return Said(f"the API called {len(calls)} time(s)")
    sharding, data, shape = calls[0]
    return np.asarray(data), Said(f"global_shape {shape}"), _split(sharding), Said("the API called 1 time(s)")


_ROWS_SPLIT = "Split the batch's rows (axis 0) over 'data', nothing else."
SPEC_ALONE = {"if a PartitionSpec is passed": "A PartitionSpec alone does not say which mesh it refers to: pair it "
                                              "with the mesh you were given (lesson 06, section 1)."}


def _batch_hints(full, n):
    """call's hints for one process holding ``full`` on a mesh of ``n`` devices (of all jax.devices())."""
    devices = {f"Got global_shape=({len(full) * k},": f"That is this process's rows times {k}, the number of "
               f"{what}: a process feeds all of its devices, so the row count grows with the processes, not the "
               "devices." for k, what in ((n, "the mesh's devices"), (len(jax.devices()), "devices")) if k > 2}
    return {"does not evenly divide": _ROWS_SPLIT,
            "should be None or equal to local_data.shape": f"Here one process holds all {len(full)} rows, shape "
            f"{full.shape}: the global shape must follow from this process's rows and the number of processes, then "
            "every other axis of the rows, however many there are: no number written in.", **devices,
            "pytree structure error": "The global shape is a tuple of ints, like an array's .shape.", **SPEC_ALONE}


def _batch_as(spec=P(DATA), rows=lambda r: r.shape[0] * jax.process_count()):
    """global_batch with one mistake: another spec, or another global row count."""
    def global_batch(local_rows, mesh):
        return jax.make_array_from_process_local_data(NamedSharding(mesh, spec), local_rows,
                                                      (rows(local_rows), *local_rows.shape[1:]))
    return global_batch


MISTAKES_08_3 = [
    Mistake("local shape", "The global_shape you passed is the shape of this process's own rows, as if the job "
            "had one process. The global shape holds every process's rows: jax.process_count() counts the "
            "processes, 2 in the checker's simulated job.", _batch_as(rows=lambda r: r.shape[0])),
    Mistake("replicated", "The array is not split: expected axis 0 split over the mesh axis 'data' of the mesh you "
            "were given, the other axes whole.", _batch_as(spec=P())),
    Mistake("device_put", "It builds the array without calling jax.make_array_from_process_local_data: in a job "
            "of several processes, only that function assembles the global array from every process's rows "
            "(lesson 08, section 1).", lambda rows, mesh: jax.device_put(rows, NamedSharding(mesh, P(DATA)))),
]


@exercise("08.3", "Build the global batch from this process's rows", solution=solution_global_batch,
          returns="a jax.Array of the global shape (rows of every process together, ...), split along axis 0 over "
                  "the mesh axis 'data', built with jax.make_array_from_process_local_data",
          hints=["Each process holds only its own rows; the array you build describes the whole batch of the job. "
                 "Its shape is the global one, as in lessons 06 and 07: no (n, B // n) stacking.",
                 "jax.make_array_from_process_local_data takes a sharding, this process's rows and the global "
                 "shape (lesson 08, section 1). jax.process_count says how many processes feed rows.",
                 "The API to read: jax.make_array_from_process_local_data's documentation, its global_shape "
                 "argument; and lesson 08, section 1, \"Each process loads its own part of the batch\"."])
def check_global_batch(global_batch):
    by_name = _names(global_batch)
    if by_name:
        used = " and ".join(a + (f" (as {k})" if k != a else "") for k, a in sorted(by_name.items()))
        raise Mismatch(f"global_batch refers to {used} by a name imported or saved from jax before the call (the "
                       "checker reads the code, not which branch runs). It simulates a 2-process job by replacing "
                       "them in the jax module, which such a name escapes: write them as jax.<name>, as the "
                       "exercise's text says.")
    cases, rng = [], np.random.default_rng(8)      # rows of rank 2 and 3, fractions in no order: rounding shows
    for n, tail in ((len(jax.devices()), (3,)), (4, (2, 3)), (2, (5,))):
        full = rng.normal(size=(2 * n, *tail)).astype(np.float32)
        where = f"on a mesh of {n} devices, rows of shape {tail}"
        cases += [Case((n, full, None), f"global_batch {where}, one process holding all {2 * n} rows", n=n)]
        cases += [Case((n, full, p), f"global_batch as process {p} of a 2-process job {where} (holding rows "
                       f"{p * n}..{p * n + n - 1})", n=n) for p in (0, 1)]
    diagnose(global_batch, sorted(cases, key=lambda c: c.args[2] is not None), solution=solution_global_batch,
             mistakes=MISTAKES_08_3, run=_batch_runner, name="global_batch")
    return ("the global batch in the layout of lessons 06-07, built from each process's own rows; run as either "
            "process of a simulated 2-process job, the same function gives the same global array.")
