"""Collectives, as plain NumPy: what each device holds after ``psum``, ``all_gather``, ``ppermute``, ...

Lesson 04. Every function here takes the per-device inputs stacked on a leading axis,
``xs`` of shape ``(n, ...)`` where ``xs[i]`` is what device ``i`` holds, and returns the
per-device outputs the same way, ``(n, ...)``. That is the shape ``jax.pmap`` uses, so a
reference and the real collective compare directly::

    xs = np.arange(8.0).reshape(4, 2)                       # 4 devices, 2 values each
    ref = collectives.psum(xs)                               # (4, 2): every row is xs.sum(0)
    got = jax.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i")(xs)
    np.testing.assert_allclose(got, ref)

They are written for clarity, not speed: loops over devices, as the data moves.
The exercise checkers of lesson 04 compare learners' collectives with them.

They keep JAX's dtypes: the inputs become what JAX would make of them (``int64`` becomes ``int32`` unless
``jax_enable_x64`` is on), a ``psum`` of ``int8`` wraps around in ``int8`` as JAX's does, a ``psum`` of booleans
counts them in ``int32``, and a ``pmean`` of integers is a float.
"""

from __future__ import annotations

import jax
import numpy as np

from . import _checks

__all__ = ["axis_index", "psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "ppermute",
           "all_to_all", "ring_permutation", "ring_allreduce_bytes",
           "ring_reduce_scatter_bytes"]


def _per_device(xs, where: str = "collectives") -> np.ndarray:
    """``xs`` as the array JAX would make of it: its dtype canonicalised (no 64-bit types without x64)."""
    try:
        xs = np.asarray(xs)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{where}: xs must be per-device values stacked on a leading axis, shape (n_devices, ...), "
                        f"got {_checks.shown(xs)} ({e}). Pass an array such as np.arange(8.0).reshape(4, 2).") from None
    if xs.dtype == object or xs.dtype.kind in "USV":
        raise TypeError(f"{where}: xs must be a numeric array, shape (n_devices, ...), got dtype {xs.dtype} "
                        f"({_checks.shown(xs)}). Pass numbers, e.g. np.arange(8.0).reshape(4, 2).")
    if xs.ndim == 0:
        raise ValueError(f"{where}: xs must be per-device values stacked on a leading axis, shape (n_devices, ...); "
                         f"got a scalar, {xs!r}. Stack one value per device, e.g. np.array([{xs.item()!r}] * 4).")
    if xs.shape[0] == 0:
        raise ValueError(f"{where}: xs must hold at least one device's value, got shape {xs.shape}. Pass shape "
                         "(n_devices, ...) with n_devices >= 1.")
    return xs.astype(jax.dtypes.canonicalize_dtype(xs.dtype), copy=False)


def axis_index(n: int) -> np.ndarray:
    """``(n,)``: device ``i`` holds ``i``, its position along the mapped axis."""
    return np.arange(_checks.whole(n, "n", "axis_index"), dtype=jax.dtypes.canonicalize_dtype(np.int64))


def _sum(xs) -> np.ndarray:
    """The sum over devices in JAX's dtype: integers wrap around in their own width, booleans are counted."""
    if xs.dtype == np.bool_:
        return xs.sum(axis=0, dtype=jax.dtypes.canonicalize_dtype(np.int64))
    return xs.sum(axis=0, dtype=xs.dtype)


def psum(xs) -> np.ndarray:
    """``(n, ...) -> (n, ...)``: every device holds the sum over all devices, in ``xs``'s dtype (as JAX: an integer
    sum wraps around; booleans are counted as ``int32``)."""
    xs = _per_device(xs, "psum")
    return np.broadcast_to(_sum(xs), xs.shape).copy()


def pmean(xs) -> np.ndarray:
    """``(n, ...) -> (n, ...)``: every device holds the mean over all devices (as JAX: ``psum / n``, a float for
    integer inputs, after the integer sum has wrapped around)."""
    xs = _per_device(xs, "pmean")
    total = _sum(xs)
    if not np.issubdtype(total.dtype, np.inexact):
        total = total.astype(jax.dtypes.canonicalize_dtype(np.float64))
    return np.broadcast_to(total / np.asarray(xs.shape[0], total.dtype), xs.shape).astype(total.dtype)


def pmax(xs) -> np.ndarray:
    """``(n, ...) -> (n, ...)``: every device holds the elementwise maximum over all devices."""
    xs = _per_device(xs, "pmax")
    return np.broadcast_to(xs.max(axis=0), xs.shape).copy()


