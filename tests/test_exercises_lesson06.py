"""Lesson 06 checkers: the reference passes; typical mistakes get feedback that names them."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from course_lib import sharding
from course_lib.exercises import check
from course_lib.exercises.lesson06 import solution_place, solution_stats_out_specs


def test_06_1_place():
    assert check("06.1", solution_place)
    stacked = check("06.1", lambda p, b, m: (sharding.replicate(p), jax.device_put(b, NamedSharding(m, P("i")))))
    assert "shape (8, 2) where (2,) was expected: an extra leading axis of 8" in stacked.message
    replicated_batch = check("06.1", lambda p, b, m: (jax.device_put(p, NamedSharding(m, P())),
                                                      jax.device_put(b, NamedSharding(m, P()))))
    assert "every device holds the whole batch" in replicated_batch.message
    on_host = check("06.1", lambda p, b, m: (p, b))
    assert "still on the host" in on_host.message
    one_device = check("06.1", lambda p, b, m: (jax.device_put(p, jax.devices()[0]),
                                                jax.device_put(b, NamedSharding(m, P("i")))))
    assert "got params['b'] whole on device 0" in one_device.message
    assert "every device of the mesh needs the whole array" in one_device.message


def test_06_1_a_nested_batch():   # a flat dict comprehension over the batch fails on the nested case
    fb = check("06.1", lambda p, b, m: (jax.device_put(p, NamedSharding(m, P())),
                                        {k: jax.device_put(v, NamedSharding(m, P("i", *[None] * (v.ndim - 1))))
                                         for k, v in b.items()}))
    assert not fb and "on a mesh of 4 devices" in fb.message


def test_06_1_the_mesh_given_in_its_order():
    def rotated(p, b, m):          # the mesh's devices, rotated by one: block k is not on the mesh's k-th device
        devs = list(m.devices.flat)
        return solution_place(p, b, jax.sharding.Mesh(np.array(devs[1:] + devs[:1]), ("i",)))
    fb = check("06.1", rotated)
    assert not fb and "on a mesh of its own (axes ('i',), devices [2, 6, 1, 3, 4, 0, 7, 5]; the mesh given: " \
        "('i',), [5, 2, 6, 1, 3, 4, 0, 7])" in fb.message

    def renamed(p, b, m):          # the mesh's devices in its order, its axis named "data"
        data = jax.sharding.Mesh(m.devices, ("data",))
        return jax.device_put(p, NamedSharding(data, P())), jax.device_put(b, NamedSharding(data, P("data")))
    fb = check("06.1", renamed)
    assert not fb and "on a mesh of its own (axes ('data',)" in fb.message and "the mesh given: ('i',)" in fb.message
    assert not check("06.1", lambda p, b, m: solution_place(p, b, jax.make_mesh((m.size,), ("i",))))  # its own mesh


def test_06_2_out_specs():
    assert check("06.2", solution_stats_out_specs)
    assert "check_vma rejects P() for the per-device sums" in check("06.2", lambda: (P(), P())).message
    assert "naming 'i' for it stacks 8 copies of one value" in check("06.2", lambda: (P("i"), P("i"))).message
    assert "a pair of PartitionSpecs" in check("06.2", lambda: P("i")).message


def test_06_1_swapped_or_wrong_structure_or_raises():
    fb = check("06.1", lambda p, b, m: solution_place(p, b, m)[::-1])
    assert not fb and "(batch, params): the batch first" in fb.message
    fb = check("06.1", lambda p, b, m: jax.device_put((p, b), NamedSharding(m, P("j"))))
    assert not fb and "place(dict, dict, Mesh) raised" in fb.message
    fb = check("06.1", lambda p, b, m: [jax.device_put(p["w"], NamedSharding(m, P())),
                                        jax.device_put(b["x"], NamedSharding(m, P("i")))])
    assert not fb and "expected dict{'b'" in fb.message and "got ndarray float32[3, 2]" in fb.message
    fb = check("06.1", lambda p, b, m: {"params": p, "batch": b})
    assert not fb and "should return a pair (params, batch); got dict{'params'" in fb.message


def test_06_2_raises_or_wrong_structure():
    fb = check("06.2", lambda: (P("j"), P()))
    assert not fb and ("out_specs=(P('j',), P()))(Array float32[16, 3]) raised ValueError: it names a mesh axis that the mesh does not "
                  "have" in fb.message)
    assert "its only axis is 'i'" in fb.message
    fb = check("06.2", lambda: {"local": P("i"), "total": P()})
    assert not fb and "a pair of PartitionSpecs" in fb.message and "got dict{'local'" in fb.message
    fb = check("06.2", lambda: (P("i"), P(), P()))
    assert not fb and "a pair of PartitionSpecs" in fb.message
    fb = check("06.2", lambda: (P("i"), P(undefined_name)))  # noqa: F821
    assert not fb and "stats_out_specs() raised NameError: name 'undefined_name' is not defined" in fb.message
    fb = check("06.2", lambda: ("i", None))
    assert not fb and "got tuple(str 'i', NoneType)" in fb.message


def test_06_1_parameters_split_or_another_mesh_are_named():
    split_params = check("06.1", lambda p, b, m: (jax.device_put(p, NamedSharding(m, P("i"))),
                                                  jax.device_put(b, NamedSharding(m, P()))))
    assert not split_params and "the parameters stay whole on every device" in split_params.message
    all_devices = jax.make_mesh((len(jax.devices()),), ("i",))
    own_mesh = check("06.1", lambda p, b, m: (jax.device_put(p, NamedSharding(all_devices, P())),
                                              jax.device_put(b, NamedSharding(all_devices, P("i")))))
    assert not own_mesh and "the mesh you were given" in own_mesh.message


def test_06_hints_are_a_ladder_without_solution_code():
    from hint_rules import assert_hints_are_a_ladder, code_from_solution
    for id_ in ("06.1", "06.2"):
        assert_hints_are_a_ladder(id_)
    # The feedback to each wrong answer names the mistake, not the line to type.
    wrong = [check("06.1", lambda p, b, m: (sharding.replicate(p), jax.device_put(b, NamedSharding(m, P("i"))))),
             check("06.1", lambda p, b, m: (jax.device_put(p, NamedSharding(m, P())),
                                            jax.device_put(b, NamedSharding(m, P()))))]
    for fb in wrong:
        assert not fb and not code_from_solution("06.1", fb.message), fb.message
    fb = check("06.2", lambda: (P("i"), P("i")))
    assert not fb and not code_from_solution("06.2", fb.message)
    assert "P('i'), P()" not in fb.message


def test_06_1_a_cast_is_named_with_its_dtype():
    # bfloat16 holds these small whole numbers exactly: the values alone would pass.
    fb = check("06.1", lambda p, b, m: solution_place(p, jax.tree.map(lambda v: v.astype(jnp.bfloat16), b), m))
    assert not fb and "batch['x']: dtype bfloat16 where float32 was expected" in fb.message and "float32" in fb.message
    fb = check("06.1", lambda p, b, m: solution_place(jax.tree.map(lambda v: v.astype(jnp.float16), p), b, m))
    assert not fb and "float16" in fb.message


def test_06_1_works_on_8_devices_but_not_on_4():
    eight = jax.make_mesh((len(jax.devices()),), ("i",))
    fb = check("06.1", lambda p, b, m: solution_place(p, b, eight))     # ignores the mesh it was given
    assert not fb and "the mesh you were given" in fb.message


def test_06_beginner_mistakes_name_the_cause():
    # P(None) names no axis: the feedback must say so rather than speak of a P() the learner never wrote.
    fb = check("06.2", lambda: (P(None), P()))
    assert not fb and "P(None,) (it names no mesh axis: the same as P())" in fb.message
    # The lesson's mesh axis is "data"; the exercise's is "i".
    fb = check("06.1", lambda p, b, m: (jax.device_put(p, NamedSharding(m, P())),
                                        jax.device_put(b, NamedSharding(m, P("data")))))
    assert not fb and "names its axis 'i'" in fb.message
    # A bare PartitionSpec outside a mesh context: JAX suggests jax.set_mesh; the feedback names the NamedSharding idea.
    fb = check("06.1", lambda p, b, m: (jax.device_put(p, P()), jax.device_put(b, P("i"))))
    assert not fb and "pair it with the mesh you were given" in fb.message
    # Entering the given mesh's context and passing bare specs is a right answer.
    def with_context(p, b, m):
        with jax.set_mesh(m):
            return jax.device_put(p, P()), jax.device_put(b, P("i"))
    assert check("06.1", with_context)
