"""Lesson 07 exercises: porting pmap code to shard_map."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from . import Mismatch, as_array, call, exercise, expect_array, primitives
from .lesson06 import AXIS, _mesh, _spec


# ----------------------------------------------------------------------------------------------
# 07.1 Port a pmap function to shard_map


def pmap_version(x, w):
    """The lesson's pmap code: x (n, b, d) one block per device, w (d, k) broadcast -> (n, b, k)."""
    return jax.pmap(lambda xb, wb: jnp.tanh(xb @ wb), in_axes=(0, None))(x, w)


def solution_ported(x, w, mesh):
    def block(xb, wb):                 # xb: this device's rows (B // n, d); wb: all of w
        return jnp.tanh(xb @ wb)

    return jax.shard_map(block, mesh=mesh, in_specs=(P("i"), P()), out_specs=P("i"))(x, w)


@exercise("07.1", "Port a pmap function to shard_map", solution=solution_ported,
          returns="a jax.Array of shape (B, k), tanh(x @ w), split by rows over the mesh axis 'i' (P('i'))",
          hints=["pmap's in_axes=(0, None) becomes in_specs: x split over 'i', w whole on every device; the "
                 "output is split like x. No reshape to (n, b, ...): shard_map works on the global shapes.",
                 "jax.shard_map(block, mesh=mesh, in_specs=(P('i'), P()), out_specs=P('i'))(x, w), where "
                 "block(xb, wb) returns jnp.tanh(xb @ wb) for this device's rows."])
def check_ported(ported):
    rng = np.random.default_rng(6)
    for n, b, d, k in [(len(jax.devices()), 2, 3, 4), (4, 3, 2, 2)]:
        mesh = _mesh(n)
        x = jax.device_put(rng.normal(size=(n * b, d)).astype(np.float32), NamedSharding(mesh, P(AXIS)))
        w = jax.device_put(rng.normal(size=(d, k)).astype(np.float32), NamedSharding(mesh, P()))
        got = call(ported, x, w, mesh, name="ported", hints={
            "can't be statically inferred": "The output differs from device to device: out_specs P('i') stacks "
                                            "the blocks; P() would claim they are all the same.",
            "does not match the specs of the input": "in_specs must match how the inputs are placed: x split "
                                                     "P('i'), w replicated P().",
        })
        what = f"ported(x {x.shape}, w {w.shape}) on {n} devices"
        as_array(got, what=what, expected_shape=(n * b, k))
        expect_array(got, np.tanh(np.asarray(x) @ np.asarray(w)), what=what, rtol=1e-5)
        if not isinstance(got, jax.Array) or _spec(got) is None or tuple(_spec(got))[:1] != (AXIS,):
            raise Mismatch(f"{what} has sharding {_spec(got)}; expected the rows split over 'i' (P('i')), as the "
                           "input was.")
        eqns = primitives(lambda a, c: ported(a, c, mesh), x, w, name="ported")
        if not any(e.primitive.name == "shard_map" for e in eqns):
            raise Mismatch(f"{what} has the right values but does not use jax.shard_map.")
    return "the same program as the pmap version, written for a mesh, with no reshape to (n, b, ...)."
