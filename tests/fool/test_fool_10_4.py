"""Exercise 10.4 (the FSDP step of a model split leaf by leaf): answers that try to fool the checker."""

import jax
import jax.numpy as jnp
import optax

from fooling import fool_tests

ID = "10.4"
A = "data"


def fsdp(loss_fn, optimizer, *, mean=True, gather_to=None, pmean_loss=True, dtype=None, return_whole=False,
         divide=None):
    def step(my, opt_state, batch):
        n = jax.lax.axis_size(A)

        def sliced_loss(p):
            if dtype is not None:
                p = jax.tree.map(lambda s: s.astype(dtype), p)
            kw = {"to": gather_to} if gather_to else {}
            whole = jax.tree.map(lambda s: jax.lax.all_gather(s, A, tiled=True, **kw), p)
            return loss_fn(whole, batch).astype(jnp.float32)

        loss, grads = jax.value_and_grad(sliced_loss)(my)
        by = divide(n) if divide else n
        grads = jax.tree.map(lambda g: g / by if mean else g, grads)
        updates, opt_state = optimizer.update(grads, opt_state, my)
        new = optax.apply_updates(my, updates)
        if return_whole:
            new = jax.tree.map(lambda s: jax.lax.all_gather(s, A, tiled=True), new)
        return new, opt_state, jax.lax.pmean(loss, A) if pmean_loss else loss
    return step


def all_reduce_then_slice(loss_fn, optimizer):
    def step(my, opt_state, batch):
        n = jax.lax.axis_size(A)
        whole = jax.tree.map(lambda s: jax.lax.all_gather(s, A, tiled=True), my)
        loss, g = jax.value_and_grad(loss_fn)(whole, batch)
        g = jax.tree.map(lambda v, s: jax.lax.dynamic_slice_in_dim(jax.lax.psum(v, A) / n,
                                                                   jax.lax.axis_index(A) * s.shape[0], s.shape[0]),
                         g, my)
        updates, opt_state = optimizer.update(g, opt_state, my)
        return optax.apply_updates(my, updates), opt_state, jax.lax.pmean(loss, A)
    return step


def own_sgd(lr):                                # ignores the optimizer it is given: its own plain SGD
    def make(loss_fn, optimizer):
        def step(my, opt_state, batch):
            n = jax.lax.axis_size(A)
            whole = lambda p: jax.tree.map(lambda s: jax.lax.all_gather(s, A, tiled=True), p)
            loss, g = jax.value_and_grad(lambda p: loss_fn(whole(p), batch))(my)
            g = jax.tree.map(lambda v: v / n, g)
            _, opt_state = optimizer.update(g, opt_state, my)
            return jax.tree.map(lambda p, v: p - lr * v, my, g), opt_state, jax.lax.pmean(loss, A)
        return step
    return make


def plain_sgd_no_optimizer(loss_fn, optimizer):  # never calls the optimizer at all
    def step(my, opt_state, batch):
        n = jax.lax.axis_size(A)
        whole = lambda p: jax.tree.map(lambda s: jax.lax.all_gather(s, A, tiled=True), p)
        loss, g = jax.value_and_grad(lambda p: loss_fn(whole(p), batch))(my)
        return jax.tree.map(lambda p, v: p - 0.5 * v / n, my, g), opt_state, jax.lax.pmean(loss, A)
    return step


def never_gathers(loss_fn, optimizer):
    def step(my, opt_state, batch):
        loss, g = jax.value_and_grad(loss_fn)(my, batch)
        updates, opt_state = optimizer.update(g, opt_state, my)
        return optax.apply_updates(my, updates), opt_state, jax.lax.pmean(loss, A)
    return step


def scatters_itself(loss_fn, optimizer):        # right: gather outside the gradient, reduce-scatter by hand
    def step(my, opt_state, batch):
        n = jax.lax.axis_size(A)
        whole = jax.tree.map(lambda s: jax.lax.all_gather(s, A, tiled=True), my)      # varying: my own copy
        loss, g = jax.value_and_grad(loss_fn)(whole, batch)
        mine = jax.tree.map(lambda v: jax.lax.psum_scatter(v, A, tiled=True) / n, g)
        updates, opt_state = optimizer.update(mine, opt_state, my)
        return optax.apply_updates(my, updates), opt_state, jax.lax.pmean(loss, A)
    return step


def mean_loss_inside(loss_fn, optimizer):       # right: differentiate the loss already divided by n
    def step(my, opt_state, batch):
        n = jax.lax.axis_size(A)

        def f(p):
            return loss_fn({k: jax.lax.all_gather(v, A, tiled=True) for k, v in p.items()}, batch) / n

        loss, g = jax.value_and_grad(f)(my)
        updates, opt_state = optimizer.update(g, opt_state, my)
        new = jax.tree.map(lambda a, u: a + u, my, updates)
        return new, opt_state, jax.lax.psum(loss, A)
    return step


