"""Exercise checkers: run a learner's answer and say precisely what is right or wrong.

Each lesson's exercises live in ``course_lib/exercises/lessonNN.py``. A notebook calls

    from course_lib.exercises import check, hint, solution
    check("02.1", split_batch)      # prints ✔ or ✘ with what was expected and what came back
    hint("02.1")                     # the next hint: a nudge, then the API or cell to read
    solution("02.1")                 # prints a reference solution, when the hints are not enough
    progress()                       # which exercises you have tried and passed, per lesson (a file every
                                     # lesson's kernel shares: course_lib/progress.py)

``check`` never raises for anything the learner's code does or returns: an answer that
raises, returns the wrong structure or type, or changes its inputs in place gives a
``Feedback`` that prints what was expected (structure, shapes, dtypes) and what came back,
so "Run All" goes on. The only error is an unknown exercise id. The test suite runs every
reference solution, and a battery of wrong answers, through the same checkers.

Writing a checker::

    def solution_double(x):
        return 2 * x

    MISTAKES_99_1 = [Mistake("squared", "That is x squared: x * x, not 2 * x.", lambda x: x * x)]

    @exercise("99.1", "Double it", solution=solution_double, returns="an array shaped like x",
              hints=["Every element, times two.", "Arithmetic on a jax.Array works element by element."])
    def check_double(double):
        cases = [Case((jnp.arange(float(n)),), f"double(jnp.arange({n}.0))") for n in (3, 5)]
        diagnose(double, cases, solution=solution_double, mistakes=MISTAKES_99_1)
        return "double(x) is 2 * x."

A checker raises ``Mismatch`` with the learner-facing explanation when something is off,
and returns the success message otherwise. Build expected answers from private copies of
the inputs, before the learner's code runs (``call`` also reports an input changed in place).
Hints can also come from a module-level dict in the lesson module,
``HINTS = {"10.1": ["a nudge", "the API or cell to read"], ...}``; they follow any given to ``@exercise``.
"""

from __future__ import annotations

import ast
import builtins
import collections
import contextlib
import dataclasses
import importlib
import inspect
import io
import pkgutil
import re
import signal
import sys
import textwrap
import threading
from typing import Any, Callable
from unittest import mock

import jax
import numpy as np

__all__ = ["Feedback", "Mismatch", "Exercise", "exercise", "check", "hint", "solution", "progress", "exercises",
           "call", "expect_placed_on", "expect_pmapped", "describe", "watch", "jaxpr_of",
           "Mistake", "Case", "diagnose", "difference", "relation", "same"]


@dataclasses.dataclass(frozen=True)
class Feedback:
    """The verdict on one answer. Truthy when it passed; prints as one line (or a few)."""

    exercise: str
    passed: bool
    message: str
    started: bool = True  # False for a placeholder: no answer written yet

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        return f"[{self.exercise}] {'✔ Correct' if self.passed else '✘ Not yet'}: {self.message}"

    def _repr_pretty_(self, printer, cycle):
        printer.text(str(self))

    def _ipython_display_(self) -> None:
        # ``check`` has already printed this verdict in the cell that is running: show it once, not twice.
        if _shown_in_cell.get(id(self)) == _cell_number():
            return
        print(self.wrapped())

    def wrapped(self, width: int = 100) -> str:
        """The verdict as a notebook shows it: lines of at most ``width`` characters, broken between words."""
        return "\n".join(textwrap.fill(line, width, subsequent_indent="    ", break_long_words=False,
                                        break_on_hyphens=False) for line in str(self).splitlines())


# Which Feedback objects ``check`` printed, and in which cell (IPython's execution count).
_shown_in_cell: dict[int, int | None] = {}


