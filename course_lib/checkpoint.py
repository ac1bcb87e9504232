"""Checkpoints of a training run with Orbax: save on one set of devices, restore onto another, resume.

Lesson 11. A checkpoint is one directory per step, ``<directory>/<step>/``, written by
``orbax-checkpoint``: the ``TrainState`` (every array with its shape, dtype and sharding: Orbax stores
the mesh's device ids, its axis names and each array's ``PartitionSpec`` in ``state/_sharding``) and a
small JSON record of everything else a run needs to go on exactly where it stopped (the position of the
data iterator, a seed, your notes).

* ``Checkpoints(directory, keep=3, asynchronous=True)`` is the directory: ``save``, ``restore``,
  ``steps``, ``latest_step``, ``wait``. ``save``, ``restore`` and ``latest_step`` are the same as
  one-line functions.
* Orbax alone restores each array onto the sharding it was saved with. ``restore`` here always gives
  Orbax a target instead (``jax.ShapeDtypeStruct``s with a sharding), which overrides the saved one: the
  devices you name (``devices=``, replicated with ``P()``), the shardings you give (``sharding=``), or
  by default where ``like``'s leaves live. So a state saved from 8 devices restores onto 4 or onto 1,
  and Orbax reads each device's part from disk straight onto that device.
* ``resume(make_batches, position)`` restarts a seeded data iterator at a given batch, so that a
  resumed run sees the batches the uninterrupted run would have seen.

What makes it safe (Orbax does the work; lesson 11 shows each): a save writes into a temporary
directory and renames it into place only when every file is written, so a crash mid-save leaves
no step that looks valid (in a single process, the next save of a ``Checkpoints`` removes such a
half-written step; with several processes it stays, as with Orbax's default, until a save of that step);
``keep=N`` deletes all but the newest N steps; ``asynchronous=True`` writes in a background thread
while training goes on; with several processes every process calls ``save``, each writes its own
arrays and process 0 alone writes the metadata.

Errors name the argument, the value and the fix, before anything is read or written: a missing
directory or step, a damaged checkpoint, a state whose structure, shapes or dtypes differ from the
saved one (no silent cast), a directory that cannot be written, a step older than one already saved
(Orbax itself skips such a save silently), a second ``Checkpoints`` saving into a directory another
one is saving into, and, with ``keep=``, a state holding NaN or infinity (it would push the last finite
steps out of the directory).

States whose leaves have the same shape on any number of devices (those of the ``"shard_map"`` and
``"jit"`` backends, or your own sharded pytrees) restore onto any device count whose sizes divide
their sharded axes. A ``sharded_state.ShardedState`` pads its flat vectors to a multiple of the device
count: build ``like`` with ``sharded_state.init_state`` on the new mesh and ``restore`` re-pads.
A ``"pmap"`` state is stacked, ``(n_devices, ...)``, and only restores onto as many devices.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import pathlib
import shutil
import weakref
from typing import Any, Callable, Iterable, Iterator

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from . import _checks

__all__ = ["Checkpoints", "CheckpointError", "save", "restore", "latest_step", "steps", "resume", "replicated_on",
           "TMP_MARKER"]

TMP_MARKER = ".orbax-checkpoint-tmp"  # what Orbax adds to the name of a step directory still being written


_fail = _checks.fail  # every wrong argument: "<function>: <argument> must be ..., got ... <fix>"


class CheckpointError(ValueError):
    """A checkpoint is missing, damaged, or does not match the state it is restored into."""


def _ocp():
    import orbax.checkpoint as ocp  # imported on first use: it takes a second and is only needed here
    return ocp


def _is_key(x) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _keys_to_data(tree):
    """Typed PRNG keys -> their raw ``uint32`` data (Orbax stores plain arrays)."""
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


def _directory(directory, where: str) -> pathlib.Path:
    if isinstance(directory, bool) or not isinstance(directory, (str, os.PathLike)) or str(directory) == "":
        _fail(where, "directory", "a path (a str or a pathlib.Path)", directory,
                     "Pass e.g. directory=pathlib.Path(tempfile.mkdtemp()) / 'run'.", TypeError)
    return pathlib.Path(directory)


def _step(step, where: str, *, optional: bool = False):
    if optional and step is None:
        return None
    return _checks.whole(step, "step", where, minimum=0,
                         fix="Steps are whole numbers, e.g. step=100" + (", or None for the newest." if optional
                                                                          else "."))


def _check_tree(tree, name: str, where: str) -> None:
    """A pytree with at least one leaf, every leaf an array or a number (what Orbax stores)."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    if leaves and leaves[0][0] == ():
        _fail(where, name, "a pytree of arrays (a dict, a list, a TrainState)", tree,
              f"Wrap a single array in a dict, e.g. {name}={{'x': x}}.", TypeError)
    if not leaves:
        _fail(where, name, "a pytree of arrays (e.g. a TrainState)", tree,
                     "It holds no array: pass the state itself.", TypeError)
    for path, leaf in leaves:
        if isinstance(leaf, (str, bytes)) or not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")
                                                  or isinstance(leaf, (int, float, np.number))):
            _fail(where, f"{name} leaf {jax.tree_util.keystr(path) or '(the root)'}", "an array or a number",
                         leaf, "Keep other values in extra= (JSON), or convert them with np.asarray.", TypeError)


