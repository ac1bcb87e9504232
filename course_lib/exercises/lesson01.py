"""Lesson 01 exercises: data parallelism by hand, vmap, pmap."""

import jax
import jax.numpy as jnp
import numpy as np

from . import (Case, Mismatch, Mistake, Said, call, describe_tree, diagnose, exercise, expect_pmapped, placement,
               vmap_calls)
from .lesson00 import _data
from .lesson08 import mixed_devices


# A row's norm reduces it: one of these must run inside the vmap/pmap, not only around it
NORM = ({"reduce_sum", "dot_general", "reduce_max", "reduce_prod"}, "norm (a reduction of each row)")
MISTAKES_01_2 = MISTAKES_01_3 = [
    Mistake("squared norms", "That is the squared norm of each row (the sum of its squares): the square root is "
            "missing.", lambda x: jnp.sum(x ** 2, axis=1)),
    Mistake("one norm per column", "That is one value per column: the norms were taken over axis 0, not over each "
            "row.", lambda x: jnp.sqrt(jnp.sum(x ** 2, axis=0))),
    Mistake("the whole batch", "That is one number, the norm of the whole batch: expected one norm per row.",
            lambda x: jnp.sqrt(jnp.sum(x ** 2))),
]


# ----------------------------------------------------------------------------------------------
# 01.1 Split a batch across devices by hand


def solution_split_across(x, devices):
    n = len(devices)
    size = x.shape[0] // n
    return [jax.device_put(x[i * size:(i + 1) * size], d) for i, d in enumerate(devices)]


def _pieces_and_places(fn, case):
    """The pieces, and where each lives in words: ``pieces on: device 5, device 2, ...`` (piece 0 first)."""
    pieces = call(fn, *case.args, name="split_across", hints={
        "incompatible devices": "The pieces already live on different devices, so one operation (a stack, a "
                                "concatenate) cannot combine them: return them as they are, in a list."})
    if not isinstance(pieces, (list, tuple)) or len(pieces) != case.n:
        got = f"{len(pieces)} items" if isinstance(pieces, (list, tuple)) else describe_tree(pieces)
        raise Mismatch(f"split_across returned {got}; expected a list of {case.n} jax.Arrays, one per device "
                       "given: piece i on devices[i].")
    return list(pieces), Said("pieces on: " + ", ".join(placement(p).removeprefix("on ") for p in pieces))


MISTAKES_01_1 = [
    Mistake("every n-th row", "Piece i holds rows i, i + n, i + 2n, ...: every n-th row, where each device's piece "
            "is a run of consecutive rows.",
            lambda x, devs: [jax.device_put(x[i::len(devs)], d) for i, d in enumerate(devs)]),
    Mistake("left on the host", "The pieces are NumPy arrays in host memory: they never reached a device.",
            lambda x, devs: np.split(x, len(devs))),
    Mistake("columns split", "Each piece holds every row and some of the columns: x was split along axis 1, where "
            "each device takes a run of rows (axis 0).",
            lambda x, devs: [jax.device_put(p, d) for p, d in zip(np.array_split(x, len(devs), axis=1), devs)]),
]


@exercise("01.1", "Split a batch across devices by hand", solution=solution_split_across,
          returns="a list of len(devices) jax.Arrays, piece i of shape (B // n, d) on devices[i]",
          hints=["Each of the n devices gets B // n consecutive rows. Work out, for piece i, the first row and "
                 "the row after the last; and use the devices you are given, in their order: they need not start "
                 "at 0.",
                 "Section 2 of the lesson does it in two steps, Split and Place: read its cells, and what "
                 "`jax.device_put` takes as a target."])
def check_split_across(split_across):
    devices = jax.devices()         # two cases' devices are out of id order: piece i goes to devices[i]
    cases = [Case((_data((b, d), seed=len(devs) + b), list(devs)),
                  f"split_across(x {(b, d)}, devices with ids {[v.id for v in devs]})", n=len(devs))
             for devs, b, d in [(mixed_devices(), 2 * len(devices), 3), (devices[:4], 12, 2), (devices[:2], 2, 5),
                                (mixed_devices(4), 8, 2)]]
    diagnose(split_across, cases, solution=solution_split_across, mistakes=MISTAKES_01_1, run=_pieces_and_places,
             names=("piece", "placement"))
    return "each device holds its own consecutive slice of the batch."


# ----------------------------------------------------------------------------------------------
# 01.2 Batch a per-example function with vmap


