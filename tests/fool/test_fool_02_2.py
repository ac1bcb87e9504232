"""Exercise 02.2 (per-device sums of squares with pmap): answers that try to fool the checker."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fooling import fool_tests

ID = "02.2"


def spread(values):
    mesh = Mesh(np.array(jax.devices()[:values.shape[0]]), ("d",))
    return jax.device_put(values, NamedSharding(mesh, P("d")))


WRONG = [
    ("first axis only", jax.pmap(lambda b: jnp.sum(b ** 2, axis=0)), "Each device summed only its block's first "
                                                                       "axis (one sum per column)"),
    ("square root", jax.pmap(lambda b: jnp.sqrt(jnp.sum(b ** 2))), "That is the square root of each block's sum "
                                                                    "of squares"),
    ("last axis only", jax.pmap(lambda b: jnp.sum(b ** 2, axis=-1)), "whole block"),
    ("vmap", jax.vmap(lambda b: jnp.sum(b ** 2)), "lives on one device"),
    ("one total", lambda xs: jnp.sum(xs ** 2), "one number where shape (8,) was expected"),
    ("no square", jax.pmap(jnp.sum), "That is each block's plain sum: the values were not squared"),
    ("mean of squares", jax.pmap(lambda b: jnp.mean(b ** 2)), "mean of the squares"),
    ("square of the sum", jax.pmap(lambda b: jnp.sum(b) ** 2), "the square of each block's sum"),
    ("half the sum after pmap", lambda xs: jax.pmap(lambda b: jnp.sum(b ** 2, axis=-1))(xs).sum(axis=1),
     "part of each block's sum ran after pmap"),
    ("copied to the host", lambda xs: np.asarray(jax.pmap(lambda b: jnp.sum(b ** 2))(xs)), "should be a jax.Array"),
    ("placed another way", lambda xs: spread(jnp.sum(xs ** 2, axis=(1, 2))), "its program has no jax.pmap"),
    ("half precision", jax.pmap(lambda b: jnp.sum(b.astype(jnp.float16) ** 2)), "dtype float16"),
]
RIGHT = [
    ("b * b", lambda xs: jax.pmap(lambda b: (b * b).sum())(xs)),
    ("vdot", lambda xs: jax.pmap(lambda b: jnp.vdot(b, b))(xs)),
]

verdict, test_a_wrong_answer_fails_and_its_feedback_names_the_mistake, \
    test_a_right_answer_written_another_way_passes = fool_tests(ID, WRONG, RIGHT)