def replicated_on(devices) -> NamedSharding:
    """``NamedSharding(Mesh(devices, ("devices",)), P())``: a whole copy of an array on each of ``devices``."""
    devices = _checks.device_list(devices, "devices", "replicated_on", allow_none=False)
    return NamedSharding(jax.sharding.Mesh(np.array(devices), ("devices",)), P())


def _targets(like, devices, sharding):
    """The abstract arrays to restore into: ``like``'s shapes and dtypes, placed as asked."""
    if devices is not None and sharding is not None:
        raise ValueError("restore: give devices= or sharding=, not both. devices=[...] puts a whole copy on each; "
                         "sharding= places each leaf as you say.")
    devices = _checks.device_list(devices, "devices", "restore")
    if sharding is not None and not isinstance(sharding, jax.sharding.Sharding):
        if isinstance(sharding, P):
            _fail("restore", "sharding", "a jax.sharding.Sharding or a pytree of them", sharding,
                         "A PartitionSpec needs a mesh: pass NamedSharding(mesh, spec).", TypeError)
        if not jax.tree.leaves(sharding, is_leaf=lambda s: isinstance(s, jax.sharding.Sharding)) or not all(
                isinstance(s, jax.sharding.Sharding)
                for s in jax.tree.leaves(sharding, is_leaf=lambda s: isinstance(s, jax.sharding.Sharding))):
            _fail("restore", "sharding", "a jax.sharding.Sharding or a pytree of them", sharding,
                         "Pass e.g. NamedSharding(mesh, P()), or devices=[...] for a whole copy on each.", TypeError)
    leaves, treedef = jax.tree.flatten(like)
    if sharding is None:
        shardings = [replicated_on(devices)] * len(leaves) if devices is not None else \
            [getattr(x, "sharding", None) for x in leaves]
    elif isinstance(sharding, jax.sharding.Sharding):
        shardings = [sharding] * len(leaves)
    else:
        shardings, sharding_def = jax.tree.flatten(sharding, is_leaf=lambda s: isinstance(s, jax.sharding.Sharding))
        if sharding_def != treedef:
            raise ValueError(f"restore: sharding must be one Sharding or a pytree of them shaped like the state; got "
                             f"{sharding_def}, the state is {treedef}. Give one Sharding per leaf of like=, or a "
                             "single Sharding for all.")
    if any(s is None for s in shardings):
        shardings = [s or replicated_on(jax.devices()[:1]) for s in shardings]
    out = []
    for x, s in zip(leaves, shardings):
        if _is_key(x):
            data = jax.random.key_data(x) if isinstance(x, jax.Array) else \
                jax.eval_shape(jax.random.key_data, x)
            out.append(jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=s))
        else:
            out.append(jax.ShapeDtypeStruct(np.shape(x), jax.dtypes.result_type(x), sharding=s))
    return jax.tree.unflatten(treedef, out)