def solution_batched_norms(x):
    def norm(v):
        return jnp.sqrt(jnp.sum(v**2))

    return jax.vmap(norm)(x)


@exercise("01.2", "Batch a per-example function with vmap", solution=solution_batched_norms,
          returns="an array of shape (B,), one norm per row of x (B, d)",
          hints=["Write the norm of ONE row first, a function of a vector of shape (d,); do not think about "
                 "the batch yet. A norm over axis 1 of the whole batch gets the numbers without the point of the "
                 "exercise.",
                 "Section 3 of the lesson: `jax.vmap`, and what the function it returns takes."])
def check_batched_norms(batched_norms):
    probe = jnp.asarray(_data((7, 13), seed=713))  # first, and a shape no earlier call is likely to have cached
    inside = set()
    vmaps = vmap_calls(batched_norms, probe, inside=inside)
    cases = [Case((jnp.asarray(_data((b, d), seed=b * 10 + d)),), f"batched_norms(x {(b, d)})")
             for b, d in [(8, 3), (5, 7), (1, 2), (7, 13), (12, 4)]]

    def run(fn, case):
        got = call(fn, *case.args, name="batched_norms")
        if case.args[0].shape[0] > 1 and isinstance(got, jax.Array) and len(got.devices()) > 1:
            raise Mismatch(f"batched_norms{case.label[13:]} is spread over {len(got.devices())} devices: that is "
                           "jax.pmap's answer, one row per device, which cannot take more rows than there are "
                           "devices. The exercise is jax.vmap: the whole batch on one device (section 3).")
        return got

    diagnose(batched_norms, cases, solution=solution_batched_norms, mistakes=MISTAKES_01_2, rtol=1e-4, run=run)
    if vmaps == 0 or vmaps and not inside & (NORM[0] | {"add", "cumsum"}):   # a norm written as a loop too
        how = ("no jax.vmap ran while it computed them: it works on the whole batch at once (a norm over axis 1) or "
               "takes the rows one at a time (a Python loop, jax.lax.map)" if vmaps == 0 else f"no {NORM[1]} runs "
               "inside its vmap: the vmapped function only passes the rows on; the norm is taken outside it")
        raise Mismatch(f"batched_norms has the right values, but {how}. The exercise is vmap: write the norm of ONE "
                       "row, and let jax.vmap map it over the batch (section 3).")
    return "vmap turned a function of one example into a function of a batch."


# ----------------------------------------------------------------------------------------------
# 01.3 The same function on every device, with pmap


def solution_norms_on_devices(x):
    def norm(v):
        return jnp.sqrt(jnp.sum(v**2))

    return jax.pmap(norm)(x)


@exercise("01.3", "The same function on every device, with pmap", solution=solution_norms_on_devices,
          returns="a jax.Array of shape (n,), one norm per row, spread over the n devices (row i on device i)",
          hints=["The same per-row function as in 01.2; only the transformation changes, and the result "
                 "stays where it was computed.",
                 "Section 4 of the lesson: `jax.pmap`, and how long x's leading axis may be."])
def check_norms_on_devices(norms_on_devices):
    devices = jax.devices()
    cases = [Case((jnp.asarray(_data((n, d), seed=n + d)),), f"norms_on_devices(x {(n, d)})", n=n)
             for n, d in [(len(devices), 3), (4, 6), (2, 5)]]
    rows = ("pmap was given a count of devices other than x's rows: it cuts axis 0 into one block per device, and "
            "here each device takes one row. Give pmap exactly x.shape[0] devices (a slice of jax.devices() "
            "can come up short), or none: it then takes the first ones.")
    results = diagnose(norms_on_devices, cases, solution=solution_norms_on_devices, mistakes=MISTAKES_01_3,
                       rtol=1e-4, run=lambda fn, case: call(fn, *case.args, name="norms_on_devices", summaries={
                           "is partitioned": rows, "squeeze out": rows}, hints={"incompatible devices": "Results that "
                           "live on different devices cannot be joined by one operation (a stack): pmap returns them "
                           "as one array, already spread over the devices."}))
    for case, got in zip(cases, results):
        expect_pmapped(norms_on_devices, got, case.args, devices[:case.n], what=case.label, name="norms_on_devices",
                       how=f"so that each of the {case.n} rows is computed on its own device", work=[NORM],
                       in_order=True)
    return "one program, one row per device, the results spread over the devices."
