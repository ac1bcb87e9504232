"""Exercise 07.2 (the training step in shard_map form, for any loss and optimizer): wrong answers fail with
feedback naming their mistake; right answers written differently pass."""

import jax
import jax.numpy as jnp
import optax
import pytest
from jax.sharding import PartitionSpec as P

from course_lib.exercises import check

SPECS = dict(in_specs=(P(), P(), P("i"), P("i")), out_specs=(P(), P(), P()))


def _sm(pcast=True, reduce="pmean", average_loss=True, own_update=None, keep_state=False, donate=True,
        check_vma=True, fixed_mesh=None):
    def make(loss_fn, optimizer, mesh):
        def body(params, opt_state, x, y):
            local = jax.tree.map(lambda p: jax.lax.pcast(p, "i", to="varying"), params) if pcast else params
            loss, grads = jax.value_and_grad(loss_fn)(local, x, y)
            if reduce:
                grads = (jax.lax.pmean if reduce == "pmean" else jax.lax.psum)(grads, "i")
            if average_loss:
                loss = jax.lax.pmean(loss, "i")
            if own_update is not None:
                return jax.tree.map(lambda p, g: p - own_update * g, params, grads), opt_state, loss
            tx = optimizer if not callable(keep_state) else keep_state()
            updates, new_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), (opt_state if keep_state is True else new_state), loss
        step = jax.shard_map(body, mesh=fixed_mesh or mesh, check_vma=check_vma, **SPECS)
        return jax.jit(step, donate_argnums=(0, 1) if donate else ())
    return make


def _params_only_donated(loss_fn, optimizer, mesh):
    step = _sm(donate=False)(loss_fn, optimizer, mesh)
    return jax.jit(step, donate_argnums=0)


def _loss_split(loss_fn, optimizer, mesh):                      # the per-device loss, out_specs naming 'i'
    def body(params, opt_state, x, y):
        local = jax.tree.map(lambda p: jax.lax.pcast(p, "i", to="varying"), params)
        loss, grads = jax.value_and_grad(loss_fn)(local, x, y)
        updates, opt_state = optimizer.update(jax.lax.pmean(grads, "i"), opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=SPECS["in_specs"], out_specs=(P(), P(), P("i"))),
                   donate_argnums=(0, 1))


def _lesson_axis(loss_fn, optimizer, mesh):                    # lesson 07's axis name, not the mesh's
    def body(params, opt_state, x, y):
        local = jax.tree.map(lambda p: jax.lax.pcast(p, "data", to="varying"), params)
        loss, grads = jax.value_and_grad(loss_fn)(local, x, y)
        grads, loss = jax.lax.pmean((grads, loss), "data")
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P("data"), P("data")),
                                 out_specs=(P(), P(), P())), donate_argnums=(0, 1))


def _sharded_jit(loss_fn, optimizer, mesh):                      # right values, but no shard_map
    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss
    return jax.jit(step, donate_argnums=(0, 1))


def _update_on_copy(loss_fn, optimizer, mesh):                   # right numbers; the update goes to the pcast copy
    def body(params, opt_state, x, y):
        local = jax.tree.map(lambda p: jax.lax.pcast(p, "i", to="varying"), params)
        loss, grads = jax.value_and_grad(loss_fn)(local, x, y)
        updates, opt_state = optimizer.update(jax.lax.pmean(grads, "i"), opt_state, local)
        return optax.apply_updates(local, updates), opt_state, jax.lax.pmean(loss, "i")
    return jax.jit(jax.shard_map(body, mesh=mesh, **SPECS), donate_argnums=(0, 1))


def _no_params(loss_fn, optimizer, mesh):                       # optimizer.update(grads, state): AdamW needs params
    tx = optax.GradientTransformation(optimizer.init, lambda g, s, p=None: optimizer.update(g, s))
    return _sm()(loss_fn, tx, mesh)


def _own_adam(loss_fn, optimizer, mesh):                         # the lesson's Adam, whatever it is given
    return _sm()(loss_fn, optax.adam(0.05), mesh)


WRONG = {
    "pmean without pcast (8x)": (_sm(pcast=False), ["8 times the mean gradient", "already summed"]),
    "psum without pcast (64x)": (_sm(pcast=False, reduce="psum"), ["summed twice", "(8 x 8 times"]),
    "psum with pcast (8x)": (_sm(reduce="psum"), ["8 times the mean gradient", "a psum (it sums)"]),
    "SGD by hand, optimizer ignored": (_sm(own_update=0.1), ["never calls the optimizer it was given"]),
    "sharded jit, no shard_map": (_sharded_jit, ["no jax.shard_map"]),
    "no donation": (_sm(donate=False), ["does not donate"]),
    "only the parameters donated": (_params_only_donated, ["the optimizer state passed in still exists"]),
    "per-device loss, split": (_loss_split, ["the loss is a scalar"]),
    "the lesson's axis name": (_lesson_axis, ["its only axis is 'i'"]),
    "loss of device 0 only": (_sm(average_loss=False, check_vma=False), ["device 0's rows only"]),
    "no gradient averaging, check off": (_sm(reduce=None, check_vma=False), ["never averaged"]),
    "no gradient averaging, refused by JAX": (_sm(reduce=None), ["never averaged", "JAX refuses"]),
    "update applied to the pcast copy": (_update_on_copy, ["JAX refused", "with check_vma off your numbers are right"]),
    "update without params": (_no_params, ["requires the current value of parameters"]),
    "hard-coded 8-device mesh": (_sm(fixed_mesh=jax.make_mesh((8,), ("i",))), ["was built on another mesh"]),
}


