"""Lesson 13's training step compiled for a TPU pod that is not here: the TPU compiler (``libtpu``) builds the
program for a compile-only topology (``"v5e:4x4"``) on any Linux x86-64 machine, and its ``memory_analysis``
says what a chip holds.

    missing = tpu_compiler_missing()          # None, or why libtpu cannot be used here
    measure_state_bytes(tuple(sorted(config.items())), "v5e:2x4", fsdp=True)   # bytes per chip: params + Adam
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

AXIS = "data"
BATCH_PER_CHIP = 2


@contextlib.contextmanager
def _quiet_stderr():
    """libtpu writes start-up messages to file descriptor 2: keep them out of the learner's notebook."""
    with tempfile.TemporaryFile(mode="w+") as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def tpu_compiler_missing() -> str | None:
    """None when the TPU compiler (libtpu) can be used here; otherwise why not."""
    try:
        import libtpu  # noqa: F401
    except ImportError:
        return "libtpu is not installed here (it has wheels for Linux x86-64 only)"
    return None


def install_hint() -> str:
    """How to install the TPU compiler: the set-up check's own advice where the course has it."""
    try:
        from .setup_check import tpu_compiler_hint
        return str(tpu_compiler_hint())
    except (ImportError, AttributeError):
        return "To install it: ./course.sh tpu (or pip install libtpu on Linux x86-64)."


@functools.cache
def _topology(name: str):
    from jax.experimental import topologies
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")     # a notebook and a test run may both compile
    with _quiet_stderr():
        return topologies.get_topology_desc(name, platform="tpu")


def _init_params(c):
    D, MLP, L, V = c["D"], c["MLP"], c["LAYERS"], c["VOCAB"]
    z = lambda *shape: jnp.zeros(shape, jnp.float32)
    return {"embed": z(V, D), "pos": z(c["SEQ"], D),
            "layers": {"wqkv": z(L, D, 3 * D), "wo": z(L, D, D), "w1": z(L, D, MLP), "w2": z(L, MLP, D),
                       "norm1": z(L, D), "norm2": z(L, D)},
            "norm": z(D), "unembed": z(D, V)}


def _rms_norm(h, scale):
    return h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6) * scale


def _loss(c, fsdp):
    heads = c["HEADS"]

    def block(h, p):
        B, T, D = h.shape
        q, k, v = jnp.split(_rms_norm(h, p["norm1"]) @ p["wqkv"], 3, axis=-1)
        q, k, v = (a.reshape(B, T, heads, D // heads) for a in (q, k, v))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / (D // heads) ** 0.5
        scores = jnp.where(jnp.tril(jnp.ones((T, T), bool)), scores, -1e9)
        attended = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v).reshape(B, T, D)
        h = h + attended @ p["wo"]
        return h + jax.nn.gelu(_rms_norm(h, p["norm2"]) @ p["w1"]) @ p["w2"]

    def one_layer(h, layer):
        if fsdp:
            layer = jax.tree.map(lambda w: jax.reshard(w, P()), layer)
        return block(h, layer), None

    def loss_fn(params, x, y):
        h = params["embed"].at[x].get(out_sharding=jax.typeof(x).sharding) + params["pos"][: x.shape[1]]
        h, _ = jax.lax.scan(jax.checkpoint(one_layer), h, params["layers"])
        logits = _rms_norm(h, params["norm"]) @ params["unembed"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    return loss_fn


@functools.cache
def measure_state_bytes(config: tuple, topology: str, fsdp: bool) -> int:
    """Bytes per chip of (params, Adam state) in lesson 13's compiled step for ``topology`` ("v5e:2x4").

    ``config`` is ``tuple(sorted(dict.items()))``. Read from ``memory_analysis().argument_size_in_bytes`` of the
    TPU compiler's program, less the batch (two int32 arrays of BATCH_PER_CHIP sequences per chip).
    """
    c = dict(config)
    devices = _topology(topology).devices
    mesh = jax.make_mesh((len(devices),), (AXIS,), devices=devices)
    optimizer = optax.adam(1e-3)
    layer_spec = P(None, AXIS) if fsdp else P()
    shapes = jax.eval_shape(lambda: _init_params(c))

    def place(path, s):
        spec = layer_spec if "layers" in jax.tree_util.keystr(path) else P()
        return jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=NamedSharding(mesh, spec))

    loss_fn = _loss(c, fsdp)

    def update(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    batch = BATCH_PER_CHIP * len(devices)
    with jax.set_mesh(mesh):
        params = jax.tree_util.tree_map_with_path(place, shapes)
        opt_state = jax.eval_shape(optimizer.init, params)
        tokens = jax.ShapeDtypeStruct((batch, c["SEQ"]), jnp.int32, sharding=NamedSharding(mesh, P(AXIS)))
        lowered = jax.jit(update, donate_argnums=(0, 1)).lower(params, opt_state, tokens, tokens)
    with _quiet_stderr():
        compiled = lowered.compile()
    batch_bytes = 2 * BATCH_PER_CHIP * c["SEQ"] * 4
    return int(compiled.memory_analysis().argument_size_in_bytes) - batch_bytes
