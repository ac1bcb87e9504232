"""course_lib.sharding: shard/unshard, replicate/unreplicate, pad_batch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from course_lib import sharding

settings.register_profile("course", deadline=None, max_examples=40, derandomize=True)
settings.load_profile("course")


@st.composite
def batches(draw):
    """A pytree of arrays sharing a batch axis B = n * b, and the n to split it for."""
    n = draw(st.integers(1, 8))
    b = draw(st.integers(1, 4))
    trailing = [tuple(draw(st.lists(st.integers(1, 3), max_size=2))) for _ in range(2)]
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    tree = {"x": rng.normal(size=(n * b,) + trailing[0]).astype(np.float32),
            "pair": (rng.integers(0, 10, size=(n * b,) + trailing[1]), np.arange(n * b))}
    return tree, n, b


@given(batches())
def test_shard_then_unshard_is_the_identity(case):
    tree, n, b = case
    sharded = sharding.shard(tree, n)
    for leaf, orig in zip(jax.tree.leaves(sharded), jax.tree.leaves(tree)):
        assert leaf.shape == (n, b) + orig.shape[1:]
        assert isinstance(leaf, np.ndarray), "NumPy in, NumPy out"
        # device i gets rows [i*b, (i+1)*b): the order of the batch is kept
        np.testing.assert_array_equal(leaf[n - 1], orig[(n - 1) * b:])
    back = sharding.unshard(sharded)
    jax.tree.map(np.testing.assert_array_equal, back, tree)


def test_shard_accepts_jax_arrays_and_default_device_count():
    x = jnp.ones((16, 3))
    assert sharding.shard(x).shape == (jax.local_device_count(), 16 // jax.local_device_count(), 3)
    assert isinstance(sharding.shard(x), jax.Array)


def test_shard_indivisible_batch_names_B_n_and_both_fixes():
    with pytest.raises(ValueError) as e:
        sharding.shard({"x": np.zeros((30, 2)), "y": np.zeros((30,))}, 8)
    msg = str(e.value)
    assert "B=30" in msg and "n=8" in msg and "30 = 8 x 3 + 6" in msg
    assert "leaf ['x']" in msg
    assert "drop the remainder (x[:24])" in msg
    assert "pad the batch to 32 rows and mask the padding" in msg and "pad_batch(batch, 8)" in msg


def test_shard_rejects_scalars_and_bad_counts():
    with pytest.raises(ValueError, match="is a scalar; it has no batch axis"):
        sharding.shard({"lr": 0.1}, 2)
    with pytest.raises(ValueError, match="whole number >= 1"):
        sharding.shard(np.zeros(4), 0)


def test_unshard_needs_two_axes():
    with pytest.raises(ValueError, match=r"has shape \(8,\); it needs at least two axes"):
        sharding.unshard(np.zeros(8))


NESTED = [
    {"w": np.ones((3, 2), np.float32), "b": np.zeros(2, np.float32)},
    {"layers": [{"w": np.eye(2, dtype=np.float32)}, {"w": np.full((2, 1), 2.0, np.float32)}], "step": 3},
    (np.float32(1.5), {"deep": {"deeper": (np.arange(4, dtype=np.int32),)}}),
]


@pytest.mark.parametrize("tree", NESTED, ids=["flat", "list_of_layers", "tuple_with_scalar"])
def test_replicate_places_one_copy_per_device_and_unreplicate_reads_it_back(tree, devices):
    rep = sharding.replicate(tree)
    for leaf, orig in zip(jax.tree.leaves(rep), jax.tree.leaves(tree)):
        assert leaf.shape == (len(devices),) + np.shape(orig)
        shards = sorted(leaf.addressable_shards, key=lambda s: s.device.id)
        assert [s.device for s in shards] == devices, "copy i on device i"
        for s in shards:
            assert s.data.shape == (1,) + np.shape(orig)
            np.testing.assert_array_equal(s.data[0], orig)
    back = sharding.unreplicate(rep)
    assert jax.tree.structure(back) == jax.tree.structure(tree)
    for leaf, orig in zip(jax.tree.leaves(back), jax.tree.leaves(tree)):
        np.testing.assert_array_equal(leaf, orig)
        assert leaf.devices() == {devices[0]}, "read from the first device, not gathered"


@given(st.integers(1, 8), st.lists(st.integers(1, 3), max_size=3))
def test_replicate_on_some_devices(n, shape):
    devs = jax.devices()[:n]
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    rep = sharding.replicate({"x": x}, devices=devs)["x"]
    assert rep.shape == (n,) + tuple(shape)
    assert rep.devices() == set(devs)
    np.testing.assert_array_equal(sharding.unreplicate(rep), x)


def test_replicated_params_and_sharded_batch_go_straight_into_pmap(devices):
    params = {"w": jnp.array([1.0, 2.0, 3.0]), "b": jnp.float32(0.5)}
    x = jnp.arange(48.0).reshape(16, 3)
    out = jax.pmap(lambda p, xb: xb @ p["w"] + p["b"])(sharding.replicate(params), sharding.shard(x))
    assert out.shape == (8, 2)
    np.testing.assert_allclose(sharding.unshard(out), x @ params["w"] + 0.5)
    first = sharding.unreplicate(out)
    assert first.devices() == {devices[0]}
    np.testing.assert_allclose(first, (x @ params["w"] + 0.5)[:2])


def test_unreplicate_refuses_an_array_that_is_not_one_copy_per_device(devices):
    split = jax.device_put(jnp.arange(16.0), jax.sharding.NamedSharding(sharding.device_mesh(),
                                                                        jax.sharding.PartitionSpec("devices")))
    with pytest.raises(ValueError, match=r"holds a block of shape \(2,\) of an array of shape \(16,\)"):
        sharding.unreplicate(split)
    with pytest.raises(ValueError, match="got a scalar"):
        sharding.unreplicate(np.float32(1.0))


def test_pad_batch_pads_with_zeros_and_masks_the_padding():
    batch = {"x": np.ones((30, 2), np.float32), "y": np.arange(30)}
    padded, mask = sharding.pad_batch(batch, 8)
    assert padded["x"].shape == (32, 2) and padded["y"].shape == (32,)
    assert isinstance(padded["x"], np.ndarray)
    assert mask.dtype == bool and mask.sum() == 30 and mask[:30].all() and not mask[30:].any()
    assert (padded["x"][30:] == 0).all() and (padded["y"][30:] == 0).all()
    assert sharding.shard(padded, 8)["x"].shape == (8, 4, 2)


def test_pad_batch_of_a_divisible_batch_changes_nothing():
    x = jnp.arange(16.0)
    padded, mask = sharding.pad_batch(x)
    assert padded.shape == (16,) and mask.all()
    assert isinstance(padded, jax.Array)


def test_pad_batch_errors():
    with pytest.raises(ValueError, match="same batch size on axis 0"):
        sharding.pad_batch({"x": np.ones(3), "y": np.ones(4)}, 2)
    with pytest.raises(ValueError, match="the batch is empty"):
        sharding.pad_batch(np.ones((0, 2)), 2)
    with pytest.raises(ValueError, match="no arrays"):
        sharding.pad_batch({}, 2)
