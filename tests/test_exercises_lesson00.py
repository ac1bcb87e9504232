"""Lesson 00 checkers: the reference passes; typical mistakes get feedback that names them."""

import jax
import jax.numpy as jnp

from course_lib.exercises import check
from course_lib.exercises.lesson00 import solution_device_ids, solution_on_device_3


def test_00_1_on_device_3():
    assert check("00.1", solution_on_device_3)
    default = check("00.1", jnp.asarray)
    assert not default and "The result lives where converting an array leaves it" in default.message
    assert "got ([0.12573, -0.132105, 0.640423, 0.1049], on device 0)" in default.message
    fb = check("00.1", lambda x: jax.device_put(x, 3))
    assert not fb and "on_device_3(ndarray float32[4]) raised ValueError" in fb.message
    fb = check("00.1", lambda x: jax.devices()[3])
    assert not fb and "on_device_3 returned Device; expected a jax.Array with x's shape and values" in fb.message
    assert "not an array" not in fb.message       # the checker's own (values, placement) pair is not shown
    fb = check("00.1", lambda x: (jax.device_put(x, jax.devices()[3]), jax.devices()[3]))
    assert not fb and "returned tuple(Array float32[4], Device); expected a jax.Array" in fb.message
    fb = check("00.1", lambda x: x)
    assert not fb and "expected on device 3, got on the host" in fb.message
    fb = check("00.1", lambda x: jax.device_put(jnp.zeros_like(x), jax.devices()[3]))
    assert not fb and "all zeros" in fb.message
    fb = check("00.1", lambda x: jax.device_put(x, jax.devices()[2]))
    assert not fb and "expected on device 3, got on device 2." in fb.message


def test_00_2_device_ids():
    assert check("00.2", solution_device_ids)
    fb = check("00.2", lambda a: a.devices())
    assert not fb and "returned a set of Device; expected a list of ints" in fb.message
    fb = check("00.2", lambda a: [a.device.id])
    assert not fb and "raised AttributeError" in fb.message and "a.devices() is the set of devices" in fb.message
    fb = check("00.2", lambda a: list(range(len(a.devices()))))
    assert not fb and "expected [3], got [0]" in fb.message
    fb = check("00.2", lambda a: list(a.devices())[0].id)
    assert not fb and "expected [3], got 3: one number where shape (1,) was expected" in fb.message
    fb = check("00.2", lambda a: {d.id: d for d in a.devices()})
    assert not fb and "got dict{3: Device}" in fb.message
    fb = check("00.2", lambda a: sorted((d.id for d in a.devices()), reverse=True))
    assert not fb and "the expected values in reverse order" in fb.message
