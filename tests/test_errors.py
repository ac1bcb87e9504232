"""course_lib.errors.show_error: errors printed, not raised; a missing error is a failure."""

import jax
import jax.numpy as jnp
import pytest

from course_lib.errors import ExpectedErrorMissing, show_error


def test_prints_type_and_jax_message(capsys):
    with show_error(ValueError):
        jax.pmap(lambda x: x, in_axes=None)(jnp.ones((8, 2)))
    assert capsys.readouterr().out == "ValueError: pmap requires at least one argument with a mapped axis.\n"


def test_no_error_is_a_failure():
    with pytest.raises(ExpectedErrorMissing, match="expected ValueError or TypeError, but the code ran without"):
        with show_error(ValueError, TypeError):
            jnp.ones(3) + 1


def test_other_errors_pass_through():
    with pytest.raises(ZeroDivisionError):
        with show_error(ValueError):
            1 / 0


def test_long_messages_are_cut_and_wrapped(capsys):
    with show_error(max_lines=2, width=40):
        raise RuntimeError("first line " * 10 + "\nsecond\nthird\nfourth")
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("RuntimeError: first line")
    assert all(len(line) <= 40 + len("RuntimeError: ") for line in out)
    assert out[-1] == "    ..." and "third" not in "\n".join(out)


def test_lines_fit_the_width_and_break_between_words(capsys):
    words = " ".join(f"word{i:03d}" for i in range(60))
    with show_error(ValueError, width=50):
        raise ValueError(words)
    out = capsys.readouterr().out
    assert all(len(line) <= 50 for line in out.splitlines()), out
    assert out.replace("\n    ", " ").strip() == f"ValueError: {words}"


def test_the_source_location_jax_appends_is_left_out(capsys):
    with show_error(ValueError):
        raise ValueError("the cause\nThis error occurs at source: /some/machine/path/file.py:12")
    assert capsys.readouterr().out == "ValueError: the cause\n"
