"""One diagnosis engine for every checker: run the answer on varied cases, name a mistake only when the
answer's own numbers confirm it, and otherwise say what differs.

An exercise declares its known mistakes as data (``Mistake``; an example: the package's docstring, "Writing a
checker"). Where ``diagnose`` finds the answer and the solution disagree, it raises ``Mismatch``:

* naming a mistake only when the answer matches that mistake's result on EVERY case, the mistake's result
  differs from the right one on at least one, and no other mistake matches too, e.g.
  ``on 4 devices: expected 2.5, got 10.0. The shard means were added, not averaged: ...``;
* otherwise saying what differs, with a relation measured from the numbers, never a guessed cause, e.g.
  ``on 4 devices: expected 2.5, got 1.25: 2x too small, a factor 4/8 (this case's 4 devices over all 8).
  Its values are right in the other case; wrong also in: on 2 devices.``

Right answers in other forms pass: NumPy and JAX scalars, 0-d arrays and Python numbers are one number; an
array of shape ``(k, ...)`` stands for a tuple of ``k`` equal-shaped items; tuples and lists are alike (unless
``same(..., strict=True)``); dict keys in any order.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
from typing import Callable, Sequence

import jax
import numpy as np

from . import Mismatch, _NotStarted, _last_call, call, describe_tree


class Said(str):
    """A fact about a result in words ("on device 3", "on the host"): compared as text, shown as it is."""


def placement(x) -> Said:
    """Where ``x`` lives, in words: ``on device 3``, ``on devices [0, 1]``, ``on the host``. A split array names
    its devices in block order (the holder of the first block first; the holders of one block by id), so which
    device holds which block counts. ``x`` may be a ``jax.ShapeDtypeStruct`` with a sharding: where it would live."""
    if not isinstance(getattr(x, "sharding", None), jax.sharding.Sharding):
        return Said("on the host" if hasattr(x, "shape") else "not an array")
    blocks = x.sharding.devices_indices_map(tuple(x.shape)).items()
    ids = [d.id for d, _ in sorted(blocks, key=lambda b: ([s.start or 0 for s in b[1]], b[0].id))]
    return Said(f"on device {ids[0]}" if len(ids) == 1 else f"on devices {ids}")


@dataclasses.dataclass(frozen=True)
class Mistake:
    """A known wrong answer: ``fn`` takes the answer's inputs and returns what that mistake returns.

    ``feedback`` is shown when the answer is confirmed to be this mistake; ``{n}`` and ``{label}`` in it are
    replaced by the first differing case's device count and label.
    """

    name: str
    feedback: str
    fn: Callable
    answer: Callable | None = None   # the answer a learner who made it would submit, when that is not ``fn``

    def submitted(self) -> Callable:
        """What a learner making this mistake submits to ``check`` (``answer``, else ``fn`` itself)."""
        return self.answer or self.fn


@dataclasses.dataclass(frozen=True)
class Case:
    """One set of inputs: ``args`` for the answer, a ``label`` for feedback ("on 4 devices, x (4, 3)"), and
    ``n``, the device count of the case (for relations such as "a factor of the device count")."""

    args: tuple
    label: str
    n: int | None = None


def diagnose(answer, cases: Sequence[Case], *, solution: Callable, mistakes: Sequence[Mistake] = (),
             run: Callable | None = None, name: str | None = None, rtol: float = 1e-5, atol: float = 1e-6,
             names: str | Sequence[str] = "output", reveal: bool = True) -> list:
    """Run ``answer`` and ``solution`` on every case; return the answer's results, or raise ``Mismatch``.

    Args:
      run: ``run(fn, case) -> result``: how a function is run on a case (default: ``call(fn, *case.args)``).
        It runs the answer, the solution and every mistake alike. An answer that raises gives the runner's
        ``Mismatch``, with the cases it got right added.
      rtol, atol: the tolerance (loosened for float16/bfloat16 expected values).
      names: how feedback names a part of the result: ``"output"`` gives ``output [0][1]``; a sequence names the
        items of a returned tuple, ``("params", "state")`` gives ``params['w']``.
      reveal: False for a prediction, whose right answer the learner is to read from the compiled program: the
        feedback then shows the answer's own values and which of them are too high or too low, never the right ones.
    """
    name = name or getattr(answer, "__name__", "your function")
    if run is None:
        run = lambda fn, case: call(fn, *case.args, name=name)  # noqa: E731
    opts = dict(rtol=rtol, atol=atol, dtype=True, strict=False, names=names)
    rows, failed, keys = [], [], {}
    for case in cases:
        expected = _known(run, solution, case, keys)
        try:
            got = run(answer, case)
        except Mismatch as e:               # the other cases still run: where it fails is evidence too
            failed.append((case, e))
            continue
        rows.append((case, expected, got, difference(got, expected, n=case.n, **opts)))
        if rows[-1][3] is not None:
            failed.append((case, None))
    if not failed:
        return [got for _, _, got, _ in rows]
    right = sum(d is None for *_, d in rows)     # where it is right and where it fails, by label: no count drawn
    where = "" if not right else f" Its values are right in the other {f'{right} cases' if right > 1 else 'case'}" + (
        "." if len(failed) == 1 else f"; wrong also in: {', '.join(c.label for c, _ in failed[1:])}.")
    case, error = failed[0]
    if isinstance(error, _NotStarted):
        raise error                         # a placeholder: the same 'no answer yet' words everywhere
    if error is not None:
        text = str(error).rstrip()
        raise type(error)(f"{case.label}: {text}{'' if text.endswith(('.', '?', '!')) else '.'}{where}") from None
    _, expected, got, diff = next(r for r in rows if r[0] is case)
    named = _confirmed(mistakes, rows, run, opts, keys)       # on the cases that ran: their numbers confirm it or not
    # the count's factor only if another count's case shows its own, none shows the same, and no mistake is named
    size = re.search(r"(?<![\d.])[\d.]+x too \w+", diff or "")
    other = [d for c, _, _, d in rows if d is not None and c.n != case.n]
    n = None if len(named) == 1 or not any(", a factor" in d for d in other) or size and any(
        re.search(rf"(?<![\d.]){re.escape(size[0])}", d) for d in other) else case.n
    diff = difference(got, expected, n=n, **opts)
    raised = [f" {_capital(c.label)}, it raised: {str(e).rstrip()}" for c, e in failed if e is not None]
    where = "".join(raised[:1]) or where
    shown = f"expected {_show(expected)}, got {_show(got)}"
    if len(shown) > 240 or _show(expected) == _show(got) or _show(expected) == describe_tree(expected):
        shown = diff = difference(got, expected, n=n, values=True, **opts)   # where it differs, and how
    if not reveal:
        shown = diff = (f"you predicted {_values(got)}: {_off(got, expected, opts)} (the right values are not shown: "
                        "the compiled program gives them)")
    if len(named) == 1:
        feedback = named[0].feedback.replace("{n}", str(case.n)).replace("{label}", case.label)
        raise Mismatch(f"{case.label}: {shown}. {feedback}{''.join(raised[:1])}")
    both = diff.startswith("expected ") or shown == diff    # the diff says both sides
    raise Mismatch(f"{case.label}: {diff if both else shown if shown.endswith(diff) else f'{shown}: {diff}'}.{where}")


def _off(got, expected, opts) -> str:
    """Which parts of a prediction are too high or too low, and nothing more: a factor ("3x too many") would give
    the right value away (a dict of counts: "too many all-gathers")."""
    pairs = _pairs(got, expected, opts["strict"])
    if isinstance(pairs, str):
        return pairs
    parts = []
    for path, g, e in pairs:
        if _leaf_difference(g, e, None, opts["rtol"], opts["atol"], False) is not None:
            gv, ev = _numbers(g), _numbers(e)
            high = gv is not None and ev is not None and gv.shape == ev.shape and np.sum(gv) > np.sum(ev)
            if path and isinstance(path[-1], str):     # a dict of counts: "too many all-gathers"
                parts.append(f"too {'many' if high else 'few'} {path[-1]}s")
            else:
                parts.append(f"{_readable(path, opts['names'])} is too {'high' if high else 'low'}")
    return " and ".join(parts)


def _values(x) -> str:
    """A prediction as feedback shows it: a dict's values too (``{'all-gather': 3}``), numbers with separators."""
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k!r}: {_values(v)}" for k, v in x.items()) + "}"
    a = _numbers(x)
    return f"{float(a):,.0f}" if a is not None and a.ndim == 0 and abs(float(a)) >= 10_000 else _show(x)


