"""Exercise 00.2 (which devices hold an array?): answers that try to fool the checker."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fooling import fool_tests

ID = "00.2"

WRONG = [
    ("the Devices themselves", lambda a: sorted(a.devices(), key=lambda d: d.id), "Those are the Devices themselves"),
    (".device of one device", lambda a: [a.device.id], "a.devices() is the set of devices for any array"),
    ("counted, not asked", lambda a: list(range(len(a.devices()))), "expected [3], got [0]"),
    ("every device JAX has", lambda a: sorted(d.id for d in jax.devices()), "Those are the ids of every device JAX has"),
    ("in reverse order", lambda a: sorted((d.id for d in a.devices()), reverse=True), "in reverse order"),
    ("ids as text", lambda a: sorted(str(d.id) for d in a.devices()), "device_ids(an array on device 3): returned ['3'], ids as "
     "strings; expected a list of ints in ascending order, [3]."),
    ("one int", lambda a: min(d.id for d in a.devices()), "one number where shape (1,) was expected"),
    ("one Device", lambda a: next(iter(a.devices())), "got Device"),
    ("one id picked from the set", lambda a: [next(iter(a.devices())).id], "expected [0, 1, 2, 3, 4, 5, 6, 7], got ["),
    ("a set of ids", lambda a: {d.id for d in a.devices()}, "returned the set {3}, which has no order; expected a list of ints"),
    ("the set of Devices", lambda a: a.devices(), "returned a set of Device; expected a list of ints"),
    ("one id popped from JAX's own set", lambda a: [a.devices().pop().id], "changed the set that a.devices()"),
]
RIGHT = [
    ("from the shards", lambda a: sorted({s.device.id for s in a.addressable_shards})),
    ("from the sharding", lambda a: sorted(d.id for d in a.sharding.device_set)),
    ("from the shards, no set", lambda a: sorted(s.device.id for s in a.addressable_shards)),
]


verdict, test_a_wrong_answer_fails_and_its_feedback_names_the_mistake, \
    test_a_right_answer_written_another_way_passes = fool_tests(ID, WRONG, RIGHT)

