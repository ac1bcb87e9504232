"""Lesson 07 checkers: the reference passes; typical mistakes get feedback that names them."""

import jax
import numpy as np
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from course_lib.exercises import check
from course_lib.exercises.lesson07 import solution_make_sharded_step, solution_ported


def test_07_1_ported():
    assert check("07.1", solution_ported)
    wrong_out = check("07.1", lambda x, w, m: jax.shard_map(lambda a, c: jnp.tanh(a @ c), mesh=m,
                                                            in_specs=(P("i"), P()), out_specs=P())(x, w))
    assert "P() would claim they are all the same" in wrong_out.message
    no_shard_map = check("07.1", lambda x, w, m: jnp.tanh(x @ w))
    assert "does not use jax.shard_map" in no_shard_map.message
    wrong_in = check("07.1", lambda x, w, m: jax.shard_map(lambda a, c: jnp.tanh(a @ c), mesh=m,
                                                           in_specs=(P(), P()), out_specs=P("i"))(x, w))
    assert "in_specs must match how the inputs are placed" in wrong_in.message


def test_07_1_raises_or_wrong_structure():
    fb = check("07.1", lambda x, w, m: jax.shard_map(lambda a, c: jnp.tanh(a @ c), mesh=m, in_specs=(P("j"), P()),
                                                     out_specs=P("i"))(x, w))
    assert not fb and "ported(Array float32[16, 3], Array float32[3, 4], Mesh) raised" in fb.message
    fb = check("07.1", lambda x, w, m: (solution_ported(x, w, m), m))
    assert not fb and "should be an array of shape (16, 4), got tuple(Array float32[16, 4], Mesh)" in fb.message
    fb = check("07.1", lambda x, w, m: jnp.tanh(jnp.asarray(np.asarray(x) @ np.asarray(w))).reshape(
        m.devices.size, -1, w.shape[1]))
    assert not fb and "has shape (8, 2, 4); expected (16, 4)" in fb.message


def test_07_1_w_split_too_is_named_in_a_whole_sentence():
    # Both arrays split over 'i': the message used to end mid-sentence at JAX's "...mesh axis sizes:".
    fb = check("07.1", lambda x, w, m: jax.shard_map(lambda a, c: jnp.tanh(a @ c), mesh=m, in_specs=(P("i"), P("i")),
                                                     out_specs=P("i"))(x, w))
    assert not fb and "That is w, of shape (3, 4)" in fb.message and "should split nothing" in fb.message
    assert fb.message.rstrip().endswith("."), fb.message


def test_07_hints_are_a_ladder_without_solution_code():
    from hint_rules import assert_hints_are_a_ladder, code_from_solution
    for id_ in ("07.1", "07.2"):
        assert_hints_are_a_ladder(id_)
    wrong_out = check("07.1", lambda x, w, m: jax.shard_map(lambda a, c: jnp.tanh(a @ c), mesh=m,
                                                            in_specs=(P("i"), P()), out_specs=P())(x, w))
    assert not wrong_out and not code_from_solution("07.1", wrong_out.message)


# ---- 07.2: the whole lesson-05 step, optax optimizer included, on a mesh -----------------------------------

import optax  # noqa: E402


def _shard_map_step(reduce="pmean", pcast=True, fixed_mesh=None):
    """The pmap step moved into jit(shard_map): right with pcast + pmean; n (or n*n) times too large otherwise."""
    def make(loss_fn, optimizer, mesh):
        def body(params, opt_state, x, y):
            local = jax.tree.map(lambda p: jax.lax.pcast(p, "i", to="varying"), params) if pcast else params
            loss, grads = jax.value_and_grad(loss_fn)(local, x, y)
            grads = (jax.lax.pmean if reduce == "pmean" else jax.lax.psum)(grads, "i")
            loss = jax.lax.pmean(loss, "i")
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        return jax.jit(jax.shard_map(body, mesh=fixed_mesh or mesh, in_specs=(P(), P(), P("i"), P("i")),
                                     out_specs=(P(), P(), P())))
    return make


def _jit_step(transform_grads=None, gather=False, keep_state=False, jit=True, donate=False):
    def make(loss_fn, optimizer, mesh):
        def step(params, opt_state, x, y):
            if gather:
                x, y = jax.reshard(x, P()), jax.reshard(y, P())
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            if transform_grads:
                grads = jax.tree.map(lambda g: transform_grads(g, mesh), grads)
            updates, new_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), (opt_state if keep_state else new_state), loss
        if not jit:
            return step
        return jax.jit(step, donate_argnums=(0, 1) if donate else ())
    return make


def test_07_2_right_answers_pass():
    assert check("07.2", solution_make_sharded_step)
    assert check("07.2", _shard_map_step())                      # jit(shard_map) with pcast and pmean
    assert check("07.2", _jit_step(donate=True))                 # donating the state is fine


def test_07_2_gradients_n_times_too_large_are_caught_with_adam():
    # The pmap habit under shard_map: a P() parameter's gradient is already summed, pmean on top is 8x.
    fb = check("07.2", _shard_map_step(pcast=False))
    assert not fb and "8 times too large" in fb.message and "Adam" in fb.message
    fb = check("07.2", _shard_map_step(reduce="psum", pcast=False))
    assert not fb and "64 (8 x 8) times too large" in fb.message
    fb = check("07.2", _shard_map_step(reduce="psum"))
    assert not fb and "8 times too large" in fb.message
    fb = check("07.2", _jit_step(transform_grads=lambda g, mesh: g * mesh.size))
    assert not fb and "8 times too large" in fb.message