WRONG = [
    ("summed, not averaged", lambda l, o: fsdp(l, o, mean=False), "the mean gradient times the device count"),
    ("all-reduce, then slice", all_reduce_then_slice, "no gradient-sized all-reduce"),
    ("gathered invarying", lambda l, o: fsdp(l, o, gather_to="invarying"), "invarying"),
    ("never gathers", never_gathers, "the shape of this device's slice"),
    ("returns the gathered parameters", lambda l, o: fsdp(l, o, return_whole=True), "not the gathered parameters"),
    ("the local loss", lambda l, o: fsdp(l, o, pmean_loss=False), "average it over the mesh axis"),
    ("bfloat16 compute", lambda l, o: fsdp(l, o, dtype=jnp.bfloat16), "bfloat16"),
    ("its own SGD, another learning rate", own_sgd(0.1), "5x too small"),
    ("its own SGD, the first case's rate", own_sgd(0.5), "['first update']"),
    ("no step", lambda l, o: "step", "expected the step function"),
    ("plain SGD, no optimizer call", plain_sgd_no_optimizer, "never calls the update of the optimizer"),
    ("divided by n twice (4x too small on 4 devices)", lambda l, o: fsdp(l, o, divide=lambda n: n * n),
     "too small, a factor of the device count"),
    ("divided by a written-in 8", lambda l, o: fsdp(l, o, divide=lambda n: 8), "a factor 4/8"),
    ("two things back", lambda l, o: (lambda p, s, b: (p, s)),
     "shaped like (params, opt_state); expected (params, opt_state, loss), three things"),
]
RIGHT = [("reduce-scatter by hand", scatters_itself), ("loss divided inside, psum of it", mean_loss_inside)]


verdict, test_a_wrong_answer_fails_and_its_feedback_names_the_mistake, \
    test_a_right_answer_written_another_way_passes = fool_tests(ID, WRONG, RIGHT)


# ---- Fresh answers (issue 44), written as learners would: each wrong one fails with what differs (or its mistake,
# where the numbers confirm it); each right one in another form passes.

def _psum_loss(loss_fn, optimizer):
    step = fsdp(loss_fn, optimizer, pmean_loss=False)
    return lambda *a: (lambda p, s, loss: (p, s, jax.lax.psum(loss, A)))(*step(*a))


def _extra_pmean(loss_fn, optimizer):                        # the scattered slices pmean'd once more
    def step(my, opt_state, batch):
        n = jax.lax.axis_size(A)
        loss, grads = jax.value_and_grad(lambda p: loss_fn(jax.tree.map(
            lambda s: jax.lax.all_gather(s, A, tiled=True), p), batch))(my)
        grads = jax.tree.map(lambda g: jax.lax.pmean(g / n, A), grads)
        updates, opt_state = optimizer.update(grads, opt_state, my)
        return optax.apply_updates(my, updates), opt_state, jax.lax.pmean(loss, A)
    return step


def _outputs(*order):                                        # the right step's outputs, in another order
    def make(loss_fn, optimizer):
        step = fsdp(loss_fn, optimizer)

        def reordered(*args):
            new, state, loss = step(*args)
            return tuple({"params": new, "opt_state": state, "loss": loss, None: None}[k] for k in order)
        return reordered
    return make


def _no_params(loss_fn, optimizer):                          # optimizer.update(grads, state): AdamW needs params
    return fsdp(loss_fn, optax.GradientTransformation(optimizer.init, lambda g, s, p=None: optimizer.update(g, s)))


FRESH = [
    ("divided by jax.device_count()", lambda l, o: fsdp(l, o, divide=lambda n: jax.device_count()),
     "2x too small, a factor 4/8"),
    ("the loss summed", _psum_loss, "8x too large, a factor of the device count"),
    ("an extra pmean of the slices", _extra_pmean,
     "a pmean after the reduce-scatter mixes them"),
    ("returns None", lambda l, o: None, "returned None: did it forget"),
    ("(params, loss, opt_state)", _outputs("params", "loss", "opt_state"),
     "shaped like (params, loss, opt_state); expected (params, opt_state, loss)"),
    ("None for the loss", _outputs("params", "opt_state", None), "shaped like (params, opt_state, None)"),
    ("update without params", _no_params, "requires the current value of parameters"),
]


from fooling import fresh_test as _fresh_test  # noqa: E402

test_a_fresh_answer_gets_what_differs = _fresh_test('10.4', FRESH)
