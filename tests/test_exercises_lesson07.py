"""Lesson 07 checkers: the references pass, the pmap versions agree with them, hints are a ladder.

The wrong answers each exercise must refuse, with feedback naming the mistake, are in tests/fool/test_fool_07_*.py.
"""

import jax
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from course_lib.exercises import check, exercises
from course_lib.exercises import lesson07
from course_lib.exercises.lesson07 import solution_make_sharded_step, solution_ported


def test_references_pass():
    assert check("07.1", solution_ported)
    assert check("07.2", solution_make_sharded_step)


def test_07_1_reference_agrees_with_the_pmap_version_it_ports():
    n = len(jax.devices())
    mesh = jax.make_mesh((n,), ("i",))
    x = np.random.default_rng(0).normal(size=(n * 2, 3)).astype(np.float32)
    w = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)
    h_old, total_old = lesson07.pmap_version(x.reshape(n, 2, 3), w)
    h, total = solution_ported(jax.device_put(x, NamedSharding(mesh, P("i"))),
                               jax.device_put(w, NamedSharding(mesh, P())), mesh)
    np.testing.assert_allclose(np.asarray(h), np.asarray(h_old).reshape(n * 2, 4), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(total), np.asarray(total_old), rtol=1e-5)


def test_07_1_shard_map_on_another_mesh_than_its_inputs_is_said_in_one_sentence():
    def reversed_mesh(x, w, mesh):
        m = jax.sharding.Mesh(mesh.devices[::-1], ("i",), axis_types=mesh.axis_types)
        return jax.shard_map(lambda a, b: (a @ b, a.sum()), mesh=m, in_specs=(P("i"), P()),
                             out_specs=(P("i"), P()))(x, w)

    fb = check("07.1", reversed_mesh)
    assert not fb and "runs on another mesh than the one its inputs live on: use the mesh you were given." in (
        fb.message) and "device ids" not in fb.message


def test_07_1_a_mesh_the_answer_built_is_refused_and_said():
    def own_mesh(x, w, mesh, placed=True):
        def body(a, b):
            h = jax.numpy.tanh(a @ b)
            return h, jax.lax.psum(h.sum(axis=0), "data")

        m = jax.sharding.Mesh(mesh.devices, ("data",))
        x, w = jax.device_put((x, w), (NamedSharding(m, P("data")), NamedSharding(m, P()))) if placed else (x, w)
        return jax.shard_map(body, mesh=m, in_specs=(P("data"), P()), out_specs=(P("data"), P()))(x, w)

    fb = check("07.1", own_mesh)
    assert not fb and "another mesh than the one given" in fb.message and "'data'" in fb.message, fb.message
    fb = check("07.1", lambda x, w, mesh: own_mesh(x, w, mesh, placed=False))
    assert not fb and "did not find it where your code ran" in fb.message and "pmap" not in fb.message, fb.message


def test_07_2_checker_cases_vary_devices_models_and_optimizers():
    cases = lesson07._cases(np.random.default_rng(0))
    assert [c[0] for c in cases] == [len(jax.devices()), 2, 4]     # Adam, which hides a gradient's scale, last
    assert len({c[1] for c in cases}) == 3 and len({c[5] for c in cases}) == 3


def test_07_2_solution_is_one_device_on_the_whole_batch():
    # What the checker compares with: the solution's steps on the mesh, which must be one device's on the whole batch.
    case = lesson07._cases(np.random.default_rng(3))[1]                 # 4 devices, clipping before AdamW
    n, loss_fn, params0, batches, tx, label = case
    got = lesson07._steps_runner(lambda *a: solution_make_sharded_step(*a), lesson07.Case(case, label, n=n))
    params, state = params0, tx.init(params0)
    for (x, y), (p, s, loss) in zip(batches, [got[i:i + 3] for i in range(1, len(got), 3)]):
        want_loss, g = jax.value_and_grad(loss_fn)(params, x, y)
        u, state = tx.update(g, state, params)
        params = optax.apply_updates(params, u)
        np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
        for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(params)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_07_hints_are_a_ladder_without_solution_code():
    from hint_rules import assert_hints_are_a_ladder
    for id_ in ("07.1", "07.2"):
        assert_hints_are_a_ladder(id_)
        assert len(exercises()[id_].hints) == 3