def _cell_number() -> int | None:
    """The number of the IPython cell that is running, or None outside IPython."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()  # a running IPython imported it
    return getattr(shell, "execution_count", None)


class Mismatch(Exception):
    """Raised inside a checker: the answer is wrong, and the message says how."""


class _NotStarted(Mismatch):
    """The answer is still a placeholder (it returned None)."""


# What the learner's code returned most recently, for feedback when a checker cannot use it.
_last_call: dict[str, Any] = {}
# Whether the answer being checked is still a placeholder (a body of only ``...``, ``pass`` or a docstring).
_answer_is_stub: list[bool] = [False]


def is_placeholder(fn) -> bool:
    """Whether ``fn``'s body, read from its source, is still a placeholder: only ``...``, ``pass`` or a docstring.
    A written body, even ``return None`` or ``lambda x: None``, is an attempt."""
    try:
        node = ast.parse(textwrap.dedent(inspect.getsource(getattr(fn, "__wrapped__", fn)))).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return False
    return isinstance(node, ast.FunctionDef) and all(isinstance(b, ast.Pass) or (isinstance(b, ast.Expr) and isinstance(
        b.value, ast.Constant) and (b.value.value is ... or isinstance(b.value.value, str))) for b in node.body)


def returned_none(shown: str, fn, what: str = "its result"):
    """The one way ``None`` from an answer is reported: a placeholder is not started; a written body that
    returned None is an attempt that forgot its ``return``."""
    if _answer_is_stub[0] or is_placeholder(fn):
        return _NotStarted(f"{shown} returned None: write the function's body, and `return` {what}.")
    return Mismatch(f"{shown} returned None: did it forget to `return` {what}? Every path through the function "
                    "must end in one.")

NO_ANSWER = "no answer yet: write your code in the cell above, then run it again."


@dataclasses.dataclass(frozen=True)
class Exercise:
    id: str
    title: str
    checker: Callable[[Any], str]
    solution: Callable
    returns: str = ""
    hints: tuple[str, ...] = ()

    def check(self, answer) -> Feedback:
        """Run the checker on ``answer``; any problem becomes a ``Feedback``, never an exception."""
        if answer is None or answer is Ellipsis:
            return Feedback(self.id, False, NO_ANSWER, started=False)
        if not callable(answer) and callable(self.solution):
            params = ", ".join(_arg_names(self.solution))
            return Feedback(self.id, False, f"expected a function, your_function({params}), passed to check itself "
                                            f"(not its result); got {describe_tree(answer)}.")
        _last_call.clear()
        _answer_is_stub[0] = is_placeholder(answer)
        # What the answer prints while it runs is held back (JAX prints a source location such as
        # "x.py:34:40 (<lambda>)" when pmap gets more rows than devices), and shown only when the answer passes:
        # then it is the learner's own output (a debug print); beside a failure the verdict is what counts.
        printed = io.StringIO()
        # A check still running after LIMIT_S is stopped (SIGALRM: in the main thread, under no other alarm).
        alarm = threading.current_thread() is threading.main_thread() and not signal.getitimer(signal.ITIMER_REAL)[0]
        old = signal.signal(signal.SIGALRM, _stop) if alarm else None
        try:
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, LIMIT_S)
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
                verdict = self.checker(answer)
            print(printed.getvalue(), end="")
            return Feedback(self.id, True, verdict)
        except Mismatch as e:               # a placeholder is not started, whatever wrapper reported it
            return Feedback(self.id, False, str(e), started=not (isinstance(e, _NotStarted) or _answer_is_stub[0]))
        except _Stopped:
            name = getattr(answer, "__name__", "your function")
            return Feedback(self.id, False, f"checking {name} took over {LIMIT_S} s and was stopped: {name} may "
                                            "never return. Call it once yourself on a small input.")
        except (Exception, SystemExit) as e:  # a safety net: the answer broke the checker itself
            return Feedback(self.id, False, self._could_not_use(e))
        finally:
            _answer_is_stub[0] = False      # a later call() outside check reads its own function only
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)

    def mistakes(self) -> list:
        """The mistakes this exercise declares as data: the ``Mistake`` list its lesson module names
        ``MISTAKES_NN_K`` (``MISTAKES_02_1`` for 02.1). ``Mistake.submitted()`` is what a learner making one
        submits, so a test can check that each is named."""
        return list(getattr(sys.modules[self.checker.__module__], "MISTAKES_" + self.id.replace(".", "_"), []))

    def _could_not_use(self, error: Exception) -> str:
        text = (f"{_last_call['call']} returned {describe_tree(_last_call['result'])}" if "result" in _last_call
                else "the checker could not run your answer") + (f"; expected {self.returns}" if self.returns else "")
        return f"{text}. (Checking it failed with {type(error).__name__}: {_error_text(error)[:200]})"


_REGISTRY: dict[str, Exercise] = {}


def exercise(id: str, title: str, *, solution: Callable, returns: str = "", hints=()):
    """Register the decorated function as the checker of exercise ``id``.

    Args:
      returns: what a right answer returns (structure, shapes, dtypes), quoted when an answer breaks the checker.
      hints: a ladder shown one at a time by ``hint(id)``: a nudge toward the idea, then the API or the lesson
        cell to read; never the steps in words. No hint holds code: code is only in ``solution(id)``.
    """

    def register(checker):
        if id in _REGISTRY:
            raise ValueError(f"exercise {id} is registered twice")
        _REGISTRY[id] = Exercise(id, title, checker, solution, returns, tuple(hints))
        return checker

    return register


_HINTS_LOADED: set[str] = set()


def _add_hints(module) -> None:
    """Append the hints of ``module.HINTS`` (``{"10.1": ["a nudge", "the API or cell to read"]}``) to its exercises, once."""
    if module.__name__ in _HINTS_LOADED:
        return
    for id_, extra in getattr(module, "HINTS", {}).items():
        if id_ not in _REGISTRY:
            raise ValueError(f"{module.__name__}.HINTS names exercise {id_!r}, which is not registered")
        extra = (extra,) if isinstance(extra, str) else tuple(extra)
        ex = _REGISTRY[id_]
        _REGISTRY[id_] = dataclasses.replace(ex, hints=ex.hints + extra)
    _HINTS_LOADED.add(module.__name__)


def exercises() -> dict[str, Exercise]:
    """Every exercise of the course, by id (``"02.1"``), in order."""
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("lesson"):
            _add_hints(importlib.import_module(f"{__name__}.{info.name}"))
    return dict(sorted(_REGISTRY.items()))


def _get(id: str) -> Exercise:
    all_, key = exercises(), re.sub(r"^(\d)\.", r"0\1.", str(id).strip())    # " 7.1" is "07.1"
    swapped = " (a function: the exercise id comes first, check('NN.k', your_function))" if callable(id) else ""
    if key not in all_:
        raise KeyError(f"there is no exercise {getattr(id, '__name__', id)!r}{swapped}; the exercises are "
                       f"{', '.join(all_)}")
    return all_[key]


# How many hints this kernel has shown per exercise (the hint ladder's place). Attempts and passes are in the
# progress file (course_lib/progress.py), which ``progress()`` reads.
_hints_shown: collections.Counter = collections.Counter()


def check(id: str, answer) -> Feedback:
    """Check ``answer`` (usually your function) for exercise ``id``: prints the verdict and returns it as a ``Feedback``.

    The verdict is printed when ``check`` runs, in a notebook and in a plain Python script alike, so it shows
    whatever follows in the cell; as a notebook cell's last line it still shows once. The returned ``Feedback``
    is truthy when the answer passed.
    """
    feedback = _get(id).check(answer)
    if feedback.started:
        _record(feedback.exercise, "check", feedback.passed)  # course_lib/progress.py: the file every kernel shares
    print(feedback.wrapped())   # and as a cell's last value: ``Feedback._ipython_display_`` shows it once
    number = _cell_number()
    if number is not None:
        _shown_in_cell.clear()  # only the newest verdicts matter; ids of freed objects may be reused
        _shown_in_cell[builtins.id(feedback)] = number
    return feedback


def _record(id: str, event: str, passed: bool | None = None) -> None:
    """Add the event to the progress file (course_lib/progress.py). A file that cannot be read or written is
    reported once per kernel and left alone: the exercise itself goes on."""
    try:
        _progress_file.record(id, event, passed)
    except (ValueError, OSError) as e:
        if str(e) not in _record_problems:
            _record_problems.add(str(e))
            print(f"(progress not recorded: {e})")


_record_problems: set[str] = set()


def hint(id: str) -> None:
    """Print the next hint for exercise ``id``: a nudge, then the API or cell to read;
    ``solution(id)`` comes after. Hints are shown even where solutions are withheld (``COURSE_SOLUTIONS=off``)."""
    ex = _get(id)
    id = ex.id                          # as the course writes it (" 7.1" is "07.1")
    shown = _hints_shown[id]
    # Where the instructor withheld the solutions, no message points to solution() (it would print none) or to
    # the file that holds the reference solutions: the lesson's own cells are where to look.
    withheld = (f"the instructor has withheld the solutions in this class: reread the cells of lesson "
                f"{id.split('.')[0]} that the hints name, run check again to see what differs, or ask the "
                "instructor." if _solutions.withheld() else "")
    if shown >= len(ex.hints):
        after = withheld[:1].upper() + withheld[1:] or f"Next step: solution({id!r}) prints a reference solution."
        print(f"[{id}] No hints left ({len(ex.hints)} shown). {after}")
        return
    _hints_shown[id] = shown + 1
    _record(id, "hint")
    last = shown + 1 == len(ex.hints)
    after = (f" That was the last one; {withheld}" if last and withheld else
             f" That was the last one: solution({id!r}) is next." if last else f" Run hint({id!r}) again for more.")
    print(f"[{id}] Hint {shown + 1} of {len(ex.hints)}: {ex.hints[shown]}{after}")


def solution(id: str) -> None:
    """Print a reference solution for exercise ``id``: code to paste into the exercise's cell as it is (the
    function under the exercise cell's own name, with the imports it needs).

    With ``COURSE_SOLUTIONS=off`` in the environment (or ``"solutions": "off"`` in a ``course_settings.json``
    next to the notebook, as a student copy carries), it prints no code and says the instructor withheld them.
    """
    ex = _get(id)
    if _solutions.withheld():
        print(_solutions.withheld_message(ex.id))
        return
    _record(ex.id, "solution")
    print(f"# Exercise {ex.id}: {ex.title} (one possible solution)\n")
    print(_solutions.code(ex.id))


from course_lib import progress as _progress_file, solutions as _solutions  # noqa: E402
from course_lib.progress import NoSuchLesson, Progress, _lesson_key, report as progress  # noqa: E402,F401


# ---------------------------------------------------------------------------------------------
# Building blocks for checkers. Each raises Mismatch with a sentence meant for the learner.


def describe(x) -> str:
    """``Array f32[2,3]``, ``ndarray i64[4]``, ``float``: what a value is, in a few characters."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return f"ShapeDtypeStruct {np.dtype(x.dtype).name}{list(x.shape)} (a shape and dtype only, with no values)"
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        kind = "Array" if isinstance(x, jax.Array) else "NumPy" if isinstance(x, np.generic) else type(x).__name__
        try:
            return f"{kind} {np.dtype(x.dtype).name}{list(x.shape)}"
        except TypeError:
            return f"{kind} {x.dtype}{list(x.shape)}"
    if isinstance(x, str):
        return f"str {x[:40]!r}" + ("..." if len(x) > 40 else "")
    return type(x).__name__


