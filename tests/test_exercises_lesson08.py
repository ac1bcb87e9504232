"""Lesson 08 checkers: the reference passes; typical mistakes get feedback that names them."""

from course_lib.exercises import check
from course_lib.exercises.lesson08 import solution_local_part, solution_process_rows


def test_08_1_process_rows():
    assert check("08.1", solution_process_rows)
    interleaved = check("08.1", lambda b, n, p: slice(p, b, n))
    assert "interleaved" in interleaved.message
    off_by_one = check("08.1", lambda b, n, p: slice(p * (b // n), (p + 1) * (b // n) + 1))
    assert "has shape" in off_by_one.message
    not_a_slice = check("08.1", lambda b, n, p: list(range(p * (b // n), (p + 1) * (b // n))))
    assert "should return a slice" in not_a_slice.message


def test_08_2_local_part():
    assert check("08.2", solution_local_part)
    contiguous = check("08.2", lambda batch, devices, p: batch[p * 4:(p + 1) * 4] if len(
        {d.process_index for d in devices}) == 2 else solution_local_part(batch, devices, p))
    assert "read each device's process_index" in contiguous.message
    everything = check("08.2", lambda batch, devices, p: batch)
    assert "has shape (8, 3, 2); expected (4, 3, 2)" in everything.message