def _capital(label: str) -> str:
    """A case's label at the start of a sentence: "On 4 devices", but a name stays as written ("global_batch(...")."""
    return label if re.match(r"\w*[_(]", label) else label[:1].upper() + label[1:]


def _confirmed(mistakes, rows, run, opts, keys) -> list[Mistake]:
    """The mistakes whose results equal the answer's on every case and differ from the right one somewhere."""
    named = []
    for m in mistakes:
        differs = False
        for case, expected, got, _ in rows:
            try:
                result = _known(run, m.fn, case, keys)
            except Exception:  # a mistake that cannot run on this case is not this answer
                break
            if difference(got, result, n=case.n, **opts) is not None:
                break
            differs = differs or difference(result, expected, n=case.n, **opts) is not None
        else:
            if differs:
                named.append(m)
    return named


_KNOWN: dict = {}


def _known(run, fn, case, keys: dict):
    """``run(fn, case)`` for the course's own functions (a solution, a declared mistake), run once per process: a
    learner checks the same exercise again and again. The answer always runs; so does anything whose inputs cannot
    be read as values (a path on disk, a learner's function, an unknown object). ``keys`` keeps each case's part of
    the key (the runner, the inputs, x64 and the mesh in context), read once per ``diagnose``."""
    if id(case) not in keys:
        keys[id(case)] = _key_or_none((run, case.label, case.n, case.args, jax.config.jax_enable_x64,
                                       str(jax.sharding.get_abstract_mesh())))
    def owned():    # NumPy results are copied: a view of an input would change with an answer that writes to it
        saved = dict(_last_call)        # and the answer's last call stays the one feedback quotes
        try:
            return jax.tree.map(lambda v: v.copy() if isinstance(v, np.ndarray) else v, run(fn, case))
        finally:
            _last_call.clear()
            _last_call.update(saved)
    key = keys[id(case)] and _key_or_none(fn)
    if key is None:
        return owned()
    key = (key, keys[id(case)])
    if key not in _KNOWN:
        if len(_KNOWN) > 1000:
            _KNOWN.clear()
        try:
            _KNOWN[key] = (owned(), None)
        except Exception as e:  # raised again each time
            _KNOWN[key] = (None, e)
    result, error = _KNOWN[key]
    if error is not None:
        raise error.with_traceback(None)
    return result