def _flat_keys(tree, is_leaf=None) -> dict:
    """``{"params/0/w": leaf}``: each leaf by its path, whatever the containers (Orbax's metadata uses dicts)."""
    def part(k):
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                return str(getattr(k, attr))
        return str(k)
    return {"/".join(part(k) for k in path): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]}


def _saved_leaves(step_dir: pathlib.Path) -> dict | None:
    """``{"params/0/w": metadata}`` for every array of a step (shape, dtype, sharding), or ``None`` if unreadable.

    Read before Orbax starts reading arrays: a failure inside its reader leaves background threads complaining."""
    try:
        metadata = _ocp().StandardCheckpointHandler().metadata(step_dir / "state")
        return _flat_keys(getattr(metadata, "tree", metadata), is_leaf=lambda x: hasattr(x, "shape"))
    except Exception:  # no readable metadata: Orbax's own restore reports it
        return None


def _mismatch(saved: dict | None, targets, padded: set) -> str | None:
    """The first leaf whose saved shape or dtype differs from the target's (``padded``: keys allowed to differ in
    their first axis, re-padded after the read)."""
    wanted = _flat_keys(targets)
    if saved is None or set(saved) != set(wanted):
        return None        # another structure: Orbax names every difference
    for key, t in wanted.items():
        shape = tuple(getattr(saved[key], "shape", ()) or ())
        if shape != tuple(t.shape) and key not in padded:
            return f"leaf {key} was saved with shape {shape}, like= asks for {tuple(t.shape)}."
        dtype = getattr(saved[key], "dtype", None)
        if dtype is not None and np.dtype(dtype) != np.dtype(t.dtype):
            return (f"leaf {key} was saved as {np.dtype(dtype).name}, like= asks for {np.dtype(t.dtype).name} "
                    "(restore does not cast: that would change the numbers silently; cast after restoring if you "
                    "mean it).")
    return None


def _sharded_layout(like):
    """``like.layout`` if ``like`` is a ``sharded_state.ShardedState`` (its flat vectors are padded per device
    count), else ``None``."""
    from . import sharded_state
    return like.layout if isinstance(like, sharded_state.ShardedState) else None


def _repaddable(saved: dict | None, targets, layout) -> set:
    """Keys of a ShardedState's flat ``(P_pad,)`` vectors saved with another padding (another device count)."""
    if saved is None or layout is None:
        return set()
    out = set()
    for key, t in _flat_keys(targets).items():
        shape = tuple(getattr(saved.get(key), "shape", ()) or ())
        if (len(shape) == 1 and tuple(t.shape) == (layout.padded,) and shape != tuple(t.shape)
                and shape[0] >= layout.n_params):
            out.add(key)
    return out


def _all_finite(leaves):
    import jax.numpy as jnp
    return [jnp.isfinite(x).all() for x in leaves]


_all_finite_jit = jax.jit(_all_finite)   # one small program per state structure, compiled once


def _nonfinite(state) -> str | None:
    """The path of the first float leaf of ``state`` that holds NaN or infinity, or ``None``.

    One compiled program reduces every float leaf on its devices to a flag; only the flags come to the host."""
    import jax.numpy as jnp
    leaves = [(path, x) for path, x in jax.tree_util.tree_flatten_with_path(state)[0]
              if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)]
    if not leaves:
        return None
    arrays = [x for _, x in leaves]
    try:
        flags = _all_finite_jit(arrays)
    except ValueError:  # leaves on different sets of devices: one at a time
        flags = [_all_finite_jit([x])[0] for x in arrays]
    bad = [jax.tree_util.keystr(path) for (path, _), ok in zip(leaves, jax.device_get(flags)) if not ok]
    return bad[0] if bad else None