def describe_tree(x, depth: int = 0) -> str:
    """``tuple(dict{'w': Array float32[3], 'b': Array float32[]}, Array float32[8])``: a value's structure."""
    if depth > 3:
        return "..."
    if isinstance(x, (tuple, list)) and not hasattr(x, "_fields"):
        inner = ", ".join(describe_tree(v, depth + 1) for v in x[:6]) + (", ..." if len(x) > 6 else "")
        return f"{type(x).__name__}({inner})" if isinstance(x, tuple) else f"list[{inner}]"
    if isinstance(x, dict):
        inner = ", ".join(f"{k!r}: {describe_tree(v, depth + 1)}" for k, v in list(x.items())[:6])
        return "dict{" + inner + (", ..." if len(x) > 6 else "") + "}"
    return describe(x)


def _arg_names(fn, n: int | None = None) -> list[str]:
    """``fn``'s first ``n`` parameter names, "argument 3" where it has none; all of them with no ``n`` ("...")."""
    try:
        names = list(inspect.signature(fn).parameters)[:n]
    except (TypeError, ValueError):
        names = ["..."] if n is None else []
    return names + [f"argument {i + 1}" for i in range(len(names), n or 0)]


def _snapshot(args):
    """The inputs' structure, their leaves, and a private copy of every NumPy leaf (those can change in place)."""
    leaves, treedef = jax.tree.flatten(args)
    return treedef, leaves, [np.array(v, copy=True) if isinstance(v, np.ndarray) else None for v in leaves]


