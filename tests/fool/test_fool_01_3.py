"""Exercise 01.3 (the same function on every device, with pmap): answers that try to fool the checker."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fooling import fool_tests

ID = "01.3"


def norm(v):
    return jnp.sqrt(jnp.sum(v ** 2))


def spread(values):
    mesh = Mesh(np.array(jax.devices()[:values.shape[0]]), ("d",))
    return jax.device_put(values, NamedSharding(mesh, P("d")))


WRONG = [
    ("vmap", lambda x: jax.vmap(norm)(x), "lives on one device"),
    ("pmap, then gathered", lambda x: jax.device_put(jax.pmap(norm)(x), jax.devices()[0]), "lives on one device"),
    ("no square root", lambda x: jax.pmap(lambda v: jnp.sum(v ** 2))(x), "the square root is missing"),
    ("placed another way", lambda x: spread(jnp.linalg.norm(x, axis=1)), "its program has no jax.pmap"),
    ("copied to the host", lambda x: np.asarray(jax.pmap(norm)(x)), "should be a jax.Array"),
    ("half precision", lambda x: jax.pmap(norm)(x.astype(jnp.float16)), "dtype float16"),
    ("mapped over the columns", lambda x: jax.pmap(norm, in_axes=1)(x), "one value per column"),
    ("one device short", lambda x: jax.pmap(norm, devices=jax.devices()[1:len(x) + 1])(x), "count of devices other"),
]
RIGHT = [
    ("pmap of jnp.linalg.norm", lambda x: jax.pmap(jnp.linalg.norm)(x)),
    ("pmap of a dot product", lambda x: jax.pmap(lambda v: jnp.sqrt(jnp.dot(v, v)))(x)),
]


verdict, test_a_wrong_answer_fails_and_its_feedback_names_the_mistake, \
    test_a_right_answer_written_another_way_passes = fool_tests(ID, WRONG, RIGHT)

