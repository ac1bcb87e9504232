"""Lesson 03 checkers: the reference passes; typical mistakes get feedback that names them."""

import jax
import jax.numpy as jnp

from course_lib.exercises import check
from course_lib.exercises.lesson03 import solution_device_axis_last, solution_predict, solution_scale_on_two

TWO = jax.devices()[:2]


def on_two(x, s, in_axes=(0, None)):
    return jax.pmap(lambda a, f: a * f, in_axes=in_axes, devices=TWO)(x.reshape(2, -1, x.shape[1]), s)


def test_03_1_scale_on_two():
    assert check("03.1", solution_scale_on_two)
    mapped_scalar = check("03.1", lambda x, s: on_two(x, s, in_axes=0).reshape(x.shape))
    assert "raised ValueError" in mapped_scalar.message and "split a scalar (rank 0)" in mapped_scalar.message and "None sends that argument whole" in mapped_scalar.message
    no_reshape = check("03.1", lambda x, s: jax.pmap(lambda a, f: a * f, in_axes=(0, None), devices=TWO)(x, s))
    assert "more slices than devices: reshape the leading axis" in no_reshape.message
    not_back = check("03.1", on_two)
    assert "has shape (2, 2, 3): the per-device blocks. Reshape the result back to (4, 3)" in not_back.message
    no_pmap = check("03.1", lambda x, s: x * s)
    assert "lives on 1 device(s) (ids [0]); expected the 2 devices" in no_pmap.message
    hard_coded = check("03.1", lambda x, s: on_two(x, 2.0).reshape(x.shape))
    assert "values differ" in hard_coded.message


def test_03_2_predict():
    assert check("03.2", solution_predict)
    params_mapped = check("03.2", lambda p, xs: jax.pmap(lambda p, x: x @ p["w"] + p["b"])(p, xs))
    assert "were the parameters mapped? Broadcast them: None in in_axes" in params_mapped.message
    no_bias = check("03.2", lambda p, xs: jax.pmap(lambda p, x: x @ p["w"], in_axes=(None, 0))(p, xs))
    assert "the bias b is missing" in no_bias.message
    one_device = check("03.2", lambda p, xs: xs @ p["w"] + p["b"])
    assert "lives on one device" in one_device.message


def test_03_3_device_axis_last():
    assert check("03.3", solution_device_axis_last)
    first = check("03.3", jax.pmap(lambda r: 2.0 * r))
    assert "has shape (8, 5): the device axis is still first. Expected (5, 8)" in first.message
    host = check("03.3", lambda xs: (2.0 * xs).T)
    assert "lives on 1 device(s)" in host.message
    undoubled = check("03.3", jax.pmap(lambda r: r, out_axes=1))
    assert "values differ" in undoubled.message
    square_first = check("03.3", lambda xs: jax.pmap(lambda r: 2.0 * r)(xs) if xs.shape[0] == xs.shape[1]
                         else solution_device_axis_last(xs))
    assert "column i should be device i's result" in square_first.message


def test_03_1_scalar_must_be_broadcast_and_survives_wrong_structures():
    def scalar_stacked(x, s):
        return jax.pmap(lambda a, f: a * f, devices=TWO)(x.reshape(2, -1, x.shape[1]), jnp.full(2, s)).reshape(x.shape)

    fb = check("03.1", scalar_stacked)
    assert not fb and "the scalar was mapped too" in fb.message and "with None for it in in_axes" in fb.message
    fb = check("03.1", lambda x, s: (solution_scale_on_two(x, s), s))
    assert not fb and "should be an array of shape (4, 3), got tuple(" in fb.message


def test_03_2_parameters_must_be_broadcast_not_stacked():
    # Fails on the checker before issue 14: stacked parameters passed as if broadcast.
    def stacked(p, xs):
        n = xs.shape[0]
        copies = jax.tree.map(lambda v: jnp.broadcast_to(v, (n,) + v.shape), p)
        return jax.pmap(lambda q, x: x @ q["w"] + q["b"])(copies, xs)

    fb = check("03.2", stacked)
    assert not fb and "the parameters were mapped over the devices" in fb.message and "None as their in_axes entry" in (
        fb.message)

    def replicated(p, xs):
        from course_lib import sharding
        return jax.pmap(lambda q, x: x @ q["w"] + q["b"])(sharding.replicate(p, jax.devices()[:xs.shape[0]]), xs)

    fb = check("03.2", replicated)
    assert not fb and "in_axes=None saves" in fb.message
    assert check("03.2", lambda p, xs: jax.pmap(lambda q, x: x @ q["w"] + q["b"], in_axes=(None, 0))(p, xs))


def test_03_2_raises_or_wrong_structure():
    fb = check("03.2", lambda p, xs: jax.pmap(lambda q, x: x @ q["weights"], in_axes=(None, 0))(p, xs))
    assert not fb and "raised KeyError: 'weights'" in fb.message
    fb = check("03.2", lambda p, xs: {"pred": solution_predict(p, xs)})
    assert not fb and "should return one array of shape (8, 2, 2), the predictions; got dict" in fb.message


def test_03_3_device_axis_last_needs_out_axes_not_a_transpose():
    # Fails on the checker before issue 14: pmap(...)(xs).T passed.
    fb = check("03.3", lambda xs: jax.pmap(lambda r: 2.0 * r)(xs).T)
    assert not fb and "swapped afterwards (.T, transpose" in fb.message and "with out_axes (section 4)" in fb.message
    fb = check("03.3", lambda xs: jnp.swapaxes(jax.pmap(lambda r: 2.0 * r)(xs), 0, 1))
    assert not fb and "with out_axes (section 4)" in fb.message


def test_03_3_raises_or_wrong_structure():
    fb = check("03.3", jax.pmap(lambda r: 2.0 * r, out_axes=2))
    assert not fb and "raised ValueError" in fb.message
    fb = check("03.3", lambda xs: [solution_device_axis_last(xs)])
    assert not fb and "should be an array of shape (5, 8), got list[Array float32[5, 8]]" in fb.message