@pytest.mark.parametrize("name", WRONG)
def test_wrong_answer_is_named(name):
    answer, fragments = WRONG[name]
    fb = check("07.2", answer)
    assert not fb, name
    for fragment in fragments:
        assert fragment in fb.message, (name, fb.message)


def test_the_lessons_adam_instead_of_the_given_optimizer_fails():
    fb = check("07.2", _own_adam)
    assert not fb and "never calls the optimizer it was given" in fb.message, fb.message


def test_old_optimizer_state_returned():
    fb = check("07.2", _sm(keep_state=True))
    assert not fb and "the one that came in" in fb.message and "step 1's opt_state[0]" in fb.message, fb.message


def _grad_outside(loss_fn, optimizer, mesh):                     # lesson 06's idiom 2: grad of a pmean-ed loss
    def global_loss(params, x, y):
        return jax.shard_map(lambda p, a, b: jax.lax.pmean(loss_fn(p, a, b), "i"), mesh=mesh,
                             in_specs=(P(), P("i"), P("i")), out_specs=P())(params, x, y)

    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(global_loss)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss
    return jax.jit(step, donate_argnums=(0, 1))


def _psum_over_n(loss_fn, optimizer, mesh):                      # pcast, psum, divide by the axis size
    n = mesh.shape["i"]

    def body(params, opt_state, x, y):
        local = jax.tree.map(lambda p: jax.lax.pcast(p, "i", to="varying"), params)
        loss, grads = jax.value_and_grad(loss_fn)(local, x, y)
        grads = jax.tree.map(lambda g: jax.lax.psum(g, "i") / n, grads)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, jax.lax.psum(loss, "i") / n
    return jax.jit(jax.shard_map(body, mesh=mesh, **SPECS), donate_argnums=(0, 1))


def _wrapper_places_the_batch(loss_fn, optimizer, mesh):     # a wrapper that enters the mesh and places x, y
    from course_lib.exercises.lesson07 import solution_make_sharded_step
    step = solution_make_sharded_step(loss_fn, optimizer, mesh)

    def run(params, opt_state, x, y):
        with jax.set_mesh(mesh):
            x, y = jax.device_put((x, y), P("i"))
            return step(params, opt_state, x, y)
    return run


RIGHT = {
    "behind a wrapper that places the batch": _wrapper_places_the_batch,
    "grad outside the shard_map": _grad_outside,
    "psum then divide": _psum_over_n,
    "pmap semantics (check_vma off)": _sm(pcast=False, check_vma=False),
}


@pytest.mark.parametrize("name", RIGHT)
def test_right_answer_passes(name):
    fb = check("07.2", RIGHT[name])
    assert fb, (name, fb.message)


# ---- Fresh answers (issue 44), written as learners would: each wrong one fails with what differs (or its mistake,
# where the numbers confirm it); each right one in another form passes.

import optax as _optax  # noqa: E402


def _step(scale=1.0, loss_red="pmean", two=False):
    def make(loss_fn, optimizer, mesh):
        def per(params, opt_state, x, y):
            local = jax.tree.map(lambda p: jax.lax.pcast(p, "i", to="varying"), params)
            loss, g = jax.value_and_grad(loss_fn)(local, x, y)
            g = jax.tree.map(lambda a: a * scale, jax.lax.pmean(g, "i"))
            u, s = optimizer.update(g, opt_state, params)
            out = (_optax.apply_updates(params, u), s, getattr(jax.lax, loss_red)(loss, "i"))
            return out[:2] if two else out
        return jax.jit(jax.shard_map(per, mesh=mesh, in_specs=SPECS["in_specs"],
                                     out_specs=SPECS["out_specs"][:2 if two else 3]), donate_argnums=(0, 1))
    return make


FRESH = [
    ("loss summed, not averaged", _step(loss_red="psum"), "8x too large, a factor of the device count"),
    ("only (params, opt_state)", _step(two=True), "should return a triple (params, opt_state, loss)"),
    ("returns None", lambda l, o, m: None, "returned None: did it forget"),
]


from fooling import fresh_test as _fresh_test  # noqa: E402

test_a_fresh_answer_gets_what_differs = _fresh_test('07.2', FRESH)
