"""Lesson 07 checkers: the reference passes; typical mistakes get feedback that names them."""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from course_lib.exercises import check
from course_lib.exercises.lesson07 import solution_ported


def test_07_1_ported():
    assert check("07.1", solution_ported)
    wrong_out = check("07.1", lambda x, w, m: jax.shard_map(lambda a, c: jnp.tanh(a @ c), mesh=m,
                                                            in_specs=(P("i"), P()), out_specs=P())(x, w))
    assert "P() would claim they are all the same" in wrong_out.message
    no_shard_map = check("07.1", lambda x, w, m: jnp.tanh(x @ w))
    assert "does not use jax.shard_map" in no_shard_map.message
    wrong_in = check("07.1", lambda x, w, m: jax.shard_map(lambda a, c: jnp.tanh(a @ c), mesh=m,
                                                           in_specs=(P(), P()), out_specs=P("i"))(x, w))
    assert "in_specs must match how the inputs are placed" in wrong_in.message
