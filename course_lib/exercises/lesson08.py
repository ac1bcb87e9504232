"""Lesson 08 exercises: which part of a global batch each process loads."""

import numpy as np

from . import Mismatch, as_array, call, describe_tree, exercise, expect_array


# ----------------------------------------------------------------------------------------------
# 08.1 The rows of a global batch that one process loads


def solution_process_rows(global_batch, num_processes, process_id):
    per_process = global_batch // num_processes
    return slice(process_id * per_process, (process_id + 1) * per_process)


@exercise("08.1", "The rows of the global batch one process loads", solution=solution_process_rows,
          returns="a slice(start, stop): one contiguous block of global_batch // num_processes rows",
          hints=["Every process loads the same number of rows, one contiguous block, in process order.",
                 "per_process = global_batch // num_processes; return slice(process_id * per_process, "
                 "(process_id + 1) * per_process)."])
def check_process_rows(process_rows):
    for batch, procs in [(64, 2), (96, 4), (30, 3), (8, 8)]:
        per = batch // procs
        seen = []
        for pid in range(procs):
            got = call(process_rows, batch, procs, pid, name="process_rows")
            what = f"process_rows({batch}, {procs}, {pid})"
            if not isinstance(got, slice):
                raise Mismatch(f"{what} should return a slice, like slice(start, stop); got {describe_tree(got)}.")
            try:
                rows = list(range(batch))[got]
            except (TypeError, ValueError) as e:
                raise Mismatch(f"{what} returned {got!r}, which cannot select rows ({e}): start and stop must be "
                               "ints.") from None
            if got.step not in (None, 1) and len(rows) == per:
                raise Mismatch(f"{what} takes every {got.step}-th row (interleaved). Give each process one "
                               f"contiguous block of {per} rows, so its rows line up with its devices.")
            expect_array(rows, list(range(pid * per, (pid + 1) * per)), what=f"the rows of {what}")
            seen += rows
        if sorted(seen) != list(range(batch)):
            raise Mismatch(f"for a batch of {batch} on {procs} processes the slices do not cover every row once.")
    return "each process loads one contiguous block of batch // num_processes rows."


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


@exercise("08.2", "This process's rows of a sharded batch, from the devices it owns",
          solution=solution_local_part,
          returns="an array of shape (number of devices this process owns, ...): row i of batch for each "
                  "position i whose device belongs to this process, in order",
          hints=["Do not assume the devices of one process sit next to each other: ask each device which "
                 "process owns it.",
                 "rows = [i for i, d in enumerate(devices) if d.process_index == process_index]; return "
                 "batch[rows]."])
def check_local_part(local_part):
    layouts = {
        "2 processes x 4 devices, in order": [FakeDevice(i, i // 4) for i in range(8)],
        "2 processes, devices interleaved": [FakeDevice(i, i % 2) for i in range(8)],
        "4 processes x 2 devices": [FakeDevice(i, i // 2) for i in range(8)],
    }
    reference = np.arange(8 * 3 * 2).reshape(8, 3, 2)  # private: each call gets its own copy
    for name, devices in layouts.items():
        for pid in sorted({d.process_index for d in devices}):
            owned = [i for i, d in enumerate(devices) if d.process_index == pid]
            expected = reference[owned].copy()
            contiguous = reference[pid * len(owned):(pid + 1) * len(owned)].copy()
            what = f"local_part for process {pid} ({name})"
            got = call(local_part, reference.copy(), list(devices), pid, name="local_part")
            got = as_array(got, what=what, expected_shape=expected.shape)
            if got.shape == expected.shape and not np.array_equal(got, expected) and \
                    np.array_equal(got, contiguous):
                raise Mismatch(f"{what} returns a contiguous block of rows, but this process owns the devices at "
                               f"positions {owned}: read each device's process_index instead of assuming an order.")
            expect_array(got, expected, what=what)
    return "each process feeds exactly the devices it owns, wherever they sit in the mesh."
