"""Argument checks shared by every course_lib module: one wording for every wrong argument.

Each check raises before any work starts, with a message of the form::

    <function>: <argument> must be <what>, got <value>. <how to fix it>

``TypeError`` when the value is of the wrong kind, ``ValueError`` when its kind is right and its value is not.
Whole numbers go through ``operator.index``, so NumPy integers are accepted; ``bool`` is not a number here.
"""

from __future__ import annotations

import operator
import os
import pathlib

__all__ = ["shown", "whole", "optional_whole", "one_of", "device_list", "axis", "fail", "writable_directory"]


def shown(value) -> str:
    """``value`` for an error message: its repr, cut at 80 characters; a function by its name and an object whose
    repr holds a memory address by its type (a message, and a notebook's stored output, holds no addresses)."""
    text = repr(value)
    if " at 0x" in text:
        return (f"the function {value.__name__}" if callable(value) and hasattr(value, "__name__")
                else f"a {type(value).__name__}")
    return text if len(text) <= 80 else text[:77] + "..."


def fail(where: str, name: str, what: str, value, fix: str = "", kind: type[Exception] = ValueError):
    """Raise ``kind`` with the course's wording; never returns."""
    message = f"{where}: {name} must be {what}, got {shown(value)}."
    raise kind(message + (" " + fix if fix else ""))


def whole(value, name: str, where: str, *, minimum: int | None = 1, fix: str = "") -> int:
    """``value`` as a Python ``int`` (NumPy integers accepted), at least ``minimum``; bools and floats rejected."""
    what = "a whole number" + (f" >= {minimum}" if minimum is not None else "")
    if isinstance(value, bool):
        fail(where, name, what, value, fix or f"Pass a number, e.g. {name}={max(minimum or 0, 1)}.", TypeError)
    try:
        number = operator.index(value)
    except TypeError:
        number = None
    if number is None:
        hint = ""
        if isinstance(value, float) and value.is_integer():
            hint = f"Pass int({value!r}) = {int(value)}."
        fail(where, name, what, value, fix or hint or f"Pass a whole number, e.g. {name}={max(minimum or 0, 1)}.",
             TypeError)
    if minimum is not None and number < minimum:
        fail(where, name, what, value, fix or f"Pass {name}={minimum} or more.")
    return number


def optional_whole(value, name: str, where: str, *, minimum: int | None = 1, fix: str = "") -> int | None:
    """``whole``, or ``None`` left as it is."""
    return None if value is None else whole(value, name, where, minimum=minimum, fix=fix)


def one_of(value, name: str, where: str, choices) -> object:
    """``value`` if it is one of ``choices``."""
    if not any(value == c and type(value) is type(c) for c in choices):
        fail(where, name, "one of " + ", ".join(repr(c) for c in choices), value,
             f"Pass {name}={choices[0]!r}, for example.")
    return value


def _device_like(d) -> bool:
    """A description of a device (e.g. one reported by another process): ``id``, ``process_index``, ``platform``."""
    return all(hasattr(d, a) for a in ("id", "process_index", "platform")) and not isinstance(d, (int, str))


def device_list(devices, name: str, where: str, *, allow_none: bool = True, described: bool = False) -> list | None:
    """``devices`` as a non-empty list of distinct ``jax.Device`` (``None`` passes through when allowed).

    ``described=True`` also accepts objects that describe a device (``id``, ``process_index``, ``platform``), for
    functions that only draw or print them.
    """
    import jax

    if devices is None and allow_none:
        return None
    if isinstance(devices, jax.Device):
        fail(where, name, "a list of jax.Device", devices, f"Wrap the one device in a list: {name}=[device].",
             TypeError)
    given = devices   # the messages below show what was passed, not what it became
    try:
        devices = list(devices.flat) if hasattr(devices, "flat") and not isinstance(devices, list) else list(devices)
    except TypeError:
        devices = None
    if devices is None:
        fail(where, name, "a list of jax.Device", given, f"Pass e.g. {name}=jax.devices()[:4].", TypeError)
    if not devices:
        fail(where, name, "a non-empty list of jax.Device", given,
             f"Pass at least one device, e.g. {name}=jax.devices().")
    wrong = [d for d in devices if not (isinstance(d, jax.Device) or (described and _device_like(d)))]
    if wrong:
        fail(where, name, "a list of jax.Device", given,
             f"It holds {type(wrong[0]).__name__} {shown(wrong[0])}; pass the devices themselves, e.g. "
             f"{name}=[jax.devices()[i] for i in ...], not their indices.", TypeError)
    if len({id(d) for d in devices}) != len(devices):
        fail(where, name, "a list of distinct devices", given, "Name each device once.")
    return devices


def axis(value, name: str, where: str, ndim: int) -> int:
    """An axis index of an array with ``ndim`` axes, negative ones counted from the end, as a non-negative int."""
    number = whole(value, name, where, minimum=None)
    if not -ndim <= number < ndim:
        fail(where, name, f"an axis in {-ndim}..{ndim - 1} (the value has {ndim} axes per device)", value,
             f"Pass {name} between {-ndim} and {ndim - 1}.", ValueError)
    return number % ndim


def writable_directory(directory: pathlib.Path, where: str, holds: str) -> None:
    """Check, before any work, that ``directory`` (which need not exist yet) can be created and written to.

    The nearest existing folder on its path must be a directory this user can write to: otherwise a
    ``NotADirectoryError`` or ``PermissionError`` names the argument by its last part (no machine paths in a
    notebook's output) and says what to pass. ``holds`` is what the directory is for, e.g. "a trace".
    """
    existing = pathlib.Path(directory)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(f"{where}: directory={directory.name!r} cannot hold {holds}: {existing.name!r} is a "
                                 "file. Pass a directory, e.g. pathlib.Path(tempfile.mkdtemp()) / 'run'.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(f"{where}: directory={directory.name!r} cannot be written ({existing.name!r} is not "
                              "writable by this user). Pass a directory you can write to, e.g. under "
                              "tempfile.mkdtemp().")
