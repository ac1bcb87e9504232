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


def test_07_2_checker_cases_vary_devices_models_and_optimizers():
    cases = lesson07._cases(np.random.default_rng(0))
    assert [c[0] for c in cases] == [len(jax.devices()), 4, 2]
    assert len({c[1] for c in cases}) == 3 and len({c[5] for c in cases}) == 3


def test_07_2_reference_is_one_device_on_the_whole_batch():
    # The checker's reference: it must agree with the pmap step of lesson 05 on stacked copies.
    n = 4
    rng = np.random.default_rng(3)
    params0 = {"w": rng.normal(size=4).astype(np.float32), "b": np.float32(0.1)}
    x, y = rng.normal(size=(8, 4)).astype(np.float32), rng.normal(size=8).astype(np.float32)
    tx = optax.adam(0.1)
    ref = lesson07._reference(lesson07.regression_loss, tx, params0, [(x, y)])

    def step(params, state, xb, yb):
        loss, g = jax.value_and_grad(lesson07.regression_loss)(params, xb, yb)
        g = jax.lax.pmean(g, "i")
        u, state = tx.update(g, state, params)
        return optax.apply_updates(params, u), state

    stack = lambda t: jax.tree.map(lambda v: np.broadcast_to(v, (n,) + np.shape(v)), t)
    p, _ = jax.pmap(step, axis_name="i", devices=jax.devices()[:n])(stack(params0), stack(tx.init(params0)),
                                                                    x.reshape(n, 2, 4), y.reshape(n, 2))
    np.testing.assert_allclose(np.asarray(p["w"][0]), ref[0][0]["w"], rtol=1e-5)


def test_07_hints_are_a_ladder_without_solution_code():
    from hint_rules import assert_hints_are_a_ladder
    for id_ in ("07.1", "07.2"):
        assert_hints_are_a_ladder(id_)
        assert len(exercises()[id_].hints) == 3
