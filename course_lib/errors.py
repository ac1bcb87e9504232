"""Showing an error in a notebook without stopping "Run All".

The "common errors" sections of the lessons run code that fails on purpose. Wrapped in
``show_error``, the cell prints the exception's type and JAX's own message, then carries
on; if the code does *not* fail, the cell fails, so a lesson cannot go on claiming an
error that today's JAX no longer raises.
"""

from __future__ import annotations

import contextlib
import textwrap

from . import _checks

__all__ = ["show_error", "ExpectedErrorMissing"]


class ExpectedErrorMissing(AssertionError):
    """The code in a ``show_error`` block ran without raising."""


@contextlib.contextmanager
def show_error(*expected: type[BaseException], max_lines: int = 6, width: int = 80):
    """Run the block, expect it to raise, and print ``Type: message`` instead of a traceback.

    Args:
      expected: the exception types the block should raise (default: any ``Exception``).
      max_lines: how many lines of the message to print (JAX's messages can be long).
      width: wrap lines longer than this.

    Raises:
      ExpectedErrorMissing: the block did not raise.
      Any exception not in ``expected``, unchanged.
    """
    for e in expected:
        if not (isinstance(e, type) and issubclass(e, BaseException)):
            _checks.fail("show_error", "expected", "exception classes", e,
                         "Pass the classes themselves, e.g. show_error(ValueError, TypeError).", TypeError)
    max_lines = _checks.whole(max_lines, "max_lines", "show_error")
    width = _checks.whole(width, "width", "show_error", minimum=20)
    expected = expected or (Exception,)
    try:
        yield
    except expected as e:
        # JAX appends where in the user's code the error arose ("This error occurs at source: /path/...");
        # that line names a file on this machine, not the cause.
        lines = [ln for ln in str(e).splitlines() if ln.strip() and not ln.startswith("This error occurs at source:")]
        prefix = f"{type(e).__name__}: "
        text = [prefix + ln if i == 0 else ln for i, ln in enumerate(lines[:max_lines])] or [prefix.rstrip()]
        shown = []
        for ln in text:
            shown.extend(textwrap.wrap(ln, width, subsequent_indent="    ", break_long_words=False,
                                       break_on_hyphens=False) or [""])
        more = "\n    ..." if len(lines) > max_lines else ""
        print("\n".join(shown) + more)
    else:
        names = " or ".join(t.__name__ for t in expected)
        raise ExpectedErrorMissing(f"expected {names}, but the code ran without an error")
