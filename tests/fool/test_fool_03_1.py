"""Exercise 03.1 (scale a batch by a shared scalar on 2 devices): answers that try to fool the checker."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fooling import fool_tests
from course_lib import sharding

ID = "03.1"
TWO = jax.devices()[:2]


def blocks(x):
    return x.reshape(2, -1, *x.shape[1:])


WRONG = [
    ("scalar mapped", lambda x, s: jax.pmap(lambda a, f: a * f, devices=TWO)(blocks(x), s), "A scalar was mapped"),
    ("no reshape", lambda x, s: jax.pmap(lambda a, f: a * f, in_axes=(0, None), devices=TWO)(x, s),
     "more slices than devices"),
    ("not reshaped back", lambda x, s: jax.pmap(lambda a, f: a * f, in_axes=(0, None), devices=TWO)(blocks(x), s),
     "the per-device blocks as pmap stacks them"),
    ("no pmap", lambda x, s: x * s, "lives on one device"),
    ("device numbers", lambda x, s: jax.pmap(lambda a, f: a * f, in_axes=(0, None), devices=[0, 1])(
        blocks(x), s).reshape(x.shape), "takes Device objects"),
    ("scalar by keyword", lambda x, s: jax.pmap(lambda a, f: a * f, in_axes=(0,), devices=TWO)(
        blocks(x), f=s).reshape(x.shape), "an argument passed by keyword always"),
    ("scalar stacked per device", lambda x, s: jax.pmap(lambda a, f: a * f, devices=TWO)(
        blocks(x), jnp.full((2,), s)).reshape(x.shape), "the scalar was mapped too"),
    ("the wrong two devices", lambda x, s: jax.pmap(lambda a, f: a * f, in_axes=(0, None), devices=jax.devices()[2:4])(
        blocks(x), s).reshape(x.shape), "expected the 2 devices with ids [0, 1]"),
    ("the two devices reversed", lambda x, s: jax.pmap(lambda a, f: a * f, in_axes=(0, None), devices=TWO[::-1])(
        blocks(x), s).reshape(x.shape), "lives on devices [1, 0], in block order"),
    ("interleaved, never put back", lambda x, s: jax.pmap(lambda a, f: a * f, in_axes=(0, None), devices=TWO)(
        x.reshape(-1, 2, *x.shape[1:]).swapaxes(0, 1), s).reshape(x.shape), "never put back in order"),
    ("the scalar fixed", lambda x, s: jax.pmap(lambda a: a * 2.0, devices=TWO)(blocks(x)).reshape(x.shape),
     "Its values are right in the other case"),
    ("scaled before an identity pmap", lambda x, s: jax.pmap(lambda a: a, devices=TWO)(blocks(x * s)).reshape(
        x.shape), "no multiplication runs inside its pmap"),
]
RIGHT = [
    ("course_lib's shard and unshard", lambda x, s: sharding.unshard(jax.pmap(
        lambda a, f: a * f, in_axes=(0, None), devices=TWO)(sharding.shard(x, 2), s))),
    ("the scalar a static argument", lambda x, s: jax.pmap(lambda a, f: a * f, static_broadcasted_argnums=1,
                                                             devices=TWO)(blocks(x), s).reshape(x.shape)),
    ("the scalar closed over", lambda x, s: jax.pmap(lambda a: a * s, devices=TWO)(blocks(x)).reshape(x.shape)),
]

verdict, test_a_wrong_answer_fails_and_its_feedback_names_the_mistake, \
    test_a_right_answer_written_another_way_passes = fool_tests(ID, WRONG, RIGHT)