def _changed(before, args) -> str | None:
    treedef, leaves, copies = before
    now, now_def = jax.tree.flatten(args)
    if now_def != treedef:
        return "its structure changed (an item was added, removed or replaced)"
    for old, new, copy in zip(leaves, now, copies):
        if old is not new:
            return "one of its items was replaced"
        if copy is not None and new.shape != copy.shape:
            return f"its shape changed to {new.shape}"
        if copy is not None and not np.array_equal(new, copy, equal_nan=np.issubdtype(copy.dtype, np.inexact)):
            return "its values changed"
    return None


_SOURCE_FILE = re.compile(r"(?:[A-Za-z]:)?[/\\][^\s:'\"]+\.py(?::\d+)?")


def _error_text(error: Exception) -> str:
    """An error's message as feedback quotes it: its first line (with the next, if it ends in a colon), without
    the location JAX appends ("This error occurs at source: /path/file.py:12") or any other file path, and with
    no memory address: ``<function f.<locals>.g at 0x7f..>`` reads ``g``, a ``functools.partial(g, ...)`` ``g``."""
    text = re.sub(r"<(?:function|bound method) (?:[\w<>]+\.)*([\w<>]+)[^<>]* at 0x[0-9a-f]+>", r"\1", str(error))
    text = re.sub(r"<([\w.]+)[^<>]* at 0x[0-9a-f]+>", r"<\1>", re.sub(r"functools\.partial\((\w+)[^']*", r"\1", text))
    lines = [ln.strip() for ln in text.strip().splitlines()
             if ln.strip() and not ln.strip().startswith("This error occurs at source")]
    text = " ".join(lines[:2]) if len(lines) > 1 and lines[0].endswith(":") else (lines[0] if lines else "")
    text = re.sub(r"\s*To fix this, please call \w+ under `jax\.shard_map`\.?", "", text)  # JAX's advice, not ours
    return _SOURCE_FILE.sub("<file>", text)


