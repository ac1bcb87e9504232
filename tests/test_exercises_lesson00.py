"""Lesson 00 checkers: the reference passes; typical mistakes get feedback that names them."""

import jax
import jax.numpy as jnp

from course_lib.exercises import check
from course_lib.exercises.lesson00 import solution_device_ids, solution_on_device_3


def test_00_1_on_device_3():
    assert check("00.1", solution_on_device_3)
    default = check("00.1", jnp.asarray)
    assert not default and "lives on the default device, device 0" in default.message and "Expected device 3 only" in default.message
    fb = check("00.1", lambda x: jax.device_put(x, 3))
    assert not fb and "on_device_3(ndarray float32[4]) raised ValueError" in fb.message
    fb = check("00.1", lambda x: jax.devices()[3])
    assert not fb and "returned the device itself (cpu:3)" in fb.message
    fb = check("00.1", lambda x: (jax.device_put(x, jax.devices()[3]), jax.devices()[3]))
    assert not fb and "should be an array of shape (4,), got tuple(Array float32[4], Device)" in fb.message
    fb = check("00.1", lambda x: x)
    assert not fb and "still in host memory" in fb.message
    fb = check("00.1", lambda x: jax.device_put(jnp.zeros_like(x), jax.devices()[3]))
    assert not fb and "values differ" in fb.message


def test_00_2_device_ids():
    assert check("00.2", solution_device_ids)
    fb = check("00.2", lambda a: a.devices())
    assert not fb and "returned the Devices themselves (set of 1)" in fb.message and "[3]" in fb.message
    fb = check("00.2", lambda a: [a.device.id])
    assert not fb and "raised AttributeError" in fb.message and "a.devices() is the set of devices" in fb.message
    fb = check("00.2", lambda a: list(range(len(a.devices()))))
    assert not fb and "returned [0]; expected [3]" in fb.message
    fb = check("00.2", lambda a: list(a.devices())[0].id)
    assert not fb and "returned one int, 3; expected a list of ids, [3]" in fb.message
    fb = check("00.2", lambda a: {d.id: d for d in a.devices()})
    assert not fb and "should be a list of device ids like [3]; got dict{3: Device}" in fb.message
    fb = check("00.2", lambda a: sorted((d.id for d in a.devices()), reverse=True))
    assert not fb and "not sorted" in fb.message
