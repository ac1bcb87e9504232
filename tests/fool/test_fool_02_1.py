"""Exercise 02.1 (reshape a batch for pmap): answers that try to fool the checker."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fooling import fool_tests

ID = "02.1"

WRONG = [
    ("one trailing axis kept", lambda x, n: x.reshape(n, -1, x.shape[-1]), "the expected values in another shape"),
    ("trailing axes flattened", lambda x, n: x.reshape(n, x.shape[0] // n, -1), "where (4, 3, 2, 2) was expected: the expected values in another shape"),
    ("device axis second", lambda x, n: x.reshape((x.shape[0] // n, n) + x.shape[1:]), "The device axis"),
    ("rows interleaved", lambda x, n: x.reshape((x.shape[0] // n, n) + x.shape[1:]).swapaxes(0, 1),
     "the rows were interleaved"),
    ("B / n", lambda x, n: x.reshape((n, x.shape[0] / n) + x.shape[1:]), "B / n is a float"),
    ("half precision", lambda x, n: x.reshape((n, -1) + x.shape[1:]).astype(np.float16), "dtype float16"),
    ("cast to float32", lambda x, n: x.reshape((n, -1) + x.shape[1:]).astype(np.float32), "dtype float32 where int32 was expected"),
    ("every device JAX has", lambda x, n: x.reshape((len(jax.devices()), -1) + x.shape[1:]), "raised ValueError: cannot reshape"),
]
RIGHT = [
    ("np.split, then stack", lambda x, n: np.stack(np.split(x, n))),
    ("jnp.reshape with -1", lambda x, n: jnp.reshape(x, (n, -1) + x.shape[1:])),
]

verdict, test_a_wrong_answer_fails_and_its_feedback_names_the_mistake, \
    test_a_right_answer_written_another_way_passes = fool_tests(ID, WRONG, RIGHT)