def pmin(xs) -> np.ndarray:
    """``(n, ...) -> (n, ...)``: every device holds the elementwise minimum over all devices."""
    xs = _per_device(xs, "pmin")
    return np.broadcast_to(xs.min(axis=0), xs.shape).copy()


def all_gather(xs, axis: int = 0, tiled: bool = False) -> np.ndarray:
    """Every device gets every device's value.

    ``(n, *s) -> (n, *s')``: with ``tiled=False`` the values are stacked on a new axis ``axis``
    of size ``n`` (``s'`` has one more axis); with ``tiled=True`` they are concatenated along
    the existing axis ``axis`` (which grows ``n``-fold).
    """
    xs = _per_device(xs, "all_gather")
    per_device_ndim = xs.ndim - 1
    if tiled and per_device_ndim == 0:
        raise ValueError("all_gather: tiled=True must have an axis to concatenate along, but each device holds a "
                         "scalar. Pass tiled=False to stack the values on a new axis.")
    axis = _checks.axis(axis, "axis", "all_gather", per_device_ndim if tiled else per_device_ndim + 1)
    n = xs.shape[0]
    parts = [xs[j] for j in range(n)]
    gathered = np.concatenate(parts, axis=axis) if tiled else np.stack(parts, axis=axis)
    return np.stack([gathered] * n)


def psum_scatter(xs, scatter_dimension: int = 0, tiled: bool = False) -> np.ndarray:
    """Sum over devices, then device ``i`` keeps only block ``i`` of the sum (a reduce-scatter).

    ``(n, *s) -> (n, *s')``: with ``tiled=False``, ``s[scatter_dimension]`` must be ``n`` and
    that axis disappears (device ``i`` gets ``sum[i]``); with ``tiled=True`` it must divide by
    ``n`` and shrinks ``n``-fold (device ``i`` gets the ``i``-th contiguous block).
    """
    xs = _per_device(xs, "psum_scatter")
    n = xs.shape[0]
    if xs.ndim < 2:
        raise ValueError(f"psum_scatter: xs must give each device an array to scatter, shape (n_devices, m, ...), got "
                         f"shape {xs.shape}. Give each device at least one axis.")
    scatter_dimension = _checks.axis(scatter_dimension, "scatter_dimension", "psum_scatter", xs.ndim - 1)
    total = _sum(xs)
    size = total.shape[scatter_dimension]
    if tiled:
        if size % n:
            raise ValueError(f"psum_scatter(tiled=True): scatter_dimension {scatter_dimension} has size {size}, "
                             f"which does not divide across {n} devices; make it a multiple of {n}.")
        return np.stack(np.split(total, n, axis=scatter_dimension))
    if size != n:
        raise ValueError(f"psum_scatter: scatter_dimension {scatter_dimension} has size {size}; without tiled=True "
                         f"it must equal the number of devices, {n}. Pass tiled=True to split it into {n} blocks.")
    return np.stack([np.take(total, i, axis=scatter_dimension) for i in range(n)])


def ppermute(xs, perm) -> np.ndarray:
    """Send device ``src``'s value to device ``dst`` for each ``(src, dst)`` in ``perm``.

    ``(n, ...) -> (n, ...)``. A device that receives nothing holds zeros. ``perm`` must be a
    permutation: no device sends twice, none receives twice.
    """
    xs = _per_device(xs, "ppermute")
    n = xs.shape[0]
    perm = _pairs(perm, n)
    sources, dests = [s for s, _ in perm], [d for _, d in perm]
    if len(set(sources)) != len(sources) or len(set(dests)) != len(dests):
        raise ValueError(f"ppermute: perm must be a permutation, got {perm}: a device appears twice as a source or "
                         "as a destination. Name each device at most once on each side, e.g. "
                         f"collectives.ring_permutation({n}).")
    out = np.zeros_like(xs)
    for s, d in perm:
        out[d] = xs[s]
    return out