def _key_or_none(x, depth: int = 0):
    """A hashable stand-in for what ``x`` is, or None: values by value, functions by their code and the
    values they captured; None for anything with no readable form (a PRNG key array, say)."""
    try:
        if depth > 30:
            return None
        if x is None or isinstance(x, (bool, int, float, complex, np.generic, type)):
            return (type(x).__name__, x)
        if isinstance(x, str):
            return None if len(x) > 1 and os.path.exists(x) else x
        if isinstance(x, (np.ndarray, jax.Array)):
            sharding = repr(x.sharding) if isinstance(x, jax.Array) else ""
            a = np.asarray(x)
            return ("array", a.dtype.str, a.shape, a.tobytes(), sharding)
        if isinstance(x, (tuple, list)):
            keys = tuple(_key_or_none(v, depth + 1) for v in x)
            return None if None in keys else (type(x).__name__, keys)
        if isinstance(x, dict):
            items = tuple((repr(k), _key_or_none(v, depth + 1)) for k, v in x.items())
            return None if any(v is None for _, v in items) else ("dict", tuple(sorted(items, key=str)))
        if isinstance(x, jax.sharding.Mesh):
            return ("mesh", repr(x))
        if isinstance(x, types.FunctionType):
            if not x.__module__.startswith(("course_lib", "optax", "jax")):
                return None                             # a learner's function: its globals may change
            cells = [c.cell_contents for c in x.__closure__ or ()]
            key = _key_or_none((x.__module__, x.__defaults__, x.__kwdefaults__, cells), depth + 1)
            return key and (x.__code__, key)
        return None
    except Exception:
        return None


# ---------------------------------------------------------------------------------------------
# Comparing values: structure, shape, dtype, numbers.