def test_07_2_skipping_the_mechanism_is_named():
    fb = check("07.2", _jit_step(gather=True))                   # every device computes on the whole batch
    assert not fb and "all-gather" in fb.message and "its own rows" in fb.message
    fb = check("07.2", _jit_step(jit=False))                     # op-by-op, not one sharded program
    assert not fb and "is not jitted" in fb.message
    fb = check("07.2", _jit_step(keep_state=True))               # the optimizer state never advances
    assert not fb and "holds no gradient" in fb.message


def test_07_2_dtype_and_four_devices():
    def bf16(loss_fn, optimizer, mesh):
        step = solution_make_sharded_step(loss_fn, optimizer, mesh)

        @jax.jit
        def cast(params, opt_state, x, y):
            p, s, loss = step(params, opt_state, x, y)
            return jax.tree.map(lambda v: v.astype(jnp.bfloat16), p), s, loss
        return cast

    fb = check("07.2", bf16)
    assert not fb and "bfloat16" in fb.message and "float32" in fb.message
    eight = jax.make_mesh((8,), ("i",))
    fb = check("07.2", _shard_map_step(fixed_mesh=eight))        # right on 8 devices, wrong on 4
    assert not fb and "Build on that mesh" in fb.message and "Mesh('i': 8" in fb.message


def test_07_1_dtype_and_four_devices():
    fb = check("07.1", lambda x, w, m: solution_ported(x, w, m).astype(jnp.bfloat16))
    assert not fb and "bfloat16" in fb.message and "float32" in fb.message
    eight = jax.make_mesh((len(jax.devices()),), ("i",))
    fb = check("07.1", lambda x, w, m: solution_ported(x, w, eight))   # right on 8 devices only
    assert not fb and "on 4 devices" in fb.message


def test_07_1_pmap_kept_or_check_vma_off_are_named():
    # pmap left in the port: on arrays placed on an Explicit mesh JAX raises a bare KeyError naming the axis.
    def kept_pmap(x, w, m):
        stacked = x.reshape(m.size, -1, x.shape[1])
        return jax.pmap(lambda a, c: jnp.tanh(a @ c), in_axes=(0, None))(stacked, w).reshape(x.shape[0], -1)
    fb = check("07.1", kept_pmap)
    assert not fb and "KeyError: 'i'" in fb.message and "replaces pmap" in fb.message
    # out_specs P() with the check switched off returns one device's block.
    fb = check("07.1", lambda x, w, m: jax.shard_map(lambda a, c: jnp.tanh(a @ c), mesh=m, in_specs=(P("i"), P()),
                                                     out_specs=P(), check_vma=False)(x, w))
    assert not fb and "one device's block" in fb.message
    # The lesson's axis name instead of the exercise's.
    fb = check("07.1", lambda x, w, m: jax.shard_map(lambda a, c: jnp.tanh(a @ c), mesh=m,
                                                     in_specs=(P("data"), P()), out_specs=P("data"))(x, w))
    assert not fb and "its only axis is 'i'" in fb.message


def test_07_2_beginner_mistakes_and_a_step_that_sets_its_own_mesh():
    # A pmean under plain jit: JAX's NameError says "call psum under shard_map", which leads to the 8x port.
    fb = check("07.2", _jit_step(transform_grads=lambda g, mesh: jax.lax.pmean(g, "i")))
    assert not fb and "unbound axis name" in fb.message and "Under plain jit each value is a global one" in fb.message
    # The shard_map port that returns the per-device loss with a split out_spec.
    def loss_split(loss_fn, optimizer, mesh):
        def body(params, opt_state, x, y):
            local = jax.tree.map(lambda p: jax.lax.pcast(p, "i", to="varying"), params)
            loss, grads = jax.value_and_grad(loss_fn)(local, x, y)
            updates, opt_state = optimizer.update(jax.lax.pmean(grads, "i"), opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P("i"), P("i")),
                                     out_specs=(P(), P(), P("i"))))
    fb = check("07.2", loss_split)
    assert not fb and "the loss is a scalar" in fb.message
    # A loss computed in bfloat16 is named by its dtype (not "should be an array of shape ()").
    def bf16_loss(loss_fn, optimizer, mesh):
        step = solution_make_sharded_step(loss_fn, optimizer, mesh)
        return jax.jit(lambda *a: (lambda p, s, l: (p, s, l.astype(jnp.bfloat16)))(*step(*a)))
    fb = check("07.2", bf16_loss)
    assert not fb and "the loss of step 1 is bfloat16" in fb.message
    # A right step that enters jax.set_mesh itself around its jitted step is not "not jitted".
    def own_context(loss_fn, optimizer, mesh):
        step = solution_make_sharded_step(loss_fn, optimizer, mesh)
        def run(*args):
            with jax.set_mesh(mesh):
                return step(*args)
        return run
    fb = check("07.2", own_context)
    assert fb, fb.message
    assert "could not be read from outside" in fb.message