def _argument(x) -> str:
    """An argument as feedback shows it: a number or a short string by value (``4``), anything else described."""
    if isinstance(x, (bool, int, float)) or (isinstance(x, str) and len(x) <= 20):
        return repr(x)
    return describe(x)


LIMIT_S = 300   # a check still running after this long is stopped and reported (an answer that never returns)


class _Stopped(BaseException):     # ends the check, past every ``except Exception`` on the way (the answer's too)
    pass


def _stop(*_):
    raise _Stopped


def call(fn, *args, name: str | None = None, hints: dict[str, str] | None = None,
         summaries: dict[str, str] | None = None, **kwargs):
    """Call the learner's ``fn``; if it raises, say so in a ``Mismatch`` naming the inputs.

    ``hints`` maps a fragment of an expected error message to an explanation that is added
    to the feedback when the learner's code raises an error containing it; ``summaries`` to one sentence that
    replaces JAX's long message. An input that the call changes in place (a NumPy array written to, a dict or
    list edited) is reported too.
    """
    if not callable(fn):
        raise Mismatch(f"expected a function, got {describe_tree(fn)}.")
    name = name or getattr(fn, "__name__", "your function")
    shown = ", ".join([_argument(a) for a in args] + [f"{k}={_argument(v)}" for k, v in kwargs.items()])
    before = [_snapshot(a) for a in args]
    try:
        result = fn(*args, **kwargs)
    except (Exception, SystemExit) as e:  # the learner's error (exit() too), reported rather than raised
        first = _error_text(e)
        extra = [hint for fragment, hint in (hints or {}).items() if fragment in str(e)]
        summary = [text for fragment, text in (summaries or {}).items() if fragment in str(e)]
        shown_error = (summary or [first if len(first) <= 300 else first[:300] + " ..."])[0] or "(no message)"
        if extra and not shown_error.endswith((".", "?", "!", ":")):
            shown_error += "."
        raise Mismatch(" ".join([f"{name}({shown}) raised {type(e).__name__}: {shown_error}", *extra])) from None
    _last_call.update(call=f"{name}({shown})", result=result)
    for arg_name, snap, arg in zip(_arg_names(fn, len(args)), before, args):
        change = _changed(snap, arg)
        if change:
            raise Mismatch(f"{name}({shown}) changed its input {arg_name} in place: {change}. Leave the inputs "
                           "alone and return a new value (the caller may still need them, and jax.Arrays cannot "
                           "be changed in place at all).")
    if result is None:
        raise returned_none(f"{name}({shown})", fn)
    return result


