"""Sharding and replication for ``jax.pmap``: getting a batch and a set of parameters onto the devices.

Lessons 02 and 03. ``jax.pmap`` maps exactly one slice of the leading axis to each
device, so a global batch ``(B, ...)`` must first become ``(n_devices, B // n_devices, ...)``
(``shard``), and parameters that every device needs must be stacked once per device
(``replicate``). ``unshard`` and ``unreplicate`` undo them. Every function takes a
pytree (a dict of arrays, a tuple, nested containers) and treats each leaf alike.

``pad_batch`` makes a batch divisible by the device count and returns a mask of the
real rows, for the last batch of an epoch.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from . import _checks

__all__ = ["shard", "unshard", "replicate", "unreplicate", "pad_batch", "device_mesh", "replicate_on_mesh",
           "shard_on_mesh"]

DEVICE_AXIS = "devices"


def _leaves_with_paths(tree):
    return jax.tree_util.tree_flatten_with_path(tree)[0]


def _name(path) -> str:
    return "the array" if not path else f"leaf {jax.tree_util.keystr(path)}"


def _array_leaves(tree, where: str):
    """The (path, leaf) pairs of ``tree``; a TypeError naming the leaf if one is not an array or a number."""
    leaves = _leaves_with_paths(tree)
    for path, x in leaves:
        if not isinstance(x, (jax.Array, np.ndarray, np.generic, int, float, complex)) or isinstance(x, str):
            raise TypeError(f"{where}: {_name(path)} is a {type(x).__name__} ({_checks.shown(x)}); every leaf "
                            f"must be an array or a number. Convert it with np.asarray, or keep it out of the "
                            f"pytree you pass.")
    return leaves


def _same_batch_size(tree, where: str) -> None:
    """Every leaf has a leading axis, and they all share its size (the batch size)."""
    leaves = _array_leaves(tree, where)
    sizes = {jax.tree_util.keystr(p) or "the array": (np.shape(x)[0] if np.ndim(x) else None) for p, x in leaves}
    if len(set(sizes.values())) > 1 and None not in sizes.values():
        raise ValueError(f"{where}: the leaves of tree must share one batch size on axis 0, got {sizes}. Inputs "
                         f"and labels need one row per example: cut or pad them to the same number of rows.")


def shard(tree, n_devices: int | None = None):
    """Split the leading (batch) axis of every leaf across devices: ``(B, ...) -> (n, B // n, ...)``.

    Only the shape changes; the arrays stay where they are (``jax.pmap`` places each
    of the ``n`` slices on its device). NumPy leaves stay NumPy arrays.

    Args:
      tree: a pytree of arrays, each with a leading batch axis ``B`` divisible by ``n``.
      n_devices: ``n``, by default ``jax.local_device_count()``.

    Raises:
      ValueError: a leaf has no leading axis, or ``B % n != 0``; the message names the
        leaf, ``B`` and ``n``, and the two fixes (drop the remainder, or pad and mask).
    """
    n = jax.local_device_count() if n_devices is None else _checks.whole(n_devices, "n_devices", "shard")
    _same_batch_size(tree, "shard")

    def split(path, x):
        shape = np.shape(x)
        if len(shape) == 0:
            raise ValueError(f"shard: {_name(path)} is a scalar; it has no batch axis to split across "
                             f"{n} devices. Broadcast it instead (in_axes=None) or replicate() it.")
        b = shape[0]
        if b % n:
            keep = b - b % n
            raise ValueError(
                f"shard: {_name(path)} has a batch of B={b}, which does not divide across n={n} devices "
                f"({b} = {n} x {b // n} + {b % n}). Either drop the remainder (x[:{keep}]), or pad the batch to "
                f"{keep + n} rows and mask the padding (course_lib.sharding.pad_batch(batch, {n}))."
            )
        return x.reshape((n, b // n) + tuple(shape[1:]))

    return jax.tree_util.tree_map_with_path(split, tree)


def unshard(tree):
    """Merge the device axis back into the batch: ``(n, b, ...) -> (n * b, ...)``. The inverse of ``shard``."""
    _array_leaves(tree, "unshard")

    def merge(path, x):
        shape = np.shape(x)
        if len(shape) < 2:
            raise ValueError(f"unshard: {_name(path)} has shape {shape}; it needs at least two axes, "
                             "(n_devices, per_device_batch, ...), as shard() returns.")
        return x.reshape((shape[0] * shape[1],) + tuple(shape[2:]))

    return jax.tree_util.tree_map_with_path(merge, tree)


def device_mesh(devices=None) -> Mesh:
    """A 1-D ``Mesh`` over ``devices`` (default: all local devices), with the axis named ``"devices"``."""
    devices = _checks.device_list(devices, "devices", "device_mesh")
    devices = jax.local_devices() if devices is None else devices
    return Mesh(np.array(devices), (DEVICE_AXIS,))


def replicate(tree, devices=None):
    """One copy of every leaf per device, stacked on a new leading axis: ``(...) -> (n, ...)``.

    Copy ``i`` is placed on ``devices[i]``, so the result is ready for ``jax.pmap`` with
    ``in_axes=0``: each device finds its copy already in place. Each copy is sent to its
    device directly; the ``n`` copies are never built on the host.

    Args:
      tree: a pytree of arrays or scalars (parameters, optimizer state, ...).
      devices: the devices, by default ``jax.local_devices()``.

    Returns:
      A pytree of ``jax.Array``, each of shape ``(n, ...)``, sharded one copy per device.
    """
    _array_leaves(tree, "replicate")
    mesh = device_mesh(_checks.device_list(devices, "devices", "replicate"))
    devs = list(mesh.devices.flat)
    sharding = NamedSharding(mesh, P(DEVICE_AXIS))

    def copy(x):
        x = jnp.asarray(x)
        one = x[None]
        return jax.make_array_from_single_device_arrays(
            (len(devs),) + x.shape, sharding, [jax.device_put(one, d) for d in devs])

    return jax.tree.map(copy, tree)


def unreplicate(tree):
    """The first device's copy of every leaf: ``(n, ...) -> (...)``.

    Also accepts arrays replicated with ``NamedSharding(mesh, P())`` (lesson 06), which are
    already one whole copy per device: ``(...) -> (...)``.

    Reads the copy held by the first addressable device (``x.addressable_shards[0]``),
    so nothing is gathered from the other devices, as ``x[0]`` on a sharded array would.
    It does not check that the copies agree; ``jax.pmap`` code keeps them equal by
    applying the same update everywhere (lesson 05).
    """

    _array_leaves(tree, "unreplicate")

    def first(x):
        if isinstance(x, jax.Array) and len(x.addressable_shards) > 1 and x.sharding.is_fully_replicated:
            return x.addressable_shards[0].data  # already one whole copy per device (P()): nothing to unstack
        if isinstance(x, jax.Array) and len(x.addressable_shards) > 1:
            data = x.addressable_shards[0].data
            if data.shape[:1] != (1,):
                raise ValueError(
                    f"unreplicate: expected one copy per device (shards of shape (1, ...)), but the first device "
                    f"holds a block of shape {data.shape} of an array of shape {x.shape}. Is it replicated?")
            return data[0]
        if np.ndim(x) == 0:
            raise ValueError("unreplicate: got a scalar; expected stacked copies of shape (n_devices, ...).")
        return x[0]

    return jax.tree.map(first, tree)


def pad_batch(tree, multiple: int | None = None):
    """Pad the batch axis with zeros up to a multiple of ``multiple``, and say which rows are real.

    ``(B, ...) -> (B', ...)`` with ``B' = ceil(B / multiple) * multiple``, plus a boolean mask
    ``(B',)``, ``True`` on the ``B`` real rows. Weight each example's loss by the mask so the
    padding counts for nothing (lesson 05).

    Args:
      tree: a pytree of arrays that share the batch size ``B`` on axis 0.
      multiple: by default ``jax.local_device_count()``.

    Returns:
      ``(padded_tree, mask)``.
    """
    multiple = jax.local_device_count() if multiple is None else _checks.whole(
        multiple, "multiple", "pad_batch", fix="Pass the device count, e.g. multiple=jax.local_device_count().")
    leaves = _array_leaves(tree, "pad_batch")
    if not leaves:
        raise ValueError("pad_batch: the batch has no arrays.")
    sizes = {(_name(p), np.shape(x)[0] if np.ndim(x) else None) for p, x in leaves}
    batch_sizes = {b for _, b in sizes}
    if None in batch_sizes or len(batch_sizes) != 1:
        raise ValueError(f"pad_batch: every leaf needs the same batch size on axis 0; got {sorted(sizes, key=str)}.")
    b = batch_sizes.pop()
    if b == 0:
        raise ValueError("pad_batch: the batch is empty (B=0).")
    target = math.ceil(b / multiple) * multiple

    def pad(x):
        widths = [(0, target - b)] + [(0, 0)] * (np.ndim(x) - 1)
        return np.pad(x, widths) if isinstance(x, np.ndarray) else jnp.pad(x, widths)

    mask = np.arange(target) < b
    return jax.tree.map(pad, tree), mask


# ---------------------------------------------------------------------------------------------
# The mesh-based forms (lessons 06-07): one global array with a sharding, instead of stacked copies.


def replicate_on_mesh(tree, mesh: Mesh | None = None):
    """A full copy of every leaf on every device of ``mesh``: ``device_put`` with ``P()``. Shapes unchanged.

    The ``jit``/``shard_map`` counterpart of ``replicate``: no stacked device axis.
    """
    mesh = device_mesh() if mesh is None else _check_mesh(mesh, "replicate_on_mesh")
    _array_leaves(tree, "replicate_on_mesh")
    replicated = NamedSharding(mesh, P())
    if replicated.is_fully_addressable:
        return jax.device_put(tree, replicated)
    # Several processes (lesson 08): each holds the same values and contributes its local copies.
    return jax.jit(lambda t: t, out_shardings=replicated)(tree)


def _check_mesh(mesh, where: str) -> Mesh:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"{where}: mesh must be a jax.sharding.Mesh, got {type(mesh).__name__} "
                        f"({_checks.shown(mesh)}). Build one with course_lib.sharding.device_mesh(devices) or "
                        f"jax.make_mesh.")
    return mesh


def shard_on_mesh(tree, mesh: Mesh | None = None, axis: str = DEVICE_AXIS):
    """Split axis 0 of every leaf over the mesh axis ``axis``: ``device_put`` with ``P(axis)``. Shapes unchanged.

    The ``jit``/``shard_map`` counterpart of ``shard``: ``(B, ...)`` stays ``(B, ...)``, and device ``i``
    holds rows ``i * B // n`` to ``(i + 1) * B // n``. ``B`` must divide by the axis size.
    """
    mesh = device_mesh() if mesh is None else _check_mesh(mesh, "shard_on_mesh")
    if not isinstance(axis, str) or axis not in mesh.axis_names:
        raise ValueError(f"shard_on_mesh: axis must name an axis of the mesh, one of {mesh.axis_names}, got "
                         f"{axis!r}. Pass axis={mesh.axis_names[0]!r}, or build the mesh with that axis name.")
    _array_leaves(tree, "shard_on_mesh")
    n = mesh.shape[axis]

    def put(path, x):
        b = np.shape(x)[0] if np.ndim(x) else None
        if b is None or b % n:
            raise ValueError(f"shard_on_mesh: {_name(path)} has shape {np.shape(x)}; its axis 0 must divide across "
                             f"the {n} devices of mesh axis {axis!r}.")
        return jax.device_put(x, NamedSharding(mesh, P(axis)))

    return jax.tree_util.tree_map_with_path(put, tree)