def _rewrap_keys(restored, like):
    def back(r, x):   # a key saved by Orbax itself (not through save) comes back typed already
        return jax.random.wrap_key_data(r, impl=jax.random.key_impl(x)) if _is_key(x) and not _is_key(r) else r
    return jax.tree.map(back, restored, like)


class Checkpoints:
    """A directory of checkpoints, one per step: ``<directory>/<step>/``.

    Args:
      directory: where the steps go; created if missing.
      keep: keep only the newest ``keep`` steps (``None``: all of them).
      asynchronous: ``save`` returns once the arrays are copied off the devices, and a background thread
        writes them; call ``wait()`` (or leave the ``with`` block) before reading the files.

    Use it as a context manager, or call ``close()``: both wait for a save still being written.
    """

    def __init__(self, directory, *, keep: int | None = None, asynchronous: bool = False):
        directory = _directory(directory, "Checkpoints")
        keep = _checks.optional_whole(keep, "keep", "Checkpoints",
                                      fix="It is how many of the newest steps to keep, e.g. keep=3, or None for all.")
        if not isinstance(asynchronous, (bool, np.bool_)):
            _fail("Checkpoints", "asynchronous", "True or False", asynchronous,
                         "Pass asynchronous=True to write in a background thread.", TypeError)
        asynchronous = bool(asynchronous)
        self.directory = directory.absolute()
        _checks.writable_directory(self.directory, "Checkpoints", "checkpoints")
        ocp = _ocp()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=asynchronous,
                                               cleanup_tmp_directories=False)
        self._keep, self._lock_fd, self._last_saved = keep, None, None
        try:
            self._manager = ocp.CheckpointManager(self.directory, options=options)
        except OSError as e:
            raise PermissionError(f"directory={str(directory)!r} cannot be written ({e.strerror or e}). Pass a "
                                  "directory you can write to, e.g. under tempfile.mkdtemp().") from None

    def steps(self) -> list[int]:
        """Every complete step in the directory, oldest first (a step still being written is not one)."""
        # Orbax writes a step into "<step>.orbax-checkpoint-tmp..." and renames it to "<step>" once complete.
        if not self.directory.is_dir():
            return []
        return sorted(int(p.name) for p in self.directory.iterdir() if p.is_dir() and p.name.isdigit())

    def latest_step(self) -> int | None:
        """The newest complete step, or ``None`` in an empty directory."""
        done = self.steps()
        return done[-1] if done else None

    def save(self, step: int, state, extra: dict | None = None) -> None:
        """Save ``state`` (any pytree of arrays, e.g. a ``TrainState``) and ``extra`` (JSON) as ``step``.

        The first save takes the directory for this ``Checkpoints`` until ``close`` and, in a single process,
        removes the half-written steps a crash left there (``<step>.orbax-checkpoint-tmp``).

        Raises:
          ValueError: ``step`` is not newer than the latest saved step (Orbax would skip it silently), ``extra``
            is not JSON, or, with ``keep=`` set, a float leaf of ``state`` holds NaN or infinity (saving it would
            push the last finite steps out of the directory; with ``keep=None`` nothing is deleted, and it is
            saved).
          CheckpointError: another ``Checkpoints`` is saving into the same directory.
        """
        step = _step(step, "save")
        if extra is not None and not isinstance(extra, dict):
            _fail("save", "extra", "a dict of JSON values (or None)", extra,
                         "Pass e.g. extra={'position': 100}.", TypeError)
        _check_tree(state, "state", "save")
        latest = max([s for s in (self.latest_step(), self._last_saved) if s is not None], default=None)
        if latest is not None and step <= latest:
            raise ValueError(f"save: step={step}, but {self.directory.name}/ already holds step {latest}: Orbax would skip "
                             f"this save without a word. Resume from step {latest} (restore it), or save to an "
                             "empty directory for a new run.")
        import json
        try:
            json.dumps(extra or {})
        except TypeError as e:
            raise ValueError(f"save: extra must hold only JSON values (numbers, strings, lists, dicts): {e}. "
                             "Convert arrays with .tolist() or int().") from None
        bad = _nonfinite(state) if self._keep is not None else None
        if bad:
            kept = (f"the newest saved step, {latest}, is still in {self.directory.name}/" if latest is not None
                    else f"{self.directory.name}/ holds no step yet")
            raise ValueError(f"save: state leaf {bad} holds NaN or infinity at step {step}: not saved, since with "
                             f"keep={self._keep} it would push the last finite steps out of the directory ({kept}). "
                             "Restore the last finite step and find where the run diverged (e.g. a lower learning "
                             "rate). To keep this state for debugging, save it into another directory with "
                             "keep=None.")
        self._take_directory()
        ocp = _ocp()
        args = ocp.args.Composite(state=ocp.args.StandardSave(_keys_to_data(state)),
                                  extra=ocp.args.JsonSave(extra or {}))
        if not self._manager.save(int(step), args=args, force=True):
            raise CheckpointError(f"save: Orbax did not save step {step} in {self.directory.name}/.")
        self._last_saved = int(step)

    def _take_directory(self) -> None:
        """Before the first save: hold the directory (one writer at a time) and remove half-written steps.

        Two ``Checkpoints`` saving into one directory race: under ``keep=`` each deletes only its own old steps
        (4 steps with ``keep=2``), and two saves of one step collide inside Orbax. The lock is ``flock`` on the
        directory, held by process 0 (with several processes every process saves into one directory) until
        ``close``; the operating system releases it if the process dies. In a single process, a step left as
        ``<step>.orbax-checkpoint-tmp`` by a crash is then nobody's save in progress, and is deleted. With several
        processes it is left alone, as Orbax does by default (pass Orbax's ``cleanup_tmp_directories=True`` to
        your own manager to remove it there).
        """
        if self._lock_fd is not None or jax.process_index() != 0:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise CheckpointError(f"save: another Checkpoints (in this process or another) is saving into "
                                  f"{self.directory.name}/ now. Two writers in one directory delete each other's "
                                  "steps under keep= and collide on a step they both save. Close the other one "
                                  "first (ckpt.close(), or leave its with block), or give this run its own "
                                  "directory.") from None
        self._lock_fd = fd
        self._unlock = weakref.finalize(self, os.close, fd)
        self._manager.reload()  # the steps another writer saved before we took the directory count for keep=
        if jax.process_count() == 1:
            for p in self.directory.iterdir():
                if TMP_MARKER in p.name and p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)

    def wait(self) -> None:
        """Block until an asynchronous save has been written and renamed into place."""
        self._manager.wait_until_finished()

    def restore(self, like, *, step: int | None = None, devices=None, sharding=None):
        """Read ``step`` (default: the newest) into arrays shaped like ``like``, on the devices asked for.

        Args:
          like: a pytree with the saved state's structure, shapes and dtypes (a fresh ``TrainState`` from
            ``training.init_state``, or ``jax.ShapeDtypeStruct`` leaves); its values are not used.
          devices: put every leaf, whole, on each of these devices (``P()`` over a mesh of them).
          sharding: one ``jax.sharding.Sharding`` for every leaf, or a pytree of them shaped like ``like``.
            With neither, each leaf goes where ``like``'s leaf lives.

        Returns:
          ``(state, extra)``: ``state`` shaped like ``like``, ``extra`` the dict given to ``save``.

        Orbax alone would put each array back on the sharding stored in the checkpoint; the target built here
        (``like``'s shapes and dtypes, placed as asked) overrides it. A ``sharded_state.ShardedState`` saved on
        another device count is re-padded for ``like``'s mesh.

        Raises:
          CheckpointError: no such directory or step, a damaged step, or ``like`` does not match what was saved
            (structure, shape, or dtype: nothing is cast).
          ValueError: a sharding that does not divide a leaf, or ``devices=``/``sharding=`` with a ``ShardedState``
            ``like`` (its layout fixes its mesh: build ``like`` on the devices you want).
        """
        step = _step(step, "restore", optional=True)
        _check_tree(like, "like", "restore")
        available = self.steps() if self.directory.is_dir() else []
        if step is None:
            if not available:
                raise CheckpointError(f"restore: no checkpoint in {self.directory.name}/ (it is empty or missing). Save one "
                                      "first, or pass the directory the run wrote to.")
            step = available[-1]
        elif step not in available:
            raise CheckpointError(f"restore: step={step} is not in {self.directory.name}/; the steps there are {available}. "
                                  "Pass one of them, or step=None for the newest.")
        layout = _sharded_layout(like)
        if layout is not None and (devices is not None or sharding is not None):
            asked = f"devices= ({len(devices)} device(s))" if devices is not None else "sharding="
            raise ValueError(f"restore: like= is a sharded_state.ShardedState laid out on {layout.n_devices} devices "
                             f"(its layout holds the mesh, and its step runs there); {asked} would put its arrays "
                             "elsewhere, and the next step would refuse them. Build like= on the devices you want, "
                             "sharded_state.init_state(params, optimizer, sharded_state.data_mesh(devices), "
                             "stage=...), and restore without devices= or sharding=.")
        targets = _targets(like, devices, sharding)
        for path, t in jax.tree_util.tree_flatten_with_path(targets)[0]:
            try:  # checked here: a failure inside Orbax's reader leaves its background threads complaining
                t.sharding.shard_shape(t.shape)
            except ValueError as e:
                raise ValueError(f"restore: sharding= does not fit leaf {jax.tree_util.keystr(path)} of shape {t.shape}: "
                                 f"{e}. Use a device count that divides that axis, or replicate the leaf "
                                 "with P().") from None
        saved = _saved_leaves(self.directory / str(step))
        repad = _repaddable(saved, targets, layout)
        mismatch = _mismatch(saved, targets, repad)
        if mismatch:
            raise CheckpointError(f"restore: the state given as like= does not match step {step} in "
                                  f"{self.directory.name}/: {mismatch} Build like= the way the saved state was "
                                  "built (same model, optimizer and backend).")
        if repad:  # a ShardedState saved on another device count: read its flat vectors whole, then re-pad
            whole = NamedSharding(layout.mesh, P())
            keys = list(_flat_keys(targets))
            leaves, treedef = jax.tree.flatten(targets)
            leaves = [jax.ShapeDtypeStruct(tuple(saved[k].shape), t.dtype, sharding=whole) if k in repad else t
                      for k, t in zip(keys, leaves)]
            read_targets = jax.tree.unflatten(treedef, leaves)
        else:
            read_targets = targets
        ocp = _ocp()
        args = ocp.args.Composite(state=ocp.args.StandardRestore(read_targets), extra=ocp.args.JsonRestore())
        try:
            restored = self._manager.restore(step, args=args)
        except (ValueError, TypeError) as e:
            text = str(e)
            if "tree structures do not match" in text or "not compatible with the stored shape" in text:
                first = " ".join(ln.strip() for ln in text.splitlines()[:6] if ln.strip())
                first = first.split(" If this mismatch is intentional")[0]   # Orbax's option, not restore's
                raise CheckpointError(f"restore: the state given as like= does not match step {step} in "
                                      f"{self.directory.name}/: {first} Build like= the way the saved state was "
                                      "built (same model, optimizer and backend).") from None
            if "single, unnamed (default) checkpointable" in text:   # saved by Orbax alone, one unnamed item
                raise CheckpointError(f"restore: step {step} in {self.directory.name}/ was saved by Orbax directly, "
                                      "as one unnamed item, not in the state + extra layout that checkpoint.save "
                                      "writes; the checkpoint itself is fine. Restore it with Orbax's own CheckpointManager and a "
                                      "StandardRestore target (lesson 11, section 1), or save with "
                                      "checkpoint.save to restore with checkpoint.restore.") from None
            raise self._damaged(step, e, available) from None
        except Exception as e:  # tensorstore and file errors for damaged files
            raise self._damaged(step, e, available) from None
        if repad:
            import jax.numpy as jnp
            keys = list(_flat_keys(targets))
            got, treedef = jax.tree.flatten(restored["state"])
            want = jax.tree.leaves(targets)
            got = [jax.device_put(jnp.pad(x[:layout.n_params], (0, layout.padded - layout.n_params)), t.sharding)
                   if k in repad else x for k, x, t in zip(keys, got, want)]
            return _rewrap_keys(jax.tree.unflatten(treedef, got), like), dict(restored["extra"] or {})
        return _rewrap_keys(restored["state"], like), dict(restored["extra"] or {})

    def _damaged(self, step, error, available) -> CheckpointError:
        what = (str(error).splitlines() or [""])[0].replace(str(self.directory.parent) + os.sep, "")[:200]
        others = [s for s in available if s != step]
        return CheckpointError(f"restore: step {step} in {self.directory.name}/ could not be read; it looks damaged (truncated "
                               f"or edited files; Orbax says {type(error).__name__}: {what}). Restore another step "
                               f"({others or 'none left'}), or delete this one.")

    def close(self) -> None:
        """Wait for a save in progress, then release Orbax's background threads and the directory."""
        try:
            self._manager.wait_until_finished()
            self._manager.close()
        finally:
            if self._lock_fd is not None:
                self._unlock()
                self._lock_fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"Checkpoints({self.directory.name!r}, steps={self.steps()})"


