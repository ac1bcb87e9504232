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


def test_08_1_raises_or_wrong_structure():
    fb = check("08.1", lambda b, n, p: slice(p * b / n, (p + 1) * b / n))
    assert not fb and "which cannot select rows" in fb.message and "must be ints" in fb.message
    fb = check("08.1", lambda b, n, p: (p * (b // n), (p + 1) * (b // n)))
    assert not fb and "should return a slice, like slice(start, stop); got tuple(int, int)" in fb.message
    fb = check("08.1", lambda b, n, p: slice(0, b // n * [1][p]))
    assert not fb and "process_rows(int, int, int) raised IndexError" in fb.message


def test_08_2_expected_answer_is_private():
    # Fails on the checker before issue 14: it built its expected answer from the batch the learner zeroed.
    def zero_and_return_zeros(batch, devices, p):
        rows = [i for i, d in enumerate(devices) if d.process_index == p]
        batch[...] = 0
        return batch[rows]

    fb = check("08.2", zero_and_return_zeros)
    assert not fb and "changed its input batch in place: its values changed" in fb.message

    def sorts_devices(batch, devices, p):
        devices.sort(key=lambda d: (d.process_index, d.id))
        return solution_local_part(batch, devices, p)

    fb = check("08.2", sorts_devices)
    assert not fb and "changed its input devices in place" in fb.message


def test_08_2_raises_or_wrong_structure():
    fb = check("08.2", lambda batch, devices, p: batch[[i for i, d in enumerate(devices) if d.process_id == p]])
    assert not fb and "raised AttributeError" in fb.message and "process_id" in fb.message
    fb = check("08.2", lambda batch, devices, p: [batch[i] for i, d in enumerate(devices) if d.process_index == p])
    assert not fb and "should be an array of shape (4, 3, 2), got list[ndarray int64[3, 2]" in fb.message