def _leaf(x) -> bool:
    return not isinstance(x, (tuple, list, dict))


def _pairs(got, expected, strict: bool, path: tuple = (), names: str | Sequence[str] = "output"):
    """(path, got leaf, expected leaf) pairs, or a ``str`` saying how the structures differ, and where."""
    at = f"{_readable(path, names)}: " if path and not isinstance(names, str) else ""   # named outputs only
    if got is None and not _leaf(expected) and path:       # a None where a structure was expected: named by its path
        return [(path, got, expected)]
    if isinstance(expected, dict) and isinstance(got, dict) and set(got) == set(expected):
        children = [(k, got[k], expected[k]) for k in expected]
    elif isinstance(expected, (tuple, list)):
        items = got
        if isinstance(got, (tuple, list)) and strict and type(got) is not type(expected) \
                and not hasattr(expected, "_fields"):
            return f"{at}expected a {type(expected).__name__}, got a {type(got).__name__}: {describe_tree(got)}"
        if not isinstance(got, (tuple, list)) and hasattr(got, "shape") and hasattr(got, "dtype") \
                and np.ndim(got) >= 1 and len(got) == len(expected) \
                and all(_leaf(e) and np.shape(e) == tuple(got.shape[1:]) for e in expected):
            items = [got[i] for i in range(len(expected))]   # an array standing for a tuple of equal items
        if isinstance(items, (tuple, list)) and len(items) != len(expected):   # the count first: 7, not 8
            tree = describe_tree(got)
            return (f"{at}expected {_kind(expected)} of {len(expected)} items, got {_kind(got)} of {len(items)}"
                    + (f": {tree}" if len(tree) <= 120 else ""))
        if not isinstance(items, (tuple, list)):
            return (f"{at}expected {_kind(expected)} of {len(expected)}, {describe_tree(expected)}; "
                    f"got {describe_tree(got)}")
        children = list(zip(range(len(expected)), items, expected))
    elif isinstance(expected, dict) or not _leaf(got):
        return f"{at}expected {describe_tree(expected)}, got {describe_tree(got)}"
    else:
        return [(path, got, expected)]
    out = []
    for key, g, e in children:
        sub = _pairs(g, e, strict, path + (key,), names)
        if isinstance(sub, str):
            return sub
        out += sub
    return out


def _kind(x) -> str:
    return "a tuple" if isinstance(x, tuple) else "a list"


def _numbers(x):
    """``x`` as a NumPy array of numbers, or None."""
    if isinstance(x, (str, bytes)) or x is None or isinstance(x, jax.ShapeDtypeStruct):
        return None
    try:
        a = np.asarray(x)
    except Exception:
        return None
    return a if jax.numpy.issubdtype(a.dtype, np.number) or a.dtype == bool else None


def same(got, expected, *, rtol: float = 1e-5, atol: float = 1e-6, dtype: bool = True,
         strict: bool = False) -> bool:
    """Whether ``got`` equals ``expected`` in the engine's sense (other forms of a right answer allowed)."""
    return difference(got, expected, rtol=rtol, atol=atol, dtype=dtype, strict=strict) is None


def difference(got, expected, *, n: int | None = None, rtol: float = 1e-5, atol: float = 1e-6,
               dtype: bool = True, strict: bool = False, names: str | Sequence[str] = "output",
               values: bool = False) -> str | None:
    """None when ``got`` equals ``expected``; otherwise what differs, with a measured relation, and where:
    ``output [0][1]: ...`` (``names``: see ``diagnose``; ``values``: the differing part's values too, if short)."""
    pairs = _pairs(got, expected, strict, names=names)
    if isinstance(pairs, str):
        return pairs
    for path, g, e in sorted(pairs, key=lambda p: p[1] is not None):   # a None output first, by name
        if g is None and e is not None and path:
            want = _describe_leaf(e) if _leaf(e) and _numbers(e) is not None else describe_tree(e)
            return f"{_readable(path, names)} is None, where {want} was expected"
        text = _leaf_difference(g, e, n, rtol, atol, dtype)
        if text is not None and values and not text.startswith(("expected", "shape", "dtype", "one number")):
            if _show(g) == _show(e):        # the values shown would agree: say where they differ instead
                text += "" if "first at index" in text else f"; {_first_difference(g, e, rtol, atol)}"
            elif len(_show(g) + _show(e)) <= 160:                  # values, where a relation of values is told
                text = f"expected {_show(e)}, got {_show(g)}" + ("" if text == f"got {_show(g)}" else f": {text}")
        if text is not None:
            return f"{_readable(path, names)}: {text}" if path and not isinstance(e, Said) else text
    return None


