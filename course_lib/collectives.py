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
"""

from __future__ import annotations

import numpy as np

__all__ = ["axis_index", "psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "ppermute",
           "all_to_all", "ring_permutation", "ring_allreduce_bytes"]


def _per_device(xs) -> np.ndarray:
    xs = np.asarray(xs)
    if xs.ndim == 0:
        raise ValueError("collectives take per-device values stacked on a leading axis, shape (n_devices, ...); "
                         "got a scalar.")
    return xs


def axis_index(n: int) -> np.ndarray:
    """``(n,)``: device ``i`` holds ``i``, its position along the mapped axis."""
    return np.arange(n)


def psum(xs) -> np.ndarray:
    """``(n, ...) -> (n, ...)``: every device holds the sum over all devices."""
    xs = _per_device(xs)
    return np.broadcast_to(xs.sum(axis=0), xs.shape).copy()


def pmean(xs) -> np.ndarray:
    """``(n, ...) -> (n, ...)``: every device holds the mean over all devices."""
    xs = _per_device(xs)
    return np.broadcast_to(xs.mean(axis=0), xs.shape).astype(np.result_type(xs.dtype, np.float32))


def pmax(xs) -> np.ndarray:
    """``(n, ...) -> (n, ...)``: every device holds the elementwise maximum over all devices."""
    xs = _per_device(xs)
    return np.broadcast_to(xs.max(axis=0), xs.shape).copy()


def pmin(xs) -> np.ndarray:
    """``(n, ...) -> (n, ...)``: every device holds the elementwise minimum over all devices."""
    xs = _per_device(xs)
    return np.broadcast_to(xs.min(axis=0), xs.shape).copy()


def all_gather(xs, axis: int = 0, tiled: bool = False) -> np.ndarray:
    """Every device gets every device's value.

    ``(n, *s) -> (n, *s')``: with ``tiled=False`` the values are stacked on a new axis ``axis``
    of size ``n`` (``s'`` has one more axis); with ``tiled=True`` they are concatenated along
    the existing axis ``axis`` (which grows ``n``-fold).
    """
    xs = _per_device(xs)
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
    xs = _per_device(xs)
    n = xs.shape[0]
    total = xs.sum(axis=0)
    size = total.shape[scatter_dimension]
    if tiled:
        if size % n:
            raise ValueError(f"psum_scatter(tiled=True): axis {scatter_dimension} has size {size}, "
                             f"which does not divide across {n} devices.")
        return np.stack(np.split(total, n, axis=scatter_dimension))
    if size != n:
        raise ValueError(f"psum_scatter: axis {scatter_dimension} has size {size}; without tiled=True it must "
                         f"equal the number of devices, {n}.")
    return np.stack([np.take(total, i, axis=scatter_dimension) for i in range(n)])


def ppermute(xs, perm) -> np.ndarray:
    """Send device ``src``'s value to device ``dst`` for each ``(src, dst)`` in ``perm``.

    ``(n, ...) -> (n, ...)``. A device that receives nothing holds zeros. ``perm`` must be a
    permutation: no device sends twice, none receives twice.
    """
    xs = _per_device(xs)
    n = xs.shape[0]
    perm = [(int(s), int(d)) for s, d in perm]
    sources, dests = [s for s, _ in perm], [d for _, d in perm]
    if len(set(sources)) != len(sources) or len(set(dests)) != len(dests):
        raise ValueError(f"ppermute: {perm} is not a permutation: a device appears twice as a source or as a "
                         "destination.")
    if any(not 0 <= i < n for i in sources + dests):
        raise ValueError(f"ppermute: {perm} names a device outside 0..{n - 1}.")
    out = np.zeros_like(xs)
    for s, d in perm:
        out[d] = xs[s]
    return out


def all_to_all(xs, split_axis: int, concat_axis: int, tiled: bool = False) -> np.ndarray:
    """Each device splits its value into ``n`` chunks along ``split_axis`` and sends chunk ``j`` to device ``j``;
    device ``i`` puts the chunks it receives (from devices ``0..n-1``, in order) together along ``concat_axis``.

    ``(n, *s) -> (n, *s')``. With ``tiled=False``, ``s[split_axis]`` must be ``n``: that axis is removed and
    the received chunks are stacked on a new axis at ``concat_axis``. With ``tiled=True`` it must divide by
    ``n``, and the chunks are concatenated along the existing ``concat_axis``.
    """
    xs = _per_device(xs)
    n = xs.shape[0]
    size = xs.shape[1:][split_axis]
    if (size % n) if tiled else (size != n):
        need = "divide by" if tiled else "equal"
        raise ValueError(f"all_to_all: split axis {split_axis} has size {size}; it must {need} the number of "
                         f"devices, {n}.")
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
    return [(i, (i + shift) % n) for i in range(n)]


def ring_allreduce_bytes(n_devices: int, message_bytes: float) -> float:
    """Bytes each device sends in a ring all-reduce of a ``message_bytes`` message: ``2 (N - 1) / N * V``.

    A reduce-scatter (``N - 1`` steps of ``V / N``) then an all-gather (the same again).
    """
    if n_devices < 1:
        raise ValueError("n_devices must be >= 1")
    return 2 * (n_devices - 1) / n_devices * message_bytes