def expect_placed_on(got, devices, *, what: str = "the result", split: bool = True, in_order: bool = False) -> None:
    """``got`` is a ``jax.Array`` on exactly ``devices``; with ``split``, each holds a different block; with
    ``in_order`` (an exercise that ties block k to device k), block k on ``devices[k]`` (``placement``)."""
    devices = list(devices)
    if not isinstance(got, jax.Array):
        raise Mismatch(f"{what} should be a jax.Array on {len(devices)} devices, got {describe(got)}.")
    have = sorted(got.devices(), key=lambda d: d.id)
    if set(have) != set(devices):
        raise Mismatch(f"{what} lives on {len(have)} device(s) (ids {[d.id for d in have]}); "
                       f"expected the {len(devices)} devices with ids {[d.id for d in devices]}.")
    if split and len(devices) > 1 and got.sharding.is_fully_replicated:
        raise Mismatch(f"{what} holds a full copy on every device; expected one block per device.")
    if split and in_order and placement(got) != f"on devices {[d.id for d in devices]}":
        raise Mismatch(f"{what} lives {placement(got)}, in block order; expected block k on the k-th of the devices "
                       f"{[d.id for d in devices]}.")


def expect_pmapped(fn, got, args, devices, *, what: str, name: str, how: str, work: tuple = (),
                   in_order: bool = False) -> list:
    """``got`` lives on ``devices`` as pmap leaves it, and ``fn(*args)``'s program holds a pmap: its shard_map
    equations are returned. ``how`` completes "the exercise is jax.pmap, ..." in the feedback. ``work``: pairs
    ``(primitive names, the exercise's operation in words)``; one of each pair's names must run inside the pmap,
    not only around it. ``in_order``: block k on ``devices[k]`` (``expect_placed_on``)."""
    if isinstance(got, jax.Array) and len(got.devices()) == 1 and len(devices) > 1:
        raise Mismatch(f"{what} has the right values but lives on one device: computed there (vmap, plain jnp) or "
                       f"brought there afterwards. The exercise is jax.pmap, {how}, and the result returned as pmap "
                       "gives it.")
    expect_placed_on(got, devices, what=what, in_order=in_order)
    program = pmap_program(fn, *args, name=name)
    maps = [e for e in program if e.primitive.name == "shard_map"]
    if not maps:
        raise Mismatch(f"{what} is spread over the devices, but its program has no jax.pmap (it was placed there "
                       f"some other way): the exercise is jax.pmap, {how}.")
    inner = {id(e): e.primitive.name for m in maps for e in _eqns(m.params["jaxpr"])}
    ran, outside = set(inner.values()), {e.primitive.name for e in program if id(e) not in inner}
    for names, words in work:     # the work outside, or nothing but data moved inside: evidence it ran outside
        if not ran & names and (outside & names or ran <= {"reshape", "squeeze", "broadcast_in_dim", "copy"}):
            raise Mismatch(f"{what} has the right values, but no {words} runs inside its pmap: it ran before or "
                           "after the pmap, outside the devices' program. Do it inside the pmapped function.")
    return maps


# ---------------------------------------------------------------------------------------------
# Mechanism checks: did the answer use the tool the exercise teaches, not only reach the numbers?


def _eqns(jaxpr):
    """Every equation of a jaxpr, inside nested jaxprs (jit, shard_map, scan, ...) too."""
    for eqn in jaxpr.eqns:
        yield eqn
        yield from _inner(eqn.params)


