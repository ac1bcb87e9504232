"""Lesson 02 checkers: the reference passes; typical mistakes get feedback that names them."""

import jax
import jax.numpy as jnp
import numpy as np

from course_lib.exercises import check
from course_lib.exercises.lesson02 import solution_block_on, solution_split_batch, solution_sum_of_squares


def test_02_1_split_batch():
    assert check("02.1", solution_split_batch)
    swapped = check("02.1", lambda x, n: x.reshape((x.shape[0] // n, n) + x.shape[1:]))
    assert "has shape (2, 8, 3); expected (8, 2, 3)" in swapped.message and "comes first" in swapped.message
    interleaved = check("02.1", lambda x, n: x.reshape((x.shape[0] // n, n) + x.shape[1:]).swapaxes(0, 1))
    assert "rows were interleaved" in interleaved.message
    only_2d = check("02.1", lambda x, n: x.reshape(n, x.shape[0] // n, -1))
    assert "split_batch(x (12, 2, 2), n=4) has shape (4, 3, 4); expected (4, 3, 2, 2)" in only_2d.message
    hard_coded = check("02.1", lambda x, n: x.reshape(8, 2, 3))
    assert "split_batch(x (12, 2, 2), n=4) has shape (8, 2, 3)" in hard_coded.message


def test_02_2_sum_of_squares():
    assert check("02.2", solution_sum_of_squares)
    last_axis_only = check("02.2", jax.pmap(lambda b: jnp.sum(b**2, axis=-1)))
    assert "has shape (8, 2); expected (8,)" in last_axis_only.message and "whole block" in last_axis_only.message
    on_one_device = check("02.2", jax.vmap(lambda b: jnp.sum(b**2)))
    assert "lives on one device" in on_one_device.message
    total = check("02.2", lambda xs: jnp.sum(xs**2))
    assert "is a single number" in total.message
    no_square = check("02.2", jax.pmap(jnp.sum))
    assert "values differ" in no_square.message


def test_02_3_block_on():
    assert check("02.3", solution_block_on)
    gathered = check("02.3", lambda y, i: y[i])
    assert "lives on devices [0, 1, 2, 3, 4, 5, 6, 7]; expected device 0 only" in gathered.message
    assert "y.addressable_shards[i].data" in gathered.message
    keeps_axis = check("02.3", lambda y, i: y.addressable_shards[i].data)
    assert "has shape (1, 3); expected (3,)" in keeps_axis.message and "[0]" in keeps_axis.message
    on_host = check("02.3", lambda y, i: np.asarray(y)[i])
    assert "copied to the host" in on_host.message
    wrong_device = check("02.3", lambda y, i: y.addressable_shards[0].data[0])
    assert "values differ" in wrong_device.message
