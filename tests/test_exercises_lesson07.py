"""Lesson 07 checkers: the reference passes; typical mistakes get feedback that names them."""

from course_lib.exercises import check
from course_lib.exercises.lesson07 import solution_local_part, solution_process_rows


def test_07_1_process_rows():
    assert check("07.1", solution_process_rows)
    interleaved = check("07.1", lambda b, n, p: slice(p, b, n))
    assert "interleaved" in interleaved.message
    off_by_one = check("07.1", lambda b, n, p: slice(p * (b // n), (p + 1) * (b // n) + 1))
    assert "has shape" in off_by_one.message
    not_a_slice = check("07.1", lambda b, n, p: list(range(p * (b // n), (p + 1) * (b // n))))
    assert "should return a slice" in not_a_slice.message


def test_07_2_local_part():
    assert check("07.2", solution_local_part)
    contiguous = check("07.2", lambda batch, devices, p: batch[p * 4:(p + 1) * 4] if len(
        {d.process_index for d in devices}) == 2 else solution_local_part(batch, devices, p))
    assert "read each device's process_index" in contiguous.message
    everything = check("07.2", lambda batch, devices, p: batch)
    assert "has shape (8, 3, 2); expected (4, 3, 2)" in everything.message