def _inner(params):
    """Every equation of the jaxprs among one equation's ``params`` (a jit's, a scan's body, ...)."""
    for value in params.values():
        for sub in (value if isinstance(value, (tuple, list)) else [value]):
            inner = getattr(sub, "jaxpr", sub)
            if hasattr(inner, "eqns"):
                yield from _eqns(inner)


def jaxpr_of(fn, *args, name: str = "your function"):
    """``fn(*args)``'s program (a jaxpr); one that cannot be traced raises ``Mismatch`` in words for the learner."""
    try:
        return jax.make_jaxpr(fn)(*args).jaxpr
    except Exception as e:
        raise Mismatch(f"{name} gives the right values, but the checker could not read its program with "
                       f"jax.make_jaxpr ({type(e).__name__}: {_error_text(e)[:200]}), so it cannot see which "
                       "mechanism it uses. Keep the function in JAX: no np.asarray, float() or .tolist() on its "
                       "inputs.") from None


def primitives(fn, *args, name: str = "your function") -> list:
    """The equations of ``fn(*args)``'s program, nested ones included (``pmap`` shows as ``shard_map``)."""
    return list(_eqns(jaxpr_of(fn, *args, name=name)))


def pmap_program(fn, *args, name: str = "your function") -> list:
    """``primitives``; for an answer ``make_jaxpr`` cannot read whole (one that reads x with NumPy), the equations
    of every ``jax.pmap`` that ``fn(*args)`` called, each traced on the inputs it was given."""
    try:
        return primitives(fn, *args, name=name)
    except Mismatch:
        real, programs = jax.pmap, []

        def spy(f, *a, **k):
            mapped = real(f, *a, **k)

            def run(*xs):
                programs.append(jax.make_jaxpr(mapped, k.get("static_broadcasted_argnums", ()))(*xs).jaxpr)
                return mapped(*xs)
            return run

        if not watch(fn, args, [(jax, "pmap", spy)]) or not programs:
            raise
        return [e for p in programs for e in _eqns(p)]


def watch(fn, args, patches, *, again=None) -> bool:
    """Run ``fn(*args)`` with each ``(owner, name, value)`` of ``patches`` set in place of ``owner.name``, and the
    originals put back afterwards. When ``again()`` is true after the run (nothing seen: a jit cache may have
    skipped the tracing), JAX's caches are cleared and ``fn`` runs once more. False if ``fn`` raised: the
    checker's own call of ``fn`` says how."""
    try:
        for attempt in range(2):
            with contextlib.ExitStack() as stack:
                for owner, name, value in patches:
                    stack.enter_context(mock.patch.object(owner, name, value, create=True))
                fn(*args)
            if attempt or again is None or not again():
                break
            jax.clear_caches()
    except Exception:
        return False
    return True


def vmap_calls(fn, *args, inside: set | None = None) -> int | None:
    """How many times calling ``fn(*args)`` ran a ``vmap``ped function (``None`` if it raised, or JAX cannot tell);
    the names of the primitives that ran inside a vmap are added to ``inside``.

    ``vmap`` leaves no trace in a jaxpr, so this counts the batching traces JAX starts while ``fn`` runs (with
    ``watch``, which runs it again if none is seen), however and whenever the ``vmap``ped function was built.
    Use inputs of a shape the learner is unlikely to have used.
    """
    try:
        from jax._src.interpreters import batching
        original = batching.BatchTrace.__init__
    except (ImportError, AttributeError):
        return None
    count, process = [0], batching.BatchTrace.process_primitive

    def counting_init(self, *a, **k):
        count[0] += 1
        return original(self, *a, **k)

    def seen(self, primitive, tracers, params):    # a jit's own equations too: JAX caches their batched form
        inside.update([primitive.name, *(e.primitive.name for e in _inner(params))])
        return process(self, primitive, tracers, params)

    patches = [(batching.BatchTrace, "__init__", counting_init)]
    if inside is not None:
        patches.append((batching.BatchTrace, "process_primitive", seen))
    return count[0] if watch(fn, args, patches, again=lambda: count[0] == 0) else None


from ._diagnose import Case, Mistake, Said, diagnose, difference, placement, relation, same  # noqa: E402  (uses the names above)
