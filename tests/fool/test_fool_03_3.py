"""Exercise 03.3 (put the device axis last with out_axes): answers that try to fool the checker."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fooling import fool_tests

ID = "03.3"

WRONG = [
    ("out_axes=-1", lambda xs: jax.pmap(lambda r: 2.0 * r, out_axes=-1)(xs), "a negative out_axes"),
    ("transposed afterwards", lambda xs: jax.pmap(lambda r: 2.0 * r)(xs).T, "the axes were swapped afterwards"),
    ("swapaxes afterwards", lambda xs: jnp.swapaxes(jax.pmap(lambda r: 2.0 * r)(xs), 0, 1),
     "the axes were swapped afterwards"),
    ("device axis still first", lambda xs: jax.pmap(lambda r: 2.0 * r)(xs), "Row i holds 2 * xs[i]: the result keeps xs's layout"),
    ("mapped over axis 1 too", lambda xs: jax.pmap(lambda c: 2.0 * c, in_axes=1, out_axes=1)(xs),
     "Row i holds 2 * xs[i]: the result keeps xs's layout, (n, b); expected (b, n)"),
    ("vmap", lambda xs: jax.vmap(lambda r: 2.0 * r, out_axes=1)(xs), "lives on one device"),
    ("not doubled", lambda xs: jax.pmap(lambda r: r, out_axes=1)(xs), "2x too small"),
    ("reshaped, not moved", lambda xs: jax.pmap(lambda r: 2.0 * r)(xs).reshape(xs.shape[1], xs.shape[0]),
     "a reshape of the (n, b) result"),
    ("no pmap", lambda xs: 2.0 * xs.T, "lives on one device"),
    ("half precision", lambda xs: jax.pmap(lambda r: (2.0 * r).astype(jnp.float16), out_axes=1)(xs),
     "dtype float16"),
]
RIGHT = [
    ("r + r", lambda xs: jax.pmap(lambda r: r + r, out_axes=1)(xs)),
    ("in_axes and out_axes spelled out", lambda xs: jax.pmap(lambda r: r * 2, in_axes=0, out_axes=1)(xs)),
]

verdict, test_a_wrong_answer_fails_and_its_feedback_names_the_mistake, \
    test_a_right_answer_written_another_way_passes = fool_tests(ID, WRONG, RIGHT)
