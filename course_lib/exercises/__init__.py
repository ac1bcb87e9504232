"""Exercise checkers: run a learner's answer and say precisely what is right or wrong.

Each lesson's exercises live in ``course_lib/exercises/lessonNN.py``. A notebook calls

    from course_lib.exercises import check, solution
    check("02.1", split_batch)      # prints ✔ or ✘ with what was expected and what came back
    solution("02.1")                 # prints a reference solution, when you are stuck

A checker never raises because the answer is wrong: a wrong answer (or one that raises,
or one not written yet) gives a ``Feedback`` that prints what was expected and what came
back, shapes included, so "Run All" goes on. The test suite runs every reference
solution through the same checker.

Writing a checker::

    def solution_double(x):
        return 2 * x

    @exercise("99.1", "Double it", solution=solution_double)
    def check_double(double):
        got = call(double, jnp.arange(3.0), name="double")
        expect_array(got, jnp.arange(3.0) * 2, what="double(jnp.arange(3.0))")
        return "double(x) is 2 * x."

A checker raises ``Mismatch`` with the learner-facing explanation when something is off,
and returns the success message otherwise.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from typing import Any, Callable

import jax
import numpy as np

__all__ = ["Feedback", "Mismatch", "Exercise", "exercise", "check", "solution", "exercises", "call",
           "expect_array", "expect_placed_on", "describe"]


@dataclasses.dataclass(frozen=True)
class Feedback:
    """The verdict on one answer. Truthy when it passed; prints as one line (or a few)."""

    exercise: str
    passed: bool
    message: str

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        return f"[{self.exercise}] {'✔ Correct' if self.passed else '✘ Not yet'}: {self.message}"

    def _repr_pretty_(self, printer, cycle):
        printer.text(str(self))


class Mismatch(Exception):
    """Raised inside a checker: the answer is wrong, and the message says how."""


@dataclasses.dataclass(frozen=True)
class Exercise:
    id: str
    title: str
    checker: Callable[[Any], str]
    solution: Callable

    def check(self, answer) -> Feedback:
        if answer is None or answer is Ellipsis:
            return Feedback(self.id, False, "no answer yet: write your code in the cell above, then run it again.")
        try:
            return Feedback(self.id, True, self.checker(answer))
        except Mismatch as e:
            return Feedback(self.id, False, str(e))


_REGISTRY: dict[str, Exercise] = {}


def exercise(id: str, title: str, *, solution: Callable):
    """Register the decorated function as the checker of exercise ``id``."""

    def register(checker):
        if id in _REGISTRY:
            raise ValueError(f"exercise {id} is registered twice")
        _REGISTRY[id] = Exercise(id, title, checker, solution)
        return checker

    return register


def _load_all() -> None:
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("lesson"):
            importlib.import_module(f"{__name__}.{info.name}")


def exercises() -> dict[str, Exercise]:
    """Every exercise of the course, by id (``"02.1"``), in order."""
    _load_all()
    return dict(sorted(_REGISTRY.items()))


def _get(id: str) -> Exercise:
    all_ = exercises()
    if id not in all_:
        raise KeyError(f"there is no exercise {id!r}; the exercises are {', '.join(all_)}")
    return all_[id]


def check(id: str, answer) -> Feedback:
    """Check ``answer`` (usually your function) for exercise ``id``; returns a printable ``Feedback``."""
    return _get(id).check(answer)


def solution(id: str) -> None:
    """Print a reference solution for exercise ``id``."""
    ex = _get(id)
    print(f"# Exercise {ex.id}: {ex.title} (one possible solution)\n")
    print(inspect.getsource(ex.solution))


# ---------------------------------------------------------------------------------------------
# Building blocks for checkers. Each raises Mismatch with a sentence meant for the learner.


def describe(x) -> str:
    """``Array f32[2,3]``, ``ndarray i64[4]``, ``float``: what a value is, in a few characters."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        kind = "Array" if isinstance(x, jax.Array) else type(x).__name__
        return f"{kind} {np.dtype(x.dtype).name}{list(x.shape)}"
    return type(x).__name__


def call(fn, *args, name: str | None = None, hints: dict[str, str] | None = None, **kwargs):
    """Call the learner's ``fn``; if it raises, say so in a ``Mismatch`` naming the inputs.

    ``hints`` maps a fragment of an expected error message to an explanation that is added
    to the feedback when the learner's code raises an error containing it.
    """
    if not callable(fn):
        raise Mismatch(f"expected a function, got {describe(fn)}.")
    name = name or getattr(fn, "__name__", "your function")
    shown = ", ".join([describe(a) for a in args] + [f"{k}={describe(v)}" for k, v in kwargs.items()])
    try:
        result = fn(*args, **kwargs)
    except Exception as e:  # the learner's error, reported rather than raised
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        extra = [hint for fragment, hint in (hints or {}).items() if fragment in str(e)]
        shown_error = first if len(first) <= 300 else first[:300] + " ..."
        raise Mismatch(" ".join([f"{name}({shown}) raised {type(e).__name__}: {shown_error}", *extra])) from None
    if result is None:
        raise Mismatch(f"{name}({shown}) returned None: write the function's body, and `return` its result.")
    return result


def expect_array(got, expected, *, what: str = "the result", rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """``got`` has ``expected``'s shape and (to tolerance) values."""
    expected = np.asarray(expected)
    if got is None:
        raise Mismatch(f"{what} is None: did the function forget to `return`?")
    if not hasattr(got, "shape"):
        try:
            converted = np.asarray(got)
        except Exception:
            converted = None
        if converted is None or converted.dtype == object:
            raise Mismatch(f"{what} should be an array of shape {expected.shape}, got {describe(got)}.")
        got = converted
    if tuple(got.shape) != expected.shape:
        raise Mismatch(f"{what} has shape {tuple(got.shape)}; expected {expected.shape}.")
    values = np.asarray(got)
    if not np.allclose(values, expected, rtol=rtol, atol=atol, equal_nan=True):
        wrong = ~np.isclose(values, expected, rtol=rtol, atol=atol, equal_nan=True)
        first = tuple(int(i) for i in np.argwhere(wrong)[0]) if wrong.ndim else ()
        raise Mismatch(
            f"{what} has the right shape {expected.shape} but {int(wrong.sum())} of {wrong.size} values differ; "
            f"first at index {first}: expected {expected[first].tolist()!r}, got {values[first].tolist()!r}.")


def expect_placed_on(got, devices, *, what: str = "the result", split: bool = True) -> None:
    """``got`` is a ``jax.Array`` on exactly ``devices``; with ``split``, each holds a different block."""
    devices = list(devices)
    if not isinstance(got, jax.Array):
        raise Mismatch(f"{what} should be a jax.Array on {len(devices)} devices, got {describe(got)}.")
    have = sorted(got.devices(), key=lambda d: d.id)
    if set(have) != set(devices):
        raise Mismatch(f"{what} lives on {len(have)} device(s) (ids {[d.id for d in have]}); "
                       f"expected the {len(devices)} devices with ids {[d.id for d in devices]}.")
    if split and len(devices) > 1 and got.sharding.is_fully_replicated:
        raise Mismatch(f"{what} holds a full copy on every device; expected one block per device.")
