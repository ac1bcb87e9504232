"""Exercise 06.1 (replicate the parameters, split the batch): wrong answers fail with feedback naming their
mistake; right answers written differently pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from course_lib import sharding
from course_lib.exercises import check


def _put(params_spec, batch_spec, mesh=None):
    def place(params, batch, m):
        m = mesh or m
        return jax.device_put(params, NamedSharding(m, params_spec)), jax.device_put(batch, NamedSharding(m, batch_spec))
    return place


WRONG = {
    "parameters split too": (_put(P("i"), P("i")), ["split a parameter of shape", "stay whole"]),
    "batch replicated": (_put(P(), P()), ["every device holds the whole batch"]),
    "batch split along axis 1": (lambda p, b, m: (jax.device_put(p, NamedSharding(m, P())),
                                                  jax.tree.map(lambda v: jax.device_put(
                                                      v, NamedSharding(m, P(None, "i") if v.ndim > 1 else P("i"))),
                                                      b)), ["along axis 1 over 'i'", "axis 0, its rows"]),
    "stacked copies (pmap style)": (lambda p, b, m: (sharding.replicate(p, devices=list(m.devices.flat)),
                                                     jax.device_put(b, NamedSharding(m, P("i")))),
                                    ["stacked copy per device is the pmap way"]),
    "left on the host": (lambda p, b, m: (p, b), ["got params['b'] on the host", "still on the host"]),
    "swapped order": (lambda p, b, m: _put(P(), P("i"))(p, b, m)[::-1], ["the batch first"]),
    "an 8-device mesh of its own": (_put(P(), P("i"), mesh=jax.make_mesh((8,), ("i",))),
                                    ["the mesh you were given"]),
    "its own Mesh of all devices": (_put(P(), P("i"), mesh=jax.sharding.Mesh(np.array(jax.devices()), ("i",))),
                                    ["devices [0, 1, 2, 3, 4, 5, 6, 7]; the mesh given: ('i',), [5, 2, 6, 1, 3, 4, 0, "
                                     "7]", "On a mesh of 4 devices, it raised: it "
                                     "split an array over 8 devices, and the mesh given has 4: build the "
                                     "NamedSharding on the mesh you were given"]),
    "one device only": (lambda p, b, m: (jax.device_put(p, jax.devices()[0]), _put(P(), P("i"))(p, b, m)[1]),
                        ["every device of the mesh needs the whole array"]),
    "the lesson's axis name": (_put(P(), P("data")), ["names its axis 'i'"]),
    "a cast to float32": (lambda p, b, m: _put(P(), P("i"))(p, jax.tree.map(lambda v: v.astype(np.float32), b), m),
                          ["came back as float32", "no cast"]),
    "parameters cast to float32": (lambda p, b, m: _put(P(), P("i"))(jax.tree.map(lambda v: v.astype(np.float32), p),
                                                                     b, m), ["came back as float32", "bfloat16"]),
    "a bare spec, no mesh": (lambda p, b, m: (jax.device_put(p, P()), jax.device_put(b, P("i"))),
                             ["pair it with the mesh you were given"]),
}


@pytest.mark.parametrize("name", WRONG)
def test_wrong_answer_is_named(name):
    answer, fragments = WRONG[name]
    fb = check("06.1", answer)
    assert not fb, name
    for fragment in fragments:
        assert fragment in fb.message, (name, fb.message)


def _per_leaf(params, batch, mesh):
    whole, rows = NamedSharding(mesh, jax.P()), NamedSharding(mesh, jax.P("i"))
    return (jax.tree.map(lambda v: jax.device_put(v, whole), params),
            jax.tree.map(lambda v: jax.device_put(jnp.asarray(v), rows), batch))


def _in_context(params, batch, mesh):
    with jax.set_mesh(mesh):
        return jax.device_put(params, P(None)), jax.device_put(batch, P("i"))


RIGHT = {"per leaf, jax.P": _per_leaf, "bare specs inside jax.set_mesh": _in_context,
         "reshard": lambda p, b, m: (jax.reshard(p, NamedSharding(m, P())), jax.reshard(b, NamedSharding(m, P("i"))))}


@pytest.mark.parametrize("name", RIGHT)
def test_right_answer_passes(name):
    fb = check("06.1", RIGHT[name])
    assert fb, (name, fb.message)
