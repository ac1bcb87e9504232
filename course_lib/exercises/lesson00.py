"""Lesson 00 exercises: placing an array on a chosen device, and finding where an array lives."""

import jax
import jax.numpy as jnp
import numpy as np

from . import Mismatch, as_array, call, describe, describe_tree, exercise, expect_array


def _data(shape, seed):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# 00.1 Put an array on device 3


def solution_on_device_3(x):
    return jax.device_put(x, jax.devices()[3])


@exercise("00.1", "Put an array on device 3", solution=solution_on_device_3,
          returns="a jax.Array with x's shape and values, living on jax.devices()[3] only",
          hints=["jax.devices() lists the devices; the one you want is at index 3. An array goes where you "
                 "put it; jnp.asarray(x) puts it on the default device, device 0.",
                 "jax.device_put(x, jax.devices()[3]) copies x to device 3 and returns the new array. Pass the "
                 "Device object, not the number 3."])
def check_on_device_3(on_device_3):
    device = jax.devices()[3]
    for x in [_data((4,), seed=0), jnp.asarray(_data((2, 3), seed=1)),
              jax.device_put(_data((5,), seed=2), jax.devices()[-1])]:
        private = np.array(x, copy=True)
        what = f"on_device_3({describe(x)} on {'the host' if isinstance(x, np.ndarray) else x.devices()})"
        got = call(on_device_3, x.copy() if isinstance(x, np.ndarray) else x, name="on_device_3")
        if isinstance(got, jax.Device):
            raise Mismatch(f"{what} returned the device itself ({got}); return the array, placed on it: "
                           "jax.device_put(x, device).")
        as_array(got, what=what, expected_shape=private.shape)
        if not isinstance(got, jax.Array):
            raise Mismatch(f"{what} is a {describe(got)}, still on the host: place it with jax.device_put.")
        expect_array(got, private, what=what)
        ids = sorted(d.id for d in got.devices())
        if ids != [device.id]:
            where = "the default device" if ids == [jax.devices()[0].id] else f"device(s) {ids}"
            raise Mismatch(f"{what} lives on {where}; expected device {device.id} only: "
                           "jax.device_put(x, jax.devices()[3]).")
    return "the array lives on device 3, and x.devices() proves it."


# ----------------------------------------------------------------------------------------------
# 00.2 Which devices hold an array?


def solution_device_ids(a):
    return sorted(d.id for d in a.devices())


@exercise("00.2", "Which devices hold an array?", solution=solution_device_ids,
          returns="a sorted list of ints: the ids of the devices that hold (a part of) the array",
          hints=["An array can tell you where it lives; a Device has an id. One device or several: the same "
                 "code should work for both.",
                 "a.devices() is the set of Devices holding a; sorted(d.id for d in a.devices()) is the answer. "
                 "(a.device works only for an array on a single device.)"])
def check_device_ids(device_ids):
    devs = jax.devices()
    n = len(devs)
    mesh = jax.sharding.Mesh(np.array(devs[:2]), ("d",))
    cases = [
        ("an array on device 3", jax.device_put(jnp.arange(3.0), devs[3]), [devs[3].id]),
        ("an array on the last device", jax.device_put(jnp.ones(2), devs[-1]), [devs[-1].id]),
        (f"a pmap result on {n} devices", jax.pmap(lambda v: v * 2)(jnp.arange(float(n))), sorted(d.id for d in devs)),
        ("an array replicated on devices 0 and 1",
         jax.device_put(jnp.zeros(4), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())),
         sorted(d.id for d in devs[:2])),
    ]
    for label, a, expected in cases:
        got = call(device_ids, a, name="device_ids", hints={
            "has no attribute 'id'": "For an array on several devices a.device is its sharding, not a Device; "
                                     "a.devices() is the set of devices for any array."})
        what = f"device_ids({label})"
        if isinstance(got, (set, frozenset)) or (isinstance(got, (list, tuple)) and got
                                                 and all(isinstance(d, jax.Device) for d in got)):
            raise Mismatch(f"{what} returned the Devices themselves ({type(got).__name__} of {len(got)}); expected "
                           f"the sorted list of their ids, {expected}: d.id for each d.")
        if isinstance(got, int) and not isinstance(got, bool):
            raise Mismatch(f"{what} returned one int, {got}; expected a list of ids, {expected}, even for one "
                           "device.")
        if not isinstance(got, (list, tuple)):
            raise Mismatch(f"{what} should be a list of device ids like {expected}; got {describe_tree(got)}.")
        try:
            ids = [int(i) for i in got]
        except (TypeError, ValueError):
            raise Mismatch(f"{what} should be a list of ints (device ids) like {expected}; got "
                           f"{describe_tree(got)}.") from None
        if sorted(ids) == expected and ids != expected:
            raise Mismatch(f"{what} returned {ids}: the right ids, but not sorted. Return sorted(...), so that "
                           "the answer does not depend on the order of a set.")
        if ids != expected:
            raise Mismatch(f"{what} returned {ids}; expected {expected}. Ask the array itself, a.devices(), "
                           "rather than jax.devices() or a count.")
    return "a.devices() says where an array lives, one device or many."
