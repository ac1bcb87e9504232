"""Lesson 07 checkers: the reference passes; typical mistakes get feedback that names them."""

import jax
import numpy as np
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


def test_07_1_raises_or_wrong_structure():
    fb = check("07.1", lambda x, w, m: jax.shard_map(lambda a, c: jnp.tanh(a @ c), mesh=m, in_specs=(P("j"), P()),
                                                     out_specs=P("i"))(x, w))
    assert not fb and "ported(Array float32[16, 3], Array float32[3, 4], Mesh) raised" in fb.message
    fb = check("07.1", lambda x, w, m: (solution_ported(x, w, m), m))
    assert not fb and "should be an array of shape (16, 4), got tuple(Array float32[16, 4], Mesh)" in fb.message
    fb = check("07.1", lambda x, w, m: jnp.tanh(jnp.asarray(np.asarray(x) @ np.asarray(w))).reshape(
        m.devices.size, -1, w.shape[1]))
    assert not fb and "has shape (8, 2, 4); expected (16, 4)" in fb.message