def _pairs(perm, n):
    fix = f"Pass (source, destination) pairs of devices in 0..{n - 1}, e.g. collectives.ring_permutation({n})."
    try:
        pairs = [tuple(p) for p in perm]
    except TypeError:
        _checks.fail("ppermute", "perm", "a list of (source, destination) pairs", perm, fix, TypeError)
    if any(len(p) != 2 for p in pairs):
        _checks.fail("ppermute", "perm", "a list of (source, destination) pairs", perm, fix, ValueError)
    out = []
    for pair in pairs:
        s, d = (_checks.whole(i, "perm", "ppermute", minimum=None, fix=fix) for i in pair)
        if not (0 <= s < n and 0 <= d < n):
            _checks.fail("ppermute", "perm", f"pairs of devices in 0..{n - 1} ({n} devices)", perm, fix, ValueError)
        out.append((s, d))
    return out


def all_to_all(xs, split_axis: int, concat_axis: int, tiled: bool = False) -> np.ndarray:
    """Each device splits its value into ``n`` chunks along ``split_axis`` and sends chunk ``j`` to device ``j``;
    device ``i`` puts the chunks it receives (from devices ``0..n-1``, in order) together along ``concat_axis``.

    ``(n, *s) -> (n, *s')``. With ``tiled=False``, ``s[split_axis]`` must be ``n``: that axis is removed and
    the received chunks are stacked on a new axis at ``concat_axis``. With ``tiled=True`` it must divide by
    ``n``, and the chunks are concatenated along the existing ``concat_axis``.
    """
    xs = _per_device(xs, "all_to_all")
    n = xs.shape[0]
    if xs.ndim < 2:
        raise ValueError(f"all_to_all: xs must give each device an array to split, shape (n_devices, m, ...), got "
                         f"shape {xs.shape}. Give each device at least one axis.")
    split_axis = _checks.axis(split_axis, "split_axis", "all_to_all", xs.ndim - 1)
    concat_axis = _checks.axis(concat_axis, "concat_axis", "all_to_all", xs.ndim - 1)
    size = xs.shape[1:][split_axis]
    if (size % n) if tiled else (size != n):
        need = "divide by" if tiled else "equal"
        raise ValueError(f"all_to_all: split_axis {split_axis} has size {size}; it must {need} the number of "
                         f"devices, {n}. Pick the axis whose size {need}s {n}"
                         f"{'' if tiled else ', or pass tiled=True'}.")
    out = []
    for i in range(n):
        if tiled:
            received = [np.split(xs[j], n, axis=split_axis)[i] for j in range(n)]
            out.append(np.concatenate(received, axis=concat_axis))
        else:
            received = [np.take(xs[j], i, axis=split_axis) for j in range(n)]
            out.append(np.stack(received, axis=concat_axis))
    return np.stack(out)


def ring_permutation(n: int, shift: int = 1) -> list[tuple[int, int]]:
    """``[(i, (i + shift) % n)]``: every device sends to its neighbour ``shift`` places on, round a ring."""
    n = _checks.whole(n, "n", "ring_permutation")
    shift = _checks.whole(shift, "shift", "ring_permutation", minimum=None)
    return [(i, (i + shift) % n) for i in range(n)]


def _ring_args(n_devices, message_bytes, where: str) -> int:
    n_devices = _checks.whole(n_devices, "n_devices", where)
    if isinstance(message_bytes, bool) or not isinstance(message_bytes, (int, float, np.number)) \
            or not message_bytes >= 0:
        _checks.fail(where, "message_bytes", "a number of bytes >= 0", message_bytes,
                     "Pass the message size, e.g. message_bytes=x.nbytes.",
                     ValueError if isinstance(message_bytes, (int, float, np.number)) else TypeError)
    return n_devices


def ring_allreduce_bytes(n_devices: int, message_bytes: float) -> float:
    """Bytes each device sends in a ring all-reduce of a ``message_bytes`` message: ``2 (N - 1) / N * V``.

    A reduce-scatter (``N - 1`` steps of ``V / N``) then an all-gather (the same again).
    """
    n_devices = _ring_args(n_devices, message_bytes, "ring_allreduce_bytes")
    return 2 * (n_devices - 1) / n_devices * message_bytes


def ring_reduce_scatter_bytes(n_devices: int, message_bytes: float) -> float:
    """Bytes each device sends in a ring reduce-scatter (``psum_scatter``): ``(N - 1) / N * V``.

    The first half of :func:`ring_allreduce_bytes`: ``N - 1`` steps of ``V / N``. What each device *keeps* is
    ``V / N``; what it sends is about ``V``, half of an all-reduce's traffic, whatever ``N``.
    """
    n_devices = _ring_args(n_devices, message_bytes, "ring_reduce_scatter_bytes")
    return (n_devices - 1) / n_devices * message_bytes
