"""Exercise 03.4 (the prediction with jax.smap on a mesh axis): answers that try to fool the checker."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fooling import fool_tests

ID = "03.4"


def smap(f, **kwargs):
    return jax.smap(f, **{"in_axes": (0, None), "out_axes": 0, "axis_name": "i", **kwargs})


def matmul(xb, w):
    return xb @ w


def not_placed(x, w, mesh):
    with jax.set_mesh(mesh):
        return smap(matmul)(x, w)


def w_mapped(x, w, mesh):
    with jax.set_mesh(mesh):
        return smap(matmul, in_axes=0)(jax.device_put(x, P("i")), w)


def own_mesh(x, w, mesh):
    mine = jax.make_mesh((len(jax.devices()),), ("i",))
    with jax.set_mesh(mine):
        return smap(matmul)(jax.device_put(x, P("i")), w)


def out_axes_none(x, w, mesh):
    with jax.set_mesh(mesh):
        return smap(matmul, out_axes=None)(jax.device_put(x, P("i")), w)


def with_pmap(x, w, mesh):
    n = mesh.devices.size
    out = jax.pmap(matmul, in_axes=(0, None), devices=list(mesh.devices.flat))(x.reshape(n, -1, x.shape[1]), w)
    rows = np.asarray(out).reshape(x.shape[0], -1)
    with jax.set_mesh(mesh):
        return jax.device_put(rows, P("i"))


def sharded_jit(x, w, mesh):
    with jax.set_mesh(mesh):
        return jax.jit(lambda a, b: a @ b)(jax.device_put(x, P("i")), w)


def w_split_and_gathered(x, w, mesh):
    with jax.set_mesh(mesh):
        xs = jax.device_put(x, P("i"))
        ws = jax.device_put(w, P(None, None))
        return smap(lambda xb, wb: xb @ jax.lax.all_gather(wb, "i", tiled=True)[:w.shape[0]],
                    in_axes=(0, 0))(xs, jax.device_put(jnp.tile(w, (mesh.devices.size, 1)), P("i")))


_ONCE = {}


def built_once(x, w, mesh):
    if "f" not in _ONCE:
        _ONCE["f"] = jax.jit(smap(matmul))
    with jax.set_mesh(mesh):
        return _ONCE["f"](jax.device_put(x, P("i")), w)


def pmap_numpy_devices(x, w, mesh):
    n = mesh.devices.size
    return jax.pmap(lambda xb: xb @ w, devices=mesh.devices.flat[:])(x.reshape(n, -1, x.shape[1])).reshape(
        x.shape[0], -1)


def reshaped_pmap_style(x, w, mesh):
    with jax.set_mesh(mesh):
        y = smap(matmul)(jax.device_put(x, P("i")), w)
        return y.reshape(mesh.devices.size, -1, w.shape[1])


def joined_along_1(x, w, mesh):
    with jax.set_mesh(mesh):
        return smap(matmul, out_axes=1)(jax.device_put(x, P("i")), w)


WRONG = [
    ("pmap with a NumPy array of devices", pmap_numpy_devices, "That is NumPy refusing"),
    ("reshaped to a device axis", reshaped_pmap_style, "blocks keep their rank"),
    ("blocks joined along axis 1", joined_along_1, "joined along axis 1"),
    ("input not placed", not_placed, "smap does not move an input for you"),
    ("weight mapped", w_mapped, "along an axis that count does not divide"),
    ("no mesh context", lambda x, w, mesh: smap(matmul)(jax.device_put(x, P("i")), w), "ran with no mesh in context"),
    ("a mesh of its own", own_mesh, "Its values are right in the other case; wrong also in"),
    ("out_axes=None", out_axes_none, "each device holds a different block of rows"),
    ("pmap, then placed", with_pmap, "shard_maps ran over other meshes"),
    ("sharded jit, no smap", sharded_jit, "no shard_map ran at all"),
    ("weight split and gathered", w_split_and_gathered, "and w reaches every device whole"),
    ("smap built once, for the first mesh", built_once, "keeps the mesh of its first call"),
]
RIGHT = [
    ("weight closed over", lambda x, w, mesh: _closed(x, w, mesh)),
    ("in_axes inferred, under jit", lambda x, w, mesh: _inferred(x, w, mesh)),
]


def _closed(x, w, mesh):
    with jax.set_mesh(mesh):
        return jax.smap(lambda xb: xb @ w, in_axes=0, out_axes=0, axis_name="i")(jax.device_put(x, P("i")))


def _inferred(x, w, mesh):
    with jax.set_mesh(mesh):
        return jax.jit(jax.smap(lambda xb: xb @ w, out_axes=0, axis_name="i"))(jax.device_put(x, P("i")))

verdict, test_a_wrong_answer_fails_and_its_feedback_names_the_mistake, \
    test_a_right_answer_written_another_way_passes = fool_tests(ID, WRONG, RIGHT)
