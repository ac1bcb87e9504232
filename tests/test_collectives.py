"""course_lib.collectives: each NumPy reference agrees with the real JAX collective on 8 simulated devices."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from course_lib import collectives as C

N = 8
DTYPES = [np.float32, np.int32]


def run(collective, xs, **params):
    """Run ``collective(x, "i", **params)`` on every device with pmap; per-device results stacked."""
    return np.asarray(jax.pmap(lambda x: collective(x, "i", **params), axis_name="i")(xs))


@st.composite
def per_device(draw, min_dims=0, max_dims=3, dims=None):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=min_dims, max_size=max_dims))) if dims is None else dims
    dtype = draw(st.sampled_from(DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    values = rng.integers(-50, 50, size=(N,) + shape) if dtype == np.int32 else rng.normal(size=(N,) + shape)
    return values.astype(dtype)


settings.register_profile("collectives", deadline=None, max_examples=12, derandomize=True)


@settings(settings.get_profile("collectives"))
@given(per_device(), st.sampled_from(["psum", "pmax", "pmin"]))
def test_reductions(xs, name):
    np.testing.assert_allclose(run(getattr(jax.lax, name), xs), getattr(C, name)(xs), rtol=1e-5, atol=1e-5)


@settings(settings.get_profile("collectives"))
@given(per_device())
def test_pmean(xs):
    xs = xs.astype(np.float32)
    np.testing.assert_allclose(run(jax.lax.pmean, xs), C.pmean(xs), rtol=1e-5, atol=1e-6)


@settings(settings.get_profile("collectives"))
@given(per_device(min_dims=1), st.booleans(), st.data())
def test_all_gather(xs, tiled, data):
    axis = data.draw(st.integers(0, xs.ndim - 2 if tiled else xs.ndim - 1))  # per-device ndim is xs.ndim - 1
    np.testing.assert_array_equal(run(jax.lax.all_gather, xs, axis=axis, tiled=tiled), C.all_gather(xs, axis, tiled))


@settings(settings.get_profile("collectives"))
@given(per_device(dims=(N, 3)), st.integers(0, 1))
def test_psum_scatter(xs, dim):
    if dim == 1:
        xs = np.swapaxes(xs, 1, 2).copy()  # put the size-N axis second
    np.testing.assert_allclose(run(jax.lax.psum_scatter, xs, scatter_dimension=dim), C.psum_scatter(xs, dim),
                               rtol=1e-5, atol=1e-5)


@settings(settings.get_profile("collectives"))
@given(per_device(dims=(2 * N, 2)))
def test_psum_scatter_tiled(xs):
    np.testing.assert_allclose(run(jax.lax.psum_scatter, xs, tiled=True), C.psum_scatter(xs, tiled=True),
                               rtol=1e-5, atol=1e-5)


@settings(settings.get_profile("collectives"))
@given(per_device(), st.permutations(range(N)), st.integers(0, N))
def test_ppermute(xs, targets, k):
    perm = [(i, targets[i]) for i in range(k)]  # the first k devices send; the others receive zeros
    np.testing.assert_array_equal(run(jax.lax.ppermute, xs, perm=perm), C.ppermute(xs, perm))


@pytest.mark.parametrize("shift", [1, -1, 3])
def test_ring_shift(shift):
    xs = np.arange(N * 2, dtype=np.float32).reshape(N, 2)
    perm = C.ring_permutation(N, shift)
    out = C.ppermute(xs, perm)
    np.testing.assert_array_equal(out, np.roll(xs, shift, axis=0))
    np.testing.assert_array_equal(run(jax.lax.ppermute, xs, perm=perm), out)


@settings(settings.get_profile("collectives"))
@given(per_device(dims=(N, 3)), st.integers(0, 1))
def test_all_to_all(xs, concat_axis):
    np.testing.assert_array_equal(run(jax.lax.all_to_all, xs, split_axis=0, concat_axis=concat_axis),
                                  C.all_to_all(xs, 0, concat_axis))


@settings(settings.get_profile("collectives"))
@given(per_device(dims=(3, 2 * N)), st.integers(0, 1))
def test_all_to_all_tiled(xs, concat_axis):
    np.testing.assert_array_equal(
        run(jax.lax.all_to_all, xs, split_axis=1, concat_axis=concat_axis, tiled=True),
        C.all_to_all(xs, 1, concat_axis, tiled=True))


def test_axis_index_and_axis_size():
    got = jax.pmap(lambda x: (jax.lax.axis_index("i"), jax.lax.psum(1, "i")), axis_name="i")(jnp.zeros(N))
    np.testing.assert_array_equal(got[0], C.axis_index(N))
    np.testing.assert_array_equal(got[1], np.full(N, N))


def test_reference_errors():
    with pytest.raises(ValueError, match="perm must be a permutation"):
        C.ppermute(np.zeros((4, 1)), [(0, 1), (1, 1)])
    with pytest.raises(ValueError, match=r"perm must be pairs of devices in 0..3"):
        C.ppermute(np.zeros((4, 1)), [(0, 4)])
    with pytest.raises(ValueError, match="must equal the number of devices, 4"):
        C.psum_scatter(np.zeros((4, 3)))
    with pytest.raises(ValueError, match="does not divide across 4 devices"):
        C.psum_scatter(np.zeros((4, 6)), tiled=True)
    with pytest.raises(ValueError, match="must equal the number of devices"):
        C.all_to_all(np.zeros((4, 3)), 0, 0)
    with pytest.raises(ValueError, match="got a scalar"):
        C.psum(np.float32(1))


def test_ring_allreduce_bytes():
    assert C.ring_allreduce_bytes(8, 800) == pytest.approx(1400.0)
    assert C.ring_allreduce_bytes(1, 800) == 0.0


def test_ring_reduce_scatter_is_half_an_allreduce_not_one_nth():
    for n in (2, 4, 8, 256):
        assert C.ring_reduce_scatter_bytes(n, 800) == pytest.approx(C.ring_allreduce_bytes(n, 800) / 2)
    assert C.ring_reduce_scatter_bytes(4, 800) == pytest.approx(600.0)     # not 800 / 4
    with pytest.raises(ValueError, match="message_bytes"):
        C.ring_reduce_scatter_bytes(4, -1)
    with pytest.raises((TypeError, ValueError), match="n_devices"):
        C.ring_reduce_scatter_bytes(0, 8)
