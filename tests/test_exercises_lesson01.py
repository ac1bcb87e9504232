"""Lesson 01 checkers: the reference passes; typical mistakes get feedback that names them."""

import jax
import jax.numpy as jnp
import numpy as np

from course_lib.exercises import check
from course_lib.exercises.lesson01 import solution_batched_norms, solution_norms_on_devices, solution_split_across


def test_01_1_split_across():
    assert check("01.1", solution_split_across)
    strided = check("01.1", lambda x, ds: [jax.device_put(x[i::len(ds)], d) for i, d in enumerate(ds)])
    assert "every n-th row" in strided.message and "a run of consecutive rows" in strided.message
    on_host = check("01.1", lambda x, ds: list(np.split(x, len(ds))))
    assert "The pieces are NumPy arrays in host memory" in on_host.message
    all_on_one = check("01.1", lambda x, ds: [jax.device_put(p, ds[0]) for p in np.split(x, len(ds))])
    assert "expected pieces on: device 5, device 2, device 6, device 1, device 3, device 4, device 0, device 7, " \
        "got pieces on: device 5, device 5" in all_on_one.message
    in_id_order = check("01.1", lambda x, ds: solution_split_across(x, sorted(ds, key=lambda d: d.id)))
    assert "devices with ids [5, 2, 6, 1, 3, 4, 0, 7]): expected pieces on: device 5, device 2, device 6, device 1, " \
        "device 3, device 4, device 0, device 7, got pieces on: device 0, device 1," in in_id_order.message
    too_few = check("01.1", lambda x, ds: [jax.device_put(x, ds[0])])
    assert "expected a list of 8" in too_few.message
    hard_coded = check("01.1", lambda x, ds: [jax.device_put(x[2 * i:2 * i + 2], d) for i, d in enumerate(ds)])
    assert not hard_coded, "a split that only works for 2 rows per device must fail on other sizes"


def test_01_2_batched_norms():
    assert check("01.2", solution_batched_norms)
    whole = check("01.2", lambda x: jnp.sqrt(jnp.sum(x**2)))
    assert "one number, the norm of the whole batch" in whole.message
    columns = check("01.2", lambda x: jnp.sqrt(jnp.sum(x**2, axis=0)))
    assert not columns and "one value per column" in columns.message and "over axis 0" in columns.message
    squares = check("01.2", jax.vmap(lambda v: jnp.sum(v**2)))
    assert "the square root is missing" in squares.message


def test_01_3_norms_on_devices():
    assert check("01.3", solution_norms_on_devices)
    vmapped = check("01.3", jax.vmap(lambda v: jnp.sqrt(jnp.sum(v**2))))
    assert "right values but lives on one device" in vmapped.message and "jax.pmap" in vmapped.message
    wrong_values = check("01.3", jax.pmap(lambda v: jnp.sum(v)))
    assert "values differ" in wrong_values.message


def test_01_1_raises_or_wrong_structure():
    fb = check("01.1", lambda x, ds: [jax.device_put(x[i], d) for i, d in enumerate(ds[:100])][len(ds)])
    assert not fb and "split_across(ndarray float32[16, 3], list) raised IndexError" in fb.message
    fb = check("01.1", lambda x, ds: {d.id: x for d in ds})
    assert not fb and "split_across returned dict{" in fb.message
    fb = check("01.1", lambda x, ds: iter(solution_split_across(x, ds)))
    assert not fb and "returned list_iterator; expected a list of 8 jax.Arrays, one per device given: piece i on " \
        "devices[i]." in fb.message and "'on device" not in fb.message
    fb = check("01.1", lambda x, ds: [(p, d) for p, d in zip(np.split(x, len(ds)), ds)])
    assert not fb and "expected Array float32[2, 3], got tuple(ndarray float32[2, 3], Device)" in fb.message


def test_01_2_needs_vmap_not_only_the_numbers():
    # Fails on the checker before issue 14: it praised these "for using vmap".
    fb = check("01.2", lambda x: jnp.linalg.norm(x, axis=1))
    assert not fb and "no jax.vmap ran" in fb.message and "write the norm of ONE row" in fb.message
    assert not check("01.2", lambda x: jnp.sqrt(jnp.sum(x**2, axis=1)))
    # vmap built before check() runs, even behind a jit, still counts.
    prebuilt = jax.jit(jax.vmap(lambda v: jnp.sqrt(jnp.sum(v**2))))
    prebuilt(jnp.ones((8, 3)))
    assert check("01.2", prebuilt)
    assert check("01.2", lambda x: prebuilt(x))


def test_01_2_raises_or_wrong_structure():
    fb = check("01.2", lambda x: jax.vmap(lambda v: jnp.sqrt(jnp.sum(v**2)), in_axes=2)(x))
    assert not fb and "batched_norms(Array float32[8, 3]) raised ValueError" in fb.message
    fb = check("01.2", lambda x: (jax.vmap(jnp.linalg.norm)(x), x))
    assert not fb and "expected Array float32[8], got tuple(Array float32[8], Array float32[8, 3])" in (
        fb.message)


def test_01_3_needs_pmap_and_survives_wrong_structures():
    from jax.sharding import NamedSharding, PartitionSpec as P

    def placed_by_hand(x):
        mesh = jax.make_mesh((x.shape[0],), ("a",), devices=jax.devices()[:x.shape[0]])
        return jax.device_put(jnp.sqrt(jnp.sum(x**2, axis=1)), NamedSharding(mesh, P("a")))

    fb = check("01.3", placed_by_hand)
    assert not fb and "its program has no jax.pmap" in fb.message
    fb = check("01.3", jax.pmap(lambda v: jnp.sqrt(jnp.sum(v**2)), in_axes=2))
    assert not fb and "norms_on_devices(Array float32[8, 3]) raised IndexError" in fb.message
    fb = check("01.3", lambda x: {"norms": solution_norms_on_devices(x)})
    assert not fb and "expected Array float32[8], got dict{'norms': Array float32[8]}" in fb.message
