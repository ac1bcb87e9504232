"""Exercise 03.2 (broadcast the parameters, map the batch): answers that try to fool the checker."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fooling import fool_tests
from course_lib import sharding

ID = "03.2"


def block(q, x):
    return x @ q["w"] + q["b"]


def stacked(p, xs):
    n = xs.shape[0]
    return jax.pmap(block)(jax.tree.map(lambda v: jnp.broadcast_to(v, (n,) + v.shape), p), xs)


WRONG = [
    ("parameters mapped", lambda p, xs: jax.pmap(block)(p, xs), "were the parameters mapped?"),
    ("copies stacked by hand", stacked, "the parameters were mapped over the devices"),
    ("course_lib's stacked copies", lambda p, xs: jax.pmap(block)(
        sharding.replicate(p, jax.devices()[:xs.shape[0]]), xs), "the parameters were mapped over the devices"),
    ("bias left out", lambda p, xs: jax.pmap(lambda q, x: x @ q["w"], in_axes=(None, 0))(p, xs),
     "the bias b is missing"),
    ("vmap", lambda p, xs: jax.vmap(block, in_axes=(None, 0))(p, xs), "lives on one device"),
    ("no pmap", lambda p, xs: xs @ p["w"] + p["b"], "lives on one device"),
    ("bias mapped", lambda p, xs: jax.pmap(block, in_axes=({"w": None, "b": 0}, 0))(p, xs),
     "raised"),
    ("predictions transposed", lambda p, xs: jax.pmap(lambda q, x: q["w"].T @ x.T + q["b"][:, None],
                                                      in_axes=(None, 0))(p, xs), "predictions transposed"),
    ("weight transposed", lambda p, xs: jax.pmap(lambda q, x: (q["w"].T @ x.T).T + q["b"], in_axes=(None, 0))(p, xs)
     if p["w"].shape[0] == p["w"].shape[1] else jax.pmap(block, in_axes=(None, 0))(
        jax.tree.map(lambda v: v * 1.01, p), xs), "the largest difference is 1% of the largest value"),
]
RIGHT = [
    ("None for the whole pytree", lambda p, xs: jax.pmap(block, in_axes=(None, 0))(p, xs)),
    ("placed once on every device", lambda p, xs: jax.pmap(block, in_axes=(None, 0))(
        sharding.replicate_on_mesh(p, sharding.device_mesh(jax.devices()[:xs.shape[0]])), xs)),
]

verdict, test_a_wrong_answer_fails_and_its_feedback_names_the_mistake, \
    test_a_right_answer_written_another_way_passes = fool_tests(ID, WRONG, RIGHT)
