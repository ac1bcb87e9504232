"""Exercise 00.1 (put an array on device 3): answers that try to fool the checker."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fooling import fool_tests

ID = "00.1"
D3 = jax.devices()[3]

WRONG = [
    ("default device", lambda x: jnp.asarray(x), "The result lives where converting an array leaves it"),
    ("device number", lambda x: jax.device_put(x, 3), "wants a Device object"),
    ("off by one", lambda x: jax.device_put(x, jax.devices()[2]), "expected on device 3, got on device 2"),
    ("the device itself", lambda x: D3, "on_device_3 returned Device"),
    ("left on the host", lambda x: np.asarray(x), "The result is a NumPy array in host memory"),
    ("cast to float32", lambda x: jax.device_put(jnp.asarray(x, jnp.float32), D3), "dtype float32 where int32 was expected"),
    ("on every device", lambda x: jax.device_put(x, NamedSharding(Mesh(np.array(jax.devices()), "d"), P())),
     "got on devices [0, 1, 2, 3, 4, 5, 6, 7]"),
    ("device picked from the shape", lambda x: jax.device_put(x, jax.devices()[x.shape[0] - 1]),
     "expected on device 3, got on device 1"),
]
RIGHT = [
    ("by id", lambda x: jax.device_put(jnp.asarray(x), next(d for d in jax.devices() if d.id == 3))),
    ("a single-device sharding", lambda x: jax.device_put(x, jax.sharding.SingleDeviceSharding(D3))),
]


verdict, test_a_wrong_answer_fails_and_its_feedback_names_the_mistake, \
    test_a_right_answer_written_another_way_passes = fool_tests(ID, WRONG, RIGHT)



@pytest.mark.parametrize("answer", [jnp.asarray, np.asarray], ids=["default device", "left on the host"])
def test_feedback_names_the_mistake_and_leaves_the_fix_to_hint(answer):
    fb = verdict(answer)
    assert not fb and "device_put" not in fb.message, fb.message