def _readable(path: tuple, names: str | Sequence[str]) -> str:
    """A path of keys and indices as feedback names it: ``output [0][1]``, or with ``names`` a name per returned
    item: ``params['w']``, ``the variance (output [1])``."""
    if not isinstance(names, str) and path and isinstance(path[0], int) and path[0] < len(names):
        root, path = names[path[0]], path[1:]
    else:
        root = (names if isinstance(names, str) else "output") + " "
    return (root + "".join(f"[{k!r}]" for k in path)).strip()


def _leaf_difference(g, e, n, rtol, atol, dtype) -> str | None:
    if isinstance(e, Said):
        return None if g == e else f"expected {e}, got {g if isinstance(g, str) else describe_tree(g)}"
    ev = _numbers(e)
    if ev is None:                                      # a non-numeric expected value: compare as it is
        try:
            equal = bool(g == e)
        except Exception:
            equal = False
        return None if equal else f"expected {e!r}, got {_show(g)}"
    gv = _numbers(g)
    if isinstance(g, jax.ShapeDtypeStruct):
        return (f"expected {_describe_leaf(e)}, got {describe_tree(g)}: jax.eval_shape describes a result without "
                "computing it. Call the function itself")
    if gv is None:
        return f"expected {_describe_leaf(e)}, got {describe_tree(g)}"
    if gv.shape != ev.shape:
        return _shape_relation(gv, ev, n)
    half = ev.dtype.itemsize <= 2 and jax.numpy.issubdtype(ev.dtype, np.floating)   # half precision: looser
    rt, at = (max(rtol, 1e-2), max(atol, 1e-2)) if half else (rtol, atol)
    floats = jax.numpy.issubdtype(gv.dtype, np.floating) and jax.numpy.issubdtype(ev.dtype, np.floating)
    # A 0-d value: only a loss of precision counts (a Python float expected: anything below float32)
    want = np.dtype(e.dtype) if hasattr(e, "dtype") else np.dtype(np.float32)
    lower = gv.ndim == 0 and floats and gv.dtype.itemsize < want.itemsize
    close = np.allclose(gv.astype(np.float64), ev.astype(np.float64), rtol=rt, atol=at, equal_nan=True)
    if dtype and hasattr(g, "dtype") and ((gv.ndim and hasattr(e, "dtype") and np.dtype(g.dtype) != want) or lower):
        return (f"dtype {np.dtype(g.dtype).name} where {want if hasattr(e, 'dtype') else 'a Python float'} was expected"
                + ("" if close else f"; and {relation(gv, ev, n=n, rtol=rt, atol=at)}"))
    if gv.dtype == bool and ev.dtype != bool:           # True where 103 was expected is a type, not a factor
        return f"expected {_describe_leaf(e)}, got {describe_tree(g)}: a bool (True/False), not a number"
    return None if close else relation(gv, ev, n=n, rtol=rt, atol=at)


def _describe_leaf(e) -> str:
    a = np.asarray(e)
    return "one number" if a.ndim == 0 else f"an array of shape {a.shape}"


def _shape_relation(g: np.ndarray, e: np.ndarray, n: int | None) -> str:
    text = f"shape {g.shape} where {e.shape} was expected"
    if g.ndim == 0:
        return f"one number where shape {e.shape} was expected"
    if g.ndim == 2 and g.shape == e.shape[::-1] and np.allclose(g.T, e, rtol=1e-4, atol=1e-5):
        return text + ": the expected values, transposed"
    if g.size == e.size:
        held = np.allclose(g.reshape(e.shape), e, rtol=1e-4, atol=1e-5)
        return text + (": the expected values in another shape" if held else " (the same number of values)")
    if g.ndim == e.ndim:
        for axis, (a, b) in enumerate(zip(g.shape, e.shape)):
            if a != b and a and b:
                k = max(a, b) / min(a, b)
                return text + f": axis {axis} is {k:.3g}x too {'long' if a > b else 'short'}{_factor(k, n, a / b)}"
    if g.ndim == e.ndim + 1 and g.shape[1:] == e.shape:
        return text + f": an extra leading axis of {g.shape[0]}" + _factor(g.shape[0], n)
    if e.ndim == g.ndim + 1 and e.shape[1:] == g.shape:
        return text + f": the leading axis of {e.shape[0]} is missing"
    return text


