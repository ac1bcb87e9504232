"""Exercise 01.2 (batch a per-example function with vmap): answers that try to fool the checker."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fooling import fool_tests

ID = "01.2"


def norm(v):
    return jnp.sqrt(jnp.sum(v ** 2))


WRONG = [
    ("norm over axis 1, no vmap", lambda x: jnp.linalg.norm(x, axis=1), "no jax.vmap ran"),
    ("a Python loop over rows", lambda x: jnp.stack([norm(r) for r in x]), "no jax.vmap ran"),
    ("mapped over the columns", lambda x: jax.vmap(norm, in_axes=1)(x), "one value per column"),
    ("the whole batch's norm", lambda x: norm(x), "one number, the norm of the whole batch"),
    ("pmap instead of vmap", lambda x: jax.pmap(norm)(x), "that is jax.pmap's answer"),
    ("no square root", lambda x: jax.vmap(lambda v: jnp.sum(v ** 2))(x), "the square root is missing"),
    ("half precision", lambda x: jax.vmap(norm)(x.astype(jnp.float16)), "dtype float16"),
    ("absolute values summed", lambda x: jax.vmap(lambda v: jnp.sum(jnp.abs(v)))(x), "values differ"),
]
RIGHT = [
    ("vmap of jnp.linalg.norm", lambda x: jax.vmap(jnp.linalg.norm)(x)),
    ("vmap of a dot product", lambda x: jax.vmap(lambda v: jnp.sqrt(v @ v))(x)),
]


verdict, test_a_wrong_answer_fails_and_its_feedback_names_the_mistake, \
    test_a_right_answer_written_another_way_passes = fool_tests(ID, WRONG, RIGHT)

