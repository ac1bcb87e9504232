"""Lesson 02 checkers: the reference passes; typical mistakes get feedback that names them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from course_lib.exercises import check
from course_lib.exercises.lesson02 import solution_block_on, solution_split_batch, solution_sum_of_squares


def test_02_1_split_batch():
    assert check("02.1", solution_split_batch)
    swapped = check("02.1", lambda x, n: x.reshape((x.shape[0] // n, n) + x.shape[1:]))
    assert "got shape (2, 8, 3) [" in swapped.message and "should come first" in swapped.message
    interleaved = check("02.1", lambda x, n: x.reshape((x.shape[0] // n, n) + x.shape[1:]).swapaxes(0, 1))
    assert "rows were interleaved" in interleaved.message
    only_2d = check("02.1", lambda x, n: x.reshape(n, x.shape[0] // n, -1))
    assert "split_batch(x (12, 2, 2) float32, n=4): expected shape (4, 3, 2, 2)" in only_2d.message
    assert "shape (4, 3, 4) where (4, 3, 2, 2) was expected: the expected values in another shape" in only_2d.message
    hard_coded = check("02.1", lambda x, n: x.reshape(8, 2, 3))
    assert "split_batch(x (12, 2, 2) float32, n=4): expected shape (4, 3, 2, 2)" in hard_coded.message
    assert "got shape (8, 2, 3)" in hard_coded.message


def test_02_2_sum_of_squares():
    assert check("02.2", solution_sum_of_squares)
    last_axis_only = check("02.2", jax.pmap(lambda b: jnp.sum(b**2, axis=-1)))
    assert "got shape (8, 2) [" in last_axis_only.message and "whole block" in last_axis_only.message
    on_one_device = check("02.2", jax.vmap(lambda b: jnp.sum(b**2)))
    assert "lives on one device" in on_one_device.message
    total = check("02.2", lambda xs: jnp.sum(xs**2))
    assert "one number where shape (8,) was expected" in total.message
    no_square = check("02.2", jax.pmap(jnp.sum))
    assert "the values were not squared" in no_square.message


def test_02_3_block_on():
    assert check("02.3", solution_block_on)
    gathered = check("02.3", lambda y, i: y[i])
    assert "on device 0, building it moved no data), got ([4.08184, -5.11133, 0.836198], on devices [0, 1, 2, 3, 4, 5, 6, 7]" in gathered.message
    assert "Read the block the device already holds instead (section 3)" in gathered.message
    keeps_axis = check("02.3", lambda y, i: y.addressable_shards[i].data)
    assert "got ([[4.08184, -5.11133, 0.836198]]" in keeps_axis.message and "pmap's device axis, which a shard's data keeps" in keeps_axis.message
    on_host = check("02.3", lambda y, i: np.asarray(y)[i])
    assert "copied to the host" in on_host.message
    wrong_device = check("02.3", lambda y, i: y.addressable_shards[0].data[0])
    assert "That is device 0's block, whatever device is asked for" in wrong_device.message
    off_by_one = check("02.3", lambda y, i: y.addressable_shards[i - 1].data[0])
    assert "block_on(y (8, 3), 0): expected ([4.08184, -5.11133, 0.836198], on device 0" in off_by_one.message and "on device 7" in off_by_one.message
    doubled = check("02.3", lambda y, i: 2 * y.addressable_shards[i].data[0])
    assert not doubled and "the block: 2x too large" in doubled.message


def test_02_3_squeeze_that_drops_the_arrays_own_axes_of_size_1_fails():
    # y (8, 1, 2): device i's part is (1, 2); a squeeze with no axis named returns (2,), and passed before.
    squeezed = check("02.3", lambda y, i: y.addressable_shards[i].data.squeeze())
    assert not squeezed
    assert "block_on(y (8, 1, 2), 0): expected ([[0.378107, -1.0455]]" in squeezed.message
    assert "Every axis of size 1 was dropped" in squeezed.message
    assert check("02.3", lambda y, i: y.addressable_shards[i].data.squeeze(0))
    assert check("02.3", lambda y, i: y.addressable_shards[i].data.reshape(y.shape[1:]))


@pytest.mark.filterwarnings("ignore:Setting the shape on a NumPy array:DeprecationWarning")
def test_02_1_expected_answer_is_private():
    # Fails on the checker before issue 14: its expected answer was a view of the learner's input.
    def zero_then_reshape(x, n):
        x[...] = 0
        return x.reshape((n, x.shape[0] // n) + x.shape[1:])

    fb = check("02.1", zero_then_reshape)
    assert not fb and "changed its input x in place: its values changed" in fb.message

    def reshape_in_place(x, n):
        x.shape = (n, x.shape[0] // n) + x.shape[1:]
        return x

    fb = check("02.1", reshape_in_place)
    assert not fb and "changed its input x in place: its shape changed to (8, 2, 3)" in fb.message


def test_02_1_raises_or_wrong_structure():
    fb = check("02.1", lambda x, n: jax.eval_shape(lambda a: a.reshape((n, -1) + a.shape[1:]), x))
    assert not fb and "got ShapeDtypeStruct float32[8, 2, 3]" in fb.message and "jax.eval_shape" in fb.message
    fb = check("02.1", lambda x, n: x.reshape(n, x.shape[0] // n, x.shape[1]))
    assert not fb and "split_batch(ndarray float32[12, 2, 2], 4) raised ValueError" in fb.message
    fb = check("02.1", lambda x, n: np.split(x, n))
    assert not fb and "expected ndarray float32[8, 2, 3], got list[ndarray float32[2, 3]" in fb.message


def test_02_2_raises_or_wrong_structure():
    fb = check("02.2", jax.pmap(lambda b: jnp.sum(b**2), in_axes=3))
    assert not fb and "sum_of_squares(Array float32[8, 2, 3]) raised IndexError" in fb.message
    fb = check("02.2", lambda xs: (solution_sum_of_squares(xs), xs))
    assert not fb and "expected Array float32[8], got tuple(" in fb.message


def test_02_3_raises_or_wrong_structure():
    fb = check("02.3", lambda y, i: y.addressable_shards[i + 8].data[0])
    assert not fb and "block_on(Array float32[8, 3], 0) raised IndexError" in fb.message
    fb = check("02.3", lambda y, i: y.addressable_shards[i])
    assert not fb and "block_on returned Shard; expected a jax.Array of shape y.shape[1:]" in fb.message