def _factor(k: float, n: int | None, raw: float | None = None) -> str:
    """", a factor of the device count (4)" when ``k`` is one, or of the machine's device count; ``raw``, the ratio
    got / expected (``k`` or 1 / ``k``), says which way round a ratio of counts is."""
    if n is None or n <= 1:
        return ""
    total = len(jax.devices())
    if math.isclose(k, n, rel_tol=1e-4):
        return f", a factor of the device count ({n})"
    if total != n and math.isclose(k, total, rel_tol=1e-4):
        return f", a factor of {total}, the count of all devices (this case has {n})"
    if total != n and (math.isclose(k, total / n, rel_tol=1e-4) or math.isclose(k, n / total, rel_tol=1e-4)):
        return (f", a factor {total}/{n} (all {total} devices against this case's {n})" if (raw or k) > 1 else
                f", a factor {n}/{total} (this case's {n} devices against all {total})")
    if math.isclose(k, n / (n - 1), rel_tol=1e-4) or math.isclose(k, (n - 1) / n, rel_tol=1e-4):
        return f", a factor {n}/{n - 1} (the device count over itself minus one)"
    return ""


def relation(g: np.ndarray, e: np.ndarray, *, n: int | None = None, rtol: float = 1e-5,
             atol: float = 1e-6) -> str:
    """How two same-shaped arrays of numbers differ, measured: a constant factor, an offset, a rounding, an
    order, a transpose; or how many values differ, and the largest difference."""
    g64, e64 = g.astype(np.float64), e.astype(np.float64)
    wrong = ~np.isclose(g64, e64, rtol=rtol, atol=atol, equal_nan=True)   # by the exercise's own tolerance
    rtol, atol = max(rtol, 1e-4), max(atol, 1e-6)      # a relation holds to four digits
    close = lambda a, b: a.shape == b.shape and np.allclose(a, b, rtol=rtol, atol=atol)  # noqa: E731
    if np.isnan(g64).any() and not np.isnan(e64).any():
        return f"NaN in {int(np.isnan(g64).sum())} of {g64.size} values, where numbers were expected"
    nonzero = np.abs(e64) > 1e-9
    ratio = g.size > 1 or not np.issubdtype(e.dtype, np.integer)   # one id or position in another: no factor
    if ratio and nonzero.any() and np.all(np.isfinite(g64)):
        k = float(np.median(g64[nonzero] / e64[nonzero]))
        if k != 0 and not math.isclose(k, 1, rel_tol=1e-2) and close(g64, k * e64) and (
                k > 0 or math.isclose(k, -1, rel_tol=1e-4)):    # "negated and 87x" would read as a sign error
            if k < 0:
                return "the expected values negated (sign flipped)"
            size = max(k, 1 / k)
            return f"{size:.3g}x too {'large' if k >= 1 else 'small'}{_factor(size, n, k)}"
        if np.all(np.abs(g64) < 1e-12) and not np.all(nonzero == 0):
            return "got 0" if g64.ndim == 0 else "all zeros"
    offset = g64 - e64
    shift = (f"every value off by {float(offset.flat[0]):+.4g}" if g64.size > 1 and
             np.allclose(offset, offset.flat[0], atol=atol, rtol=0) else "")
    with np.errstate(over="ignore", invalid="ignore"):  # byte counts beyond float16's range are simply not equal
        halves = [h for h in ("float16", "bfloat16") if e.dtype != jax.numpy.dtype(h)
                  and np.array_equal(g64, e64.astype(jax.numpy.dtype(h)).astype(np.float64))]
    digits = [d for d in range(0, 4) if np.array_equal(np.round(g64, 6), np.round(np.round(e64, d), 6))]
    if digits and not close(g64, e64):       # both can give these numbers: a short decimal is said first
        return (f"the expected values rounded to {digits[0]} decimal{'s' * (digits[0] != 1)}"
                + (f" (or to {halves[0]} precision: both give these numbers)" if halves else "")
                + (f": {shift}" if shift else ""))
    if np.all(g64 == np.round(g64)) and not np.all(e64 == np.round(e64)) and np.all(np.abs(g64 - e64) < 1):
        return "the expected values rounded to whole numbers (up or down)"     # not to a half precision
    if shift:
        return shift
    if halves:
        return f"the expected values rounded to {halves[0]} precision"
    rel = float(np.max(np.abs(g64 - e64)) / max(float(np.max(np.abs(e64))), 1e-30))
    # the answer's own half dtype first; else bfloat16, whose values float16 holds too (not the other way)
    for half, eps in sorted((("bfloat16", 2.0 ** -8), ("float16", 2.0 ** -11)), key=lambda h: h[0] != g.dtype.name):
        with np.errstate(over="ignore", invalid="ignore"):  # only values that half precision can hold say so
            held = np.array_equal(g64, g64.astype(jax.numpy.dtype(half)).astype(np.float64))
        if rel <= 8 * eps and held:
            return (f"the largest difference is {100 * rel:.2g}% of the largest value, within a few roundings "
                    f"to {half} (one rounding: {100 * eps:.2g}%)")
    if 0 < rel <= 0.05:                                 # close, but not by any rounding named above
        count = f"{int(wrong.sum())} of {wrong.size} values differ; " if g.size > 1 else ""
        return f"{count}the largest difference is {100 * rel:.2g}% of the largest value"
    if g.ndim >= 1 and g.shape[0] > 1:
        if close(g64, e64[::-1]):
            return "the expected values in reverse order along the first axis"
        for s in range(1, g.shape[0]):
            if close(g64, np.roll(e64, s, axis=0)):
                return f"the expected values rotated by {s} along the first axis (row i holds row i - {s})"
    if g.ndim == 2 and g.shape[0] == g.shape[1] and close(g64, e64.T):
        return "the expected values, transposed"
    if g.size > 1 and close(np.sort(g64, axis=None), np.sort(e64, axis=None)):
        return "the expected values, in another order"
    if g.size == 1:
        return f"off by {float((g64 - e64).flat[0]):+.4g}"
    return (f"{int(wrong.sum())} of {wrong.size} values differ; {_first_difference(g, e, rtol, atol)}; the largest "
            f"difference is {float(np.max(np.abs(g64 - e64))):.4g}")


