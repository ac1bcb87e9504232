"""Exercise 00.2 (which devices hold an array?): answers that try to fool the checker."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fooling import fool_tests

ID = "00.2"

WRONG = [
    ("the Devices themselves", lambda a: sorted(a.devices(), key=lambda d: d.id), "returned the Devices themselves"),
    (".device of one device", lambda a: [a.device.id], "a.devices() is the set of devices for any array"),
    ("counted, not asked", lambda a: list(range(len(a.devices()))), "Ask the array itself"),
    ("every device JAX has", lambda a: sorted(d.id for d in jax.devices()), "Ask the array itself"),
    ("not sorted", lambda a: sorted((d.id for d in a.devices()), reverse=True), "not sorted"),
    ("ids as text", lambda a: sorted(str(d.id) for d in a.devices()), "holds str values"),
    ("one int", lambda a: min(d.id for d in a.devices()), "returned one int"),
    ("one Device", lambda a: next(iter(a.devices())), "returned one Device"),
    ("one id picked from the set", lambda a: [next(iter(a.devices())).id], "kept only part of the set"),
    ("one id popped from JAX's own set", lambda a: [a.devices().pop().id], "changed the set that a.devices()"),
]
RIGHT = [
    ("from the shards", lambda a: sorted({s.device.id for s in a.addressable_shards})),
    ("from the sharding", lambda a: sorted(d.id for d in a.sharding.device_set)),
    ("from the shards, no set", lambda a: sorted(s.device.id for s in a.addressable_shards)),
]


verdict, test_a_wrong_answer_fails_and_its_feedback_names_the_mistake, \
    test_a_right_answer_written_another_way_passes = fool_tests(ID, WRONG, RIGHT)

