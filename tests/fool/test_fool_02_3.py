"""Exercise 02.3 (read one device's block where it lives): answers that try to fool the checker."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fooling import fool_tests

ID = "02.3"

WRONG = [
    ("global index", lambda y, i: y[i], "Indexing the global array"),
    ("global index moved back", lambda y, i: jax.device_put(y[i], jax.devices()[i]),
     "got ([4.08184, -5.11133, 0.836198], on device 0, building it moved data). Building it moved data: the result is a "
     "new array on device i, copied from elsewhere"),
    ("through NumPy", lambda y, i: jax.device_put(np.asarray(y)[i], jax.devices()[i]), "moved data"),
    ("on the host", lambda y, i: np.asarray(y)[i], "It was copied to the host"),
    ("keeps the device axis", lambda y, i: y.addressable_shards[i].data, "pmap's device axis"),
    ("every axis of size 1 squeezed", lambda y, i: y.addressable_shards[i].data.squeeze(),
     "Every axis of size 1 was dropped"),
    ("device 0's shard", lambda y, i: y.addressable_shards[0].data[0], "That is device 0's block, whatever device is asked for"),
    ("off by one", lambda y, i: y.addressable_shards[i - 1].data[0], "got ([3.09164, 1.09021, -1.01046], on device 7"),
]
RIGHT = [
    ("squeeze axis 0", lambda y, i: jnp.squeeze(y.addressable_shards[i].data, 0)),
    ("looked up by device", lambda y, i: next(s.data for s in y.addressable_shards
                                              if s.device == jax.devices()[i])[0]),
]

verdict, test_a_wrong_answer_fails_and_its_feedback_names_the_mistake, \
    test_a_right_answer_written_another_way_passes = fool_tests(ID, WRONG, RIGHT)
