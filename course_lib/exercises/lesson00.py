"""Lesson 00 exercises: placing an array on a chosen device, and finding where an array lives."""

import collections.abc

import jax
import jax.numpy as jnp
import numpy as np

from jax.sharding import PartitionSpec as P

from . import _REGISTRY, Case, Mismatch, Mistake, call, describe_tree, diagnose, exercise, placement


def _data(shape, seed):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# 00.1 Put an array on device 3


def solution_on_device_3(x):
    return jax.device_put(x, jax.devices()[3])


def _values_and_place(fn, case, name="on_device_3"):
    """What a placing answer gives: its values, and where they live."""
    got = call(fn, *[np.array(a) if isinstance(a, np.ndarray) else a for a in case.args], name=name,
               hints={"Received invalid value": "jax.device_put wants a Device object as its target (an entry of "
                                                "jax.devices()), not the device's number or name.",
                      "has no attribute 'id'": "For an array on several devices a.device is its sharding, not a "
                                               "Device; a.devices() is the set of devices for any array.",
                      "single device": "a.device works only for an array on one device; a.devices() works for "
                                       "any array.",
                      "incompatible devices": "x already lives on a device, and a computation on it (jnp.asarray "
                                              "with device= too) runs there and cannot take it elsewhere: moving an "
                                              "array to another device is what jax.device_put does."})
    return (_array(got, name, "00.1"), placement(got)) if name == "on_device_3" else got


def _array(got, name: str, id_: str):
    """``got`` if it is an array; else what came back against what exercise ``id_`` returns (not the checker's pair)."""
    if isinstance(got, (jax.Array, np.ndarray)):
        return got
    raise Mismatch(f"{name} returned {describe_tree(got)}; expected {_REGISTRY[id_].returns}.")


MISTAKES_00_1 = [
    Mistake("left where it was", "The result lives where converting an array leaves it (the default device, "
            "device 0, for a NumPy input): it was not moved to device 3.", lambda x: jnp.asarray(x)),
    Mistake("left on the host", "The result is a NumPy array in host memory: it never reached a device.",
            lambda x: np.asarray(x)),
]


@exercise("00.1", "Put an array on device 3", solution=solution_on_device_3,
          returns="a jax.Array with x's shape and values, living on jax.devices()[3] only",
          hints=["An array lives where it was put, and converting x puts it on the default device. Moving it "
                 "is one call, which returns a new array.",
                 "Section 4 of the lesson, `jax.device_put`: read what it takes as a target. `jax.devices()` "
                 "lists what JAX calls devices."])
def check_on_device_3(on_device_3):
    last = jax.devices()[-1]
    cases = [Case((x,), f"on_device_3(x {np.shape(x)} {np.dtype(x.dtype).name} {placement(x)})")
             for x in [_data((4,), seed=0), jnp.asarray(_data((2, 3), seed=1)),
                       jax.device_put(_data((5,), seed=2), last), np.arange(6, dtype=np.int32).reshape(3, 2)]]
    diagnose(on_device_3, cases, solution=solution_on_device_3, mistakes=MISTAKES_00_1, run=_values_and_place,
             rtol=0, atol=0)
    return "the array lives on device 3, and x.devices() proves it."


# ----------------------------------------------------------------------------------------------
# 00.2 Which devices hold an array?


def solution_device_ids(a):
    return sorted(d.id for d in a.devices())


def _ids_and_set(fn, case):
    (a,) = case.args
    before = set(a.devices())
    got = _values_and_place(fn, case, "device_ids")
    if set(a.devices()) != before:   # JAX caches that set: an answer that pops from it changes it
        a.devices().update(before)  # put back what was taken, for the rest of the session
        raise Mismatch("device_ids changed the set that a.devices() returns (a set's pop or remove takes the "
                       "element out): JAX keeps that set with the array's sharding, so later code would see a "
                       "device missing. Read the set without changing it.")
    if isinstance(got, (jax.Array, np.ndarray)) and got.ndim == 1 and np.issubdtype(got.dtype, np.integer):
        got = [int(i) for i in np.asarray(got)]      # ids in an integer array (int32 in JAX): the same ids
    ints = isinstance(got, (list, tuple, set, frozenset)) and all(
        isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in got)
    if isinstance(got, (set, frozenset)):           # what came back against what is asked, no guessed cause
        shown = (f"the set {set(int(i) for i in got)}, which has no order" if ints
                 else f"a set of {describe_tree(list(got))[5:-1]}")
    elif isinstance(got, collections.abc.Iterator):   # a generator, map, iter(...): not yet a list
        shown = f"a {type(got).__name__}, which gives its items one at a time when looped over"
    elif isinstance(got, (list, tuple)) and got and all(isinstance(i, str) for i in got):
        shown = f"{list(got)!r}, ids as strings"
    elif isinstance(got, (list, tuple)) and any(i is None or isinstance(i, float) for i in got):
        shown = repr(list(got))
    else:                                           # ids as one array: an order or a count shows as such
        return np.array(got, dtype=np.int64) if ints and got else got
    raise Mismatch(f"returned {shown}; expected a list of ints in ascending order, {solution_device_ids(a)}.")


MISTAKES_00_2 = [
    Mistake("the Devices themselves", "Those are the Devices themselves; the ids asked for are ints, a Device's "
            "id attribute.", lambda a: sorted(a.devices(), key=lambda d: d.id)),
    Mistake("every device", "Those are the ids of every device JAX has, not of the devices holding this array.",
            lambda a: [d.id for d in jax.devices()]),
    Mistake("counted from 1", "Each id is one too large: device ids count from 0, as the list jax.devices() "
            "does.", lambda a: [i + 1 for i in solution_device_ids(a)]),
]


@exercise("00.2", "Which devices hold an array?", solution=solution_device_ids,
          returns="a sorted list of ints: the ids of the devices that hold (a part of) the array",
          hints=["Ask the array, not JAX: an array knows where it lives. The same code must work for an array "
                 "on one device and on several.",
                 "Section 4 of the lesson: read what `jax.Array.devices` returns, and what a Device object "
                 "carries (`jax.Device`)."])
def check_device_ids(device_ids):
    devs = jax.devices()

    def on(ids, spec=P()):
        mesh = jax.sharding.Mesh(np.array([devs[i] for i in ids]), ("d",))
        return jax.device_put(jnp.zeros(4), jax.sharding.NamedSharding(mesh, spec))

    arrays = [("an array on device 3", jax.device_put(jnp.arange(3.0), devs[3])),
              ("an array on the last device", jax.device_put(jnp.ones(2), devs[-1])),
              (f"a pmap result on {len(devs)} devices", jax.pmap(lambda v: v * 2)(jnp.arange(float(len(devs))))),
              ("an array replicated on devices 0 and 1", on([0, 1])),
              ("an array on devices 5, 2, 7 and 1", on([5, 2, 7, 1], P("d")))]
    cases = [Case((a,), f"device_ids({label})") for label, a in arrays]
    diagnose(device_ids, cases, solution=solution_device_ids, mistakes=MISTAKES_00_2, run=_ids_and_set)
    return "a.devices() says where an array lives, one device or many."
