"""Exercise 01.1 (split a batch across devices by hand): answers that try to fool the checker."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fooling import fool_tests

ID = "01.1"


def pieces(x, devices, rows):
    return [jax.device_put(x[r], d) for r, d in zip(rows, devices)]


WRONG = [
    ("one piece short", lambda x, devs: [jax.device_put(x[i * (len(x) // len(devs)):(i + 1) * (len(x) // len(devs))],
                                                        devs[i]) for i in range(len(devs) - 1)],
     "returned 7 items; expected a list of 8"),
    ("every device JAX has", lambda x, devs: pieces(x, jax.devices(), np.split(np.arange(len(x)), len(jax.devices()))),
     "devices with ids [5, 2, 6, 1, 3, 4, 0, 7]): expected pieces on: device 5, device 2"),
    ("interleaved rows", lambda x, devs: [jax.device_put(x[i::len(devs)], d) for i, d in enumerate(devs)],
     "every n-th row"),
    ("not placed", lambda x, devs: list(np.split(x, len(devs))), "The pieces are NumPy arrays in host memory"),
    ("device by position in jax.devices()",
     lambda x, devs: [jax.device_put(p, jax.devices()[i]) for i, p in enumerate(np.split(x, len(devs)))],
     "device 3, device 4, device 0, device 7, got pieces on: device 0, device 1"),
    ("stacked", lambda x, devs: jnp.stack(np.split(x, len(devs))), "expected a list of 8"),
    ("cast to half precision", lambda x, devs: [jax.device_put(p.astype(np.float16), d)
                                                for p, d in zip(np.split(x, len(devs)), devs)], "dtype float16"),
    ("piece size from jax.devices()", lambda x, devs: [
        jax.device_put(x[i * (len(x) // len(jax.devices())):(i + 1) * (len(x) // len(jax.devices()))], d)
        for i, d in enumerate(devs)], "where (3, 2) was expected"),
    ("all on the first device", lambda x, devs: [jax.device_put(p, devs[0]) for p in np.split(x, len(devs))],
     "got pieces on: device 5, device 5"),
]
RIGHT = [
    ("np.split", lambda x, devs: [jax.device_put(p, d) for p, d in zip(np.split(x, len(devs)), devs)]),
    ("reshape, then index", lambda x, devs: [jax.device_put(b, d) for b, d in
                                             zip(x.reshape(len(devs), -1, x.shape[1]), devs)]),
]


verdict, test_a_wrong_answer_fails_and_its_feedback_names_the_mistake, \
    test_a_right_answer_written_another_way_passes = fool_tests(ID, WRONG, RIGHT)

