"""Lesson 00 exercises: placing an array on a chosen device, and finding where an array lives."""

import jax
import jax.numpy as jnp
import numpy as np

from . import Mismatch, as_array, call, describe, describe_tree, exercise, expect_array


def _data(shape, seed):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def expect_dtype(got, expected, *, what: str = "the result") -> None:
    """``got`` has dtype ``expected``; a cast (float16, bfloat16, float64, an int) is named, not called "values differ".

    Shared by the checkers of lessons 00-03.
    """
    dtype = getattr(got, "dtype", None)
    if dtype is None:
        return
    expected = np.dtype(expected)
    try:
        same = np.dtype(dtype) == expected
    except TypeError:
        same = False
    if not same:
        name = getattr(dtype, "name", None) or str(dtype)
        raise Mismatch(f"{what} has dtype {name}; expected {expected.name}, the input's dtype. Something in the "
                       f"answer casts the values (astype, a dtype= argument, half precision or integer "
                       f"arithmetic): leave the dtype as it comes in.")


# ----------------------------------------------------------------------------------------------
# 00.1 Put an array on device 3


def solution_on_device_3(x):
    return jax.device_put(x, jax.devices()[3])


@exercise("00.1", "Put an array on device 3", solution=solution_on_device_3,
          returns="a jax.Array with x's shape and values, living on jax.devices()[3] only",
          hints=["An array lives where it was put: converting x with jnp.asarray puts it on the default device, "
                 "device 0. Moving it is one call, which returns a new array.",
                 "The API is `jax.device_put` (section 4 of the lesson). Its target is a Device object, not a "
                 "number: `jax.devices()` lists the Device objects in id order.",
                 "In words: take the entry with index 3 of the device list, put x there, and return the array "
                 "that comes back."])
def check_on_device_3(on_device_3):
    device = jax.devices()[3]
    for x in [_data((4,), seed=0), jnp.asarray(_data((2, 3), seed=1)),
              jax.device_put(_data((5,), seed=2), jax.devices()[-1]), np.arange(6, dtype=np.int32).reshape(3, 2)]:
        private = np.array(x, copy=True)
        what = f"on_device_3({describe(x)} on {'the host' if isinstance(x, np.ndarray) else x.devices()})"
        got = call(on_device_3, x.copy() if isinstance(x, np.ndarray) else x, name="on_device_3", hints={
            "Received invalid value": "jax.device_put wants a Device object as its target (an entry of "
                                      "jax.devices()), not the device's number or name."})
        if isinstance(got, jax.Device):
            raise Mismatch(f"{what} returned the device itself ({got}); return the array, placed on that device.")
        expect_dtype(got, private.dtype, what=what)
        as_array(got, what=what, expected_shape=private.shape)
        if not isinstance(got, jax.Array):
            raise Mismatch(f"{what} is a {describe(got)}, still in host memory: it never reached a device.")
        expect_array(got, private, what=what)
        ids = sorted(d.id for d in got.devices())
        if ids != [device.id]:
            if ids == [jax.devices()[0].id]:
                where = ("the default device, device 0, where creating or converting an array (jnp.asarray, "
                         "jnp.array) puts it: it was never moved to device 3")
            elif len(ids) > 1:
                where = f"{len(ids)} devices, ids {ids}: it should be on one device only"
            else:
                where = f"device {ids[0]} (which entry of jax.devices() did it use?)"
            raise Mismatch(f"{what} lives on {where}. Expected device {device.id} only.")
    return "the array lives on device 3, and x.devices() proves it."


# ----------------------------------------------------------------------------------------------
# 00.2 Which devices hold an array?


def solution_device_ids(a):
    return sorted(d.id for d in a.devices())


@exercise("00.2", "Which devices hold an array?", solution=solution_device_ids,
          returns="a sorted list of ints: the ids of the devices that hold (a part of) the array",
          hints=["Ask the array, not JAX: an array knows where it lives, and each Device has a number. The same "
                 "code must work for an array on one device and on several.",
                 "Section 4 of the lesson: `jax.Array.devices` gives the set of Devices holding an array (for "
                 "one device or many; `.device` only works for one). A Device's number is its `id` attribute.",
                 "In words: for each Device holding the array take its id (an int), and return those ids as a "
                 "sorted list."])
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
        ("an array on devices 2 and 5",
         jax.device_put(jnp.zeros(4), jax.sharding.NamedSharding(
             jax.sharding.Mesh(np.array([devs[2], devs[5]]), ("d",)), jax.sharding.PartitionSpec("d"))),
         sorted([devs[2].id, devs[5].id])),
    ]
    for label, a, expected in cases:
        got = call(device_ids, a, name="device_ids", hints={
            "has no attribute 'id'": "For an array on several devices a.device is its sharding, not a Device; "
                                     "a.devices() is the set of devices for any array.",
            "single device": "a.device works only for an array on one device; a.devices() works for any array."})
        what = f"device_ids({label})"
        held = a.devices()
        if sorted(d.id for d in held) != expected:  # JAX caches that set: an answer that pops from it changes it
            held.update(d for d in devs if d.id in expected)  # put back what was taken, for the rest of the session
            raise Mismatch(f"{what} changed the set that a.devices() returns (a set's pop or remove takes the "
                           "element out): JAX keeps that set with the array's sharding, so later code would see a "
                           "device missing. Read the set without changing it.")
        if isinstance(got, (set, frozenset)) or (isinstance(got, (list, tuple)) and got
                                                 and all(isinstance(d, jax.Device) for d in got)):
            raise Mismatch(f"{what} returned the Devices themselves ({type(got).__name__} of {len(got)}); expected "
                           f"the sorted list of their ids (ints), {expected}: a Device has an id attribute.")
        if isinstance(got, jax.Device):
            raise Mismatch(f"{what} returned one Device ({got}); expected the sorted list of the ids (ints) of "
                           f"every device holding the array, {expected}.")
        if isinstance(got, (int, np.integer)) and not isinstance(got, bool):
            raise Mismatch(f"{what} returned one int, {got}; expected a list of ids, {expected}, even for one "
                           "device.")
        if not isinstance(got, (list, tuple)):
            raise Mismatch(f"{what} should be a list of device ids like {expected}; got {describe_tree(got)}.")
        kinds = sorted({type(i).__name__ for i in got
                        if isinstance(i, bool) or not isinstance(i, (int, np.integer))})
        if kinds:
            shown = ", ".join(repr(i) for i in got[:8]) + (", ..." if len(got) > 8 else "")
            raise Mismatch(f"{what} returned [{shown}], which holds {' and '.join(kinds)} values; expected ints "
                           f"like {expected}. A Device's id is already an int: return it as it is, not as text "
                           "or a float.")
        ids = [int(i) for i in got]
        if sorted(ids) == expected and ids != expected:
            raise Mismatch(f"{what} returned {ids}: the right ids, but not sorted (the order of a set is "
                           "arbitrary, and the answer should not depend on it).")
        if ids and set(ids) < set(expected) and len(set(ids)) == len(ids):
            raise Mismatch(f"{what} returned {ids}: {len(ids)} of the {len(expected)} ids, {expected}. The array "
                           f"lives on {len(expected)} devices, and the answer kept only part of the set it "
                           "asked for (one element picked from it?).")
        if ids != expected:
            raise Mismatch(f"{what} returned {ids}; expected {expected}. Ask the array itself where it lives, "
                           "rather than jax.devices(), a count or a range.")
    return "a.devices() says where an array lives, one device or many."