def save(directory, step: int, state, extra: dict | None = None) -> None:
    """Save ``state`` and ``extra`` as ``<directory>/<step>/`` and wait until it is written (see ``Checkpoints``)."""
    directory = _directory(directory, "save")
    _step(step, "save")
    _check_tree(state, "state", "save")
    with Checkpoints(directory) as ckpt:
        ckpt.save(step, state, extra)


def restore(directory, like, *, step: int | None = None, devices=None, sharding=None):
    """``(state, extra)`` from ``<directory>/<step>/`` (default: newest), placed as asked (see ``Checkpoints.restore``)."""
    directory = _directory(directory, "restore")
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"restore: directory={directory.name!r} is a file, not a checkpoint directory. Pass "
                                 "the directory the run saved to (it holds one folder per step).")
    if not directory.is_dir():
        raise CheckpointError(f"restore: directory={str(directory.name)!r} does not exist: no checkpoint to restore. Pass the "
                              "directory the run saved to.")
    with Checkpoints(directory) as ckpt:
        return ckpt.restore(like, step=step, devices=devices, sharding=sharding)


def steps(directory) -> list[int]:
    """The complete steps in ``directory``, oldest first; ``[]`` if there is none (or no directory)."""
    directory = _directory(directory, "steps")
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"steps: directory={directory.name!r} is a file, not a checkpoint directory. Pass the "
                                 "directory the run saved to.")
    if not directory.is_dir():
        return []
    with Checkpoints(directory) as ckpt:
        return ckpt.steps()


def latest_step(directory) -> int | None:
    """The newest complete step in ``directory``, or ``None``."""
    directory = _directory(directory, "latest_step")
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"latest_step: directory={directory.name!r} is a file, not a checkpoint directory. "
                                 "Pass the directory the run saved to.")
    done = steps(directory)
    return done[-1] if done else None


def resume(make_batches: Callable[[], Iterable], position: int) -> Iterator:
    """The batches of ``make_batches()`` from number ``position`` on (0-based): where a stopped run left off.

    ``make_batches`` must give the same sequence every time (a seeded ``data.batches``); the first
    ``position`` batches are generated and dropped, so the next one is the batch the uninterrupted run
    would have used next. Save ``position`` (the number of batches used so far) in the checkpoint's ``extra``.
    """
    if not callable(make_batches):
        _fail("resume", "make_batches", "a function that returns the batches", make_batches,
                     "Pass e.g. lambda: data.batches(x, y, 128, seed=0, epochs=None), so that resume can start them "
                     "again from the beginning.", TypeError)
    position = _checks.whole(position, "position", "resume", minimum=0,
                             fix="It is the number of batches already used, e.g. extra['position'].")
    return itertools.islice(iter(make_batches()), int(position), None)