def _first_difference(g, e, rtol: float, atol: float) -> str:
    """``first at index (0, 2): expected 1.5, got 3``: where two same-shaped arrays first differ (beyond the
    tolerance; else where they differ most)."""
    g64, e64 = _numbers(g).astype(np.float64), _numbers(e).astype(np.float64)
    wrong = ~np.isclose(g64, e64, rtol=max(rtol, 1e-4), atol=max(atol, 1e-6), equal_nan=True)
    at = np.argwhere(wrong)[0] if wrong.any() else np.unravel_index(np.argmax(np.abs(g64 - e64)), g64.shape)
    at = tuple(int(i) for i in at)
    return f"first at index {at}: expected {_num(e64[at])}, got {_num(g64[at])}"


def _num(v) -> str:
    v = float(v)
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else f"{v:.6g}"


def _show(x) -> str:
    """A value as feedback shows it: a number, a small array in full, or its description."""
    if isinstance(x, Said) or x is None:
        return str(x)
    if isinstance(x, (tuple, list)) and len(x) <= 4 and all(_leaf(v) for v in x):
        inner = ", ".join(_show(v) for v in x)
        return f"({inner})" if isinstance(x, tuple) else f"[{inner}]"
    a = _numbers(x) if _leaf(x) else None
    if a is None:
        return describe_tree(x)
    if a.ndim == 0:
        return _num(a) if a.dtype != bool else str(bool(a))
    if a.size <= 8:
        return np.array2string(a.astype(np.float64) if a.dtype != bool else a, separator=", ",
                               formatter={"float": _num}).replace("\n", "")
    first = ", ".join(_num(v) for v in a.reshape(-1)[:4].astype(np.float64))
    return f"shape {a.shape} [{first}, ...]"
