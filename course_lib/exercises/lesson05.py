"""Lesson 05 exercises: the data-parallel step, measuring drift between replicas, a masked loss."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from .. import data, sharding
from . import Case, Mismatch, Mistake, Said, call, describe_tree, diagnose, difference, exercise, watch
from .lesson02 import _moves_data
from .lesson07 import _OWN_OPTIMIZER, _Spy

AXIS = "devices"


def regression_loss(params, batch):
    """Mean squared error of a linear model on one device's shard: ``{"x": (b, d), "y": (b,)}``."""
    pred = batch["x"] @ params["w"] + params["b"]
    return jnp.mean((pred - batch["y"]) ** 2)


# ----------------------------------------------------------------------------------------------
# 05.1 The data-parallel step


def solution_dp_step(loss_fn, optimizer, params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    grads = jax.lax.pmean(grads, axis_name="devices")      # the same gradients on every device
    loss = jax.lax.pmean(loss, axis_name="devices")
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def _copies(tree) -> list[list[np.ndarray]]:
    """Each leaf's per-device copies (pmap layout: copy i is row i, on device i), read where they live."""
    return [[np.asarray(s.data[0]) for s in sorted(leaf.addressable_shards, key=lambda s: s.device.id)]
            for leaf in jax.tree.leaves(tree) if isinstance(leaf, jax.Array) and leaf.ndim]


def _agree(tree, what: str) -> Said:
    same_ = all(np.array_equal(c, cs[0]) for cs in _copies(tree) for c in cs)
    return Said(f"the copies of {what} {'agree' if same_ else 'differ from device to device'}")


def _first_copy(tree):   # a pmap result: every leaf a jax.Array with the device axis first
    return jax.tree.map(lambda leaf: np.asarray(leaf.addressable_shards[0].data[0]), tree)


def _moved(new, old):   # the update, new - old, where the structures match (a factor then reads as the update's)
    try:
        return jax.tree.map(lambda a, b: (a - np.asarray(b)).astype(a.dtype), _first_copy(new), old)
    except (ValueError, TypeError):
        return _first_copy(new)


_STEP_HINTS = {**_OWN_OPTIMIZER, "has no attribute 'tree_map'": "jax.tree_map was removed from JAX: use jax.tree.map.",
               "unbound axis name": f"The axis is named {AXIS!r}: use that name in the collective.",
               "not a valid JAX type": "A function run under pmap returns arrays (or pytrees of them), not strings "
                                       "or other Python objects: return the jax.numpy results."}


def _stepped(fn, case):
    """One pmapped step of ``fn`` on the case: (do the copies agree, new params, new state (device 0's copies),
    each device's loss). The case's loss function records the rows it sees: a gathered batch shows."""
    optimizer, params, x, y, rows, loss = case.args
    devs, seen, spy = jax.devices()[:case.n], [], _Spy(optimizer)

    def loss_fn(p, b):
        seen.append(np.shape(jax.tree.leaves(b)[0])[0] if jax.tree.leaves(b) else 0)
        return loss(p, b)

    step = jax.pmap(functools.partial(fn, loss_fn, spy.transformation()), axis_name=AXIS, devices=devs)
    state = optimizer.update(jax.tree.map(jnp.ones_like, params), optimizer.init(params), params)[1]  # not fresh
    out = call(step, sharding.replicate(params, devs), sharding.replicate(state, devs),
               sharding.shard({"x": x, "y": y}, case.n), name="pmap(dp_step)", hints=_STEP_HINTS)
    if seen and max(seen) > rows:
        raise Mismatch(f"the loss function was called on a batch of {max(seen)} rows; each device's shard has "
                       f"{rows}: every device computed on the gathered global batch, {max(seen) // rows} times the "
                       "work of its own shard. In data parallelism each device computes the gradient of its own "
                       "shard where it lives; the collective averages the gradients.")
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise Mismatch(f"dp_step should return a triple (new_params, new_opt_state, loss), as single_step does; got "
                       f"{describe_tree(out)}.")
    new_params, new_state, loss = out       # any order compares (a swapped triple is a mistake below)
    if new_params is None:
        raise Mismatch(f"new_params is None, where {describe_tree(params)} was expected.")
    if spy.updates == 0:
        raise Mismatch("dp_step never called the update of the optimizer it was given (its optimizer argument): "
                       "the step must work for any optax optimizer, so the averaged gradients go to that "
                       "optimizer's update.")
    return (_agree(new_params, "the parameters"), _agree(new_state, "the optimizer state"),
            _moved(new_params, params), _first_copy(new_state), jax.tree.map(np.asarray, loss))


def _step_with(grads_of=lambda g: jax.lax.pmean(g, AXIS), loss_of=lambda v: jax.lax.pmean(v, AXIS),
               after=None, keep_state=False):
    """A dp_step variant: the gradients and the loss combined by ``grads_of``/``loss_of``; ``after`` averages
    the optimizer's updates instead; ``keep_state`` returns the state it was given."""
    def step(loss_fn, optimizer, params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, new_state = optimizer.update(grads_of(grads), opt_state, params)
        updates = after(updates) if after else updates
        return optax.apply_updates(params, updates), opt_state if keep_state else new_state, loss_of(loss)
    return step


MISTAKES_05_1 = [
    Mistake("no collective", "The copies of the parameters differ after one step: on every case, each device's "
            "update is the one its own shard's gradient alone gives. The gradients that reach the optimizer are not "
            "averaged over the devices.", _step_with(grads_of=lambda g: g)),
    Mistake("psum", "The gradient is the sum of the {n} devices' (what psum gives), not their mean: the update is {n} "
            "times too large, or, with an optimizer that rescales the gradient (Adam, RMSprop), its state holds {n} "
            "times the right gradient.", _step_with(grads_of=lambda g: jax.lax.psum(g, AXIS))),
    Mistake("fixed count", "The average divides by a fixed count, all the devices, not by the number of devices "
            "the step runs on.", _step_with(grads_of=lambda g: jax.tree.map(
                lambda v: jax.lax.psum(v, AXIS) / len(jax.devices()), g))),
    Mistake("averaged after the optimizer", "The parameters are the average of per-device updates, each made "
            "by the optimizer from that device's own gradients: the average was taken AFTER the optimizer (of its "
            "updates, or of the new parameters), not of the gradients it takes. With an optimizer whose update "
            "is not linear in the gradient (Adam, RMSprop, momentum) that is another update, and each device's "
            "optimizer state still follows its own gradients.",
            _step_with(grads_of=lambda g: g, after=lambda u: jax.lax.pmean(u, AXIS))),
    Mistake("own SGD", "The update is the one optax.sgd(0.1) makes, not the one of the optimizer dp_step was "
            "given: the step ignored its optimizer argument.",
            lambda lf, opt, p, s, b: _step_with()(lf, optax.sgd(0.1), p, optax.sgd(0.1).init(p), b)[:1]
            + _step_with()(lf, opt, p, s, b)[1:]),
    Mistake("loss ignored", "The update is the one a mean squared error gives, not the one of the loss_fn dp_step "
            "was given: the step ignored its loss_fn argument.",
            lambda lf, *args: solution_dp_step(regression_loss, *args)),
    Mistake("own loss", "Each device returned the loss of its own shard, not the loss of the global batch: the "
            "loss needs the same average over the devices as the gradients.", _step_with(loss_of=lambda v: v)),
    Mistake("summed loss", "The loss returned is {n} times the loss of the global batch: the {n} per-device "
            "losses were added, not averaged.", _step_with(loss_of=lambda v: jax.lax.psum(v, AXIS))),
    Mistake("params and state averaged", "The parameters and the optimizer state are averages of per-device "
            "results, each made by the optimizer from that device's own gradients: the average was taken AFTER the "
            "optimizer, not of the gradients it takes. With Adam or RMSprop, whose update is not linear in the "
            "gradient, that is another update.", lambda *args: (lambda out: jax.lax.pmean(out[:2], AXIS) + out[2:])(
                _step_with(grads_of=lambda g: g)(*args))),
    *[Mistake(f"order {order}", f"The triple is in the order ({', '.join(order)}): dp_step returns (new_params, "
              "new_opt_state, loss), as single_step does.", lambda *args, order=order: tuple(
                  dict(zip(("new_params", "new_opt_state", "loss"), solution_dp_step(*args)))[k] for k in order))
      for order in itertools.permutations(("new_params", "new_opt_state", "loss"))
      if order != ("new_params", "new_opt_state", "loss")],
    Mistake("stale state", "The optimizer state returned is the one dp_step was given, unchanged: the optimizer "
            "advances its state at every update (Adam its step count and running averages), so the next step "
            "would use a stale one.", _step_with(keep_state=True)),
]


@exercise("05.1", "Write the data-parallel step from the single-device one", solution=solution_dp_step,
          returns="a triple (new_params, new_opt_state, loss): new_params a dict like params ({'w': (d,), 'b': ()} on "
                  "each device), new_opt_state like opt_state, loss one float32 number on each device",
          hints=["Start from single_step: the only thing missing is that every device must apply the SAME "
                 "update, the one for the whole global batch. Averaging the parameters after the update is not "
                 "the same thing: with Adam it gives another update.",
                 "jax.lax.pmean over the 'devices' axis (lesson 04, section 3) averages a pytree over the devices. "
                 "psum would add n gradients, n times too large."])
def check_dp_step(dp_step):
    # Device counts, feature counts, rows per device and optimizers (AdamW's weight decay reads the parameters)
    # vary, so that an answer that fixes any of them, or leaves one out, gives another number somewhere.
    cases = []
    huber = lambda p, b: jnp.mean(optax.huber_loss(b["x"] @ p["w"] + p["b"], b["y"], delta=0.5))  # noqa: E731
    for n, d, rows, name, optimizer, loss in [
            (len(jax.devices()), 3, 16, "SGD", optax.sgd(0.1), regression_loss),
            (len(jax.devices()), 3, 16, "AdamW", optax.adamw(0.1, weight_decay=0.5), regression_loss),
            (4, 4, 10, "SGD with momentum and a Huber loss", optax.sgd(0.05, momentum=0.9), huber),
            (2, 5, 8, "RMSprop", optax.rmsprop(0.01), regression_loss)]:
        x, y, _ = data.regression_data(n=rows * n, d=d, seed=n + d)
        params = {"w": jnp.asarray(np.linspace(-1, 1, d), jnp.float32), "b": jnp.float32(0.3)}
        cases.append(Case((optimizer, params, x, y, rows, loss), f"on {n} devices with {name}", n=n))
    diagnose(dp_step, cases, solution=solution_dp_step, mistakes=MISTAKES_05_1, run=_stepped, rtol=1e-4,
             atol=1e-6, names=("copies", "state copies", "the update of params", "new_opt_state", "loss"))
    return ("gradients averaged with pmean before the update, on 8, 4 and 2 devices with SGD, momentum, AdamW and "
            "RMSprop: the same update and the same optimizer state everywhere, so the copies stay identical.")


# ----------------------------------------------------------------------------------------------
# 05.2 How far apart are the replicas?


def solution_max_divergence(replicated):
    worst = 0.0
    for leaf in jax.tree.leaves(replicated):
        copies = [np.asarray(shard.data) for shard in leaf.addressable_shards]
        for copy in copies[1:]:
            worst = max(worst, float(np.max(np.abs(copy - copies[0]))))
    return worst


def _drift_cases():
    """Replicated trees whose copies drift apart by amounts that differ per device AND per element.

    Yields a ``Case`` per device count n: a dict of leaf name -> (n, ...) array, copy i (row i) on device i.
    The largest difference from device 0's copy is negative, in the middle of a leaf and on a middle device,
    so that the spread over devices (np.ptp), neighbouring differences (np.diff), a mean, a signed maximum, a
    comparison with the last copy, or a look at only some leaves, devices or elements each give another number.
    """
    n_all = len(jax.devices())
    rng = np.random.default_rng(52)
    for n, shapes, worst_leaf in [(n_all, {"b": (3,), "w": (2, 3)}, "w"), (4, {"b": (3,), "w": (4,)}, "b"),
                                  (2, {"bias": (5,), "scale": (), "w_out": (3, 2)}, "w_out")]:   # the worst leaf last
        copies = {}
        for name, shape in shapes.items():
            base = rng.normal(size=shape).astype(np.float32)
            drift = rng.uniform(-0.05, 0.05, size=(n,) + shape).astype(np.float32)
            drift[0] = 0.0
            copies[name] = (base + drift).astype(np.float32)

        def plant(leaf_name, device, offset, element=None):
            leaf = copies[leaf_name]
            spot = tuple(s // 2 for s in leaf.shape[1:]) if element is None else element
            leaf[(device,) + spot] = leaf[(0,) + spot] + np.float32(offset)

        worst = n // 2 if n > 2 else 1
        if n > 2:
            plant(worst_leaf, worst - 1, 0.0625)                 # neighbours: np.diff sees 0.4375, not 0.375
            plant(worst_leaf, min(worst + 1, n - 1), 0.0625)
            plant(worst_leaf, n - 2 if n >= 8 else n - 1, 0.25)  # above the first copy: np.ptp sees 0.625
        if n >= 8:
            plant(worst_leaf, 1, 0.125)                          # the second device alone: 0.125
            plant(worst_leaf, n - 1, -0.0625)                    # against the last copy: 0.3125
            plant("b", 2, 0.1875, element=(1,))                  # the first leaf alone: 0.1875
        plant(worst_leaf, worst, -0.3751)                        # the answer: below the first copy, and
        # not a float16 number: an answer compared in a lower precision gives another one
        last = list(copies)[-1]           # on 2 devices a nested tree (a dict and a list in it): any pytree
        tree = copies if n > 2 else {"layer": {k: v for k, v in copies.items() if k != last}, last: [copies[last]]}
        yield Case((jax.device_put(tree, NamedSharding(sharding.device_mesh(jax.devices()[:n]), P(AXIS))),),
                   f"{len(shapes)} leaves{' in a nested tree' * (n == 2)} on {n} devices, copies that differ per "
                   "device and per element", n=n)


def _per_leaf(measure, leaves=slice(None), combine=max):
    """A mistake of 05.2 as a function of the tree: ``measure`` of each leaf's (n, size) copies, the largest."""
    def fn(tree):
        flat = [np.stack(cs).astype(np.float64).reshape(len(cs), -1) for cs in _copies(tree)][leaves]
        return combine(float(measure(c)) for c in flat)
    return fn


MISTAKES_05_2 = [Mistake(name, f"That is {text}.", fn) for name, text, fn in [
    ("spread", "the spread of the copies (largest minus smallest, over the devices), not the distance of each "
     "copy from the first device's", _per_leaf(lambda c: np.max(np.ptp(c, axis=0)))),
    ("neighbours", "differences between neighbouring devices' copies (device i against device i - 1), not each "
     "copy against the first device's", _per_leaf(lambda c: np.max(np.abs(np.diff(c, axis=0))))),
    ("mean", "the mean of |copy - first device's copy| over every device's elements (the first device's zeros "
     "included), where the largest difference is asked", _per_leaf(lambda c: np.mean(np.abs(c - c[0])))),
    ("mean of the others", "the mean of |copy - first device's copy| over the other devices' elements, where the "
     "largest difference is asked",
     _per_leaf(lambda c: np.mean(np.abs(c[1:] - c[0])))),
    ("signed", "the largest signed difference: a copy below the first one counts as less than zero, when it is as "
     "far apart as one above it", _per_leaf(lambda c: np.max(c - c[0]))),
    ("last copy", "each copy compared with the LAST device's copy, not the first device's",
     _per_leaf(lambda c: np.max(np.abs(c - c[-1])))),
    ("two devices", "only the second device's copy compared with the first: the other devices were left out",
     _per_leaf(lambda c: np.max(np.abs(c[1] - c[0])))),
    ("first element", "only the first element of each leaf compared: the other elements were left out",
     _per_leaf(lambda c: np.max(np.abs(c[:, 0] - c[0, 0])))),
    ("first leaf", "only the first leaf (in jax.tree.leaves order) compared: the other leaves were left out",
     _per_leaf(lambda c: np.max(np.abs(c - c[0])), slice(0, 1))),
    ("last leaf", "only the last leaf compared: the other leaves were left out",
     _per_leaf(lambda c: np.max(np.abs(c - c[0])), slice(-1, None))),
    ("sum", "a sum of the differences, not the largest one",
     _per_leaf(lambda c: np.sum(np.abs(c - c[0])), combine=sum)),                  # the sum over the leaves
    ("relative", "a relative difference (each difference divided by the first copy's value), not the absolute "
     "difference: the replicas should hold the same numbers, whatever their size",
     _per_leaf(lambda c: np.max(np.abs(c - c[0]) / np.maximum(np.abs(c[0]), 1e-30)))),
    ("norm", "the length (norm) of each copy's difference vector, not the largest difference of one element",
     _per_leaf(lambda c: np.max(np.linalg.norm(c - c[0], axis=1)))),
    ("zero", "0 on every case, where the copies differ: no difference between them reached the result", lambda t: 0),
]]


_COLLECTIVES = {"all_gather", "all_gather_invariant", "psum", "psum_invariant", "pmax", "pmin", "ppermute",
                "all_to_all", "reduce_scatter", "pbroadcast"}


def _gathers(fn, tree) -> str | None:
    """How ``fn(tree)`` gathered the copies, if it did: through the global array (a device-to-device copy), a
    leaf read whole on the host (``np.asarray`` or ``jax.device_get`` of the global array brings every device's
    copy at once), or a collective run on them. Watched while it runs: ``ArrayImpl._value`` is what every host
    read of an array goes through, and a primitive's ``bind`` what tracing a collective goes through (JAX's caches
    cleared, so that none is hidden)."""
    from jax._src import array as _array, core as _core
    leaves, read, used = {id(x) for x in jax.tree.leaves(tree)}, [], set()
    value, bind = _array.ArrayImpl.__dict__["_value"], _core.Primitive.bind

    def watched_value(self):
        if id(self) in leaves:
            read.append(self.shape)
        return value.__get__(self)

    def watched_bind(prim, *args, **params):
        used.add(prim.name)
        return bind(prim, *args, **params)

    # Reading each copy where it lives moves data from each device to the host, never between devices
    if _moves_data(fn, tree, guard=lambda: jax.transfer_guard_device_to_device("disallow")):
        return ("it was computed from the global view: it moved data from device to device (jax.numpy on a whole "
                "leaf, e.g. subtracting one row from it, sends the first device's copy to every other device)")
    jax.clear_caches()
    if not watch(fn, (tree,), [(_array.ArrayImpl, "_value", property(watched_value)),
                               (_core.Primitive, "bind", watched_bind)]):
        return None                  # it ran in the checker already: this run only watches how
    if read:
        return (f"it read a whole leaf, shape {read[0]}, on the host: the global array holds all the devices' "
                "copies, and reading it (np.asarray, jax.device_get, .tolist()) gathers them into one host array")
    if used & _COLLECTIVES:
        return (f"it ran a collective ({', '.join(sorted(used & _COLLECTIVES))}) on the copies, gathering them "
                "between devices")
    return None


@exercise("05.2", "Measure how far the replicas have drifted apart", solution=solution_max_divergence,
          returns="one number (a float): the largest absolute difference between any device's copy of any leaf "
                  "and the first device's copy",
          hints=["Each leaf is one array with a copy on every device; compare each copy with the first, leaf by "
                 "leaf, and keep the worst difference over all of them.",
                 "jax.tree.leaves gives the leaves; a leaf's addressable_shards (lesson 02, exercise 02.3) hold "
                 "each device's copy where it lives; np.asarray brings one copy to the host."])
def check_max_divergence(max_divergence):
    cases = [Case((sharding.replicate({"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.float32(1.0)}),),
                  "for identical copies"), *_drift_cases()]
    apart = {"incompatible devices": "Each copy lives on its own device, and JAX computes only with arrays on the "
                                     "same devices: this answer combined copies that live on different devices."}
    diagnose(max_divergence, cases, solution=solution_max_divergence, mistakes=MISTAKES_05_2, rtol=1e-6, atol=1e-7,
             run=lambda fn, case: call(fn, *case.args, name="max_divergence", hints=apart))
    for case in cases:
        how = _gathers(max_divergence, *case.args)
        if how:
            raise Mismatch(f"{case.label}: the value is right, but {how}. The exercise reads each device's copy "
                           "where it lives, one copy at a time.")
    return "it finds the largest difference between any device's copy and the first one, on 8, 4 and 2 devices."


# ----------------------------------------------------------------------------------------------
# 05.3 A loss that ignores padding


def solution_masked_mse(pred, y, mask):
    mask = mask.astype(pred.dtype)
    return jnp.sum(mask * (pred - y) ** 2) / jnp.maximum(jnp.sum(mask), 1.0)


def _squared(pred, y, mask):
    return mask.astype(pred.dtype) * (pred - y) ** 2


MISTAKES_05_3 = [
    Mistake("padding counted", "That is the mean over all rows: the padding rows counted as if they were real.",
            lambda p, y, m: jnp.mean((p - y) ** 2)),
    Mistake("divided by all rows", "The padding rows are left out of the sum, but the sum is divided by all the "
            "rows, not by the real ones.", lambda p, y, m: jnp.sum(_squared(p, y, m)) / p.shape[0]),
    Mistake("absolute error", "That is the mean ABSOLUTE error over the real rows, |pred - y|; the mean squared "
            "error squares each row's error.",
            lambda p, y, m: jnp.sum(m * jnp.abs(p - y)) / jnp.maximum(jnp.sum(m), 1)),
    Mistake("first rows", "That is the mean over the FIRST rows, as many as are real: the mask says which rows "
            "are real, and they need not be the first ones.",
            lambda p, y, m: jnp.mean(((p - y) ** 2)[:int(np.sum(m))]) if np.sum(m) else jnp.float32(0)),
    Mistake("0 / 0", "With no real rows the count is 0, and 0 / 0 is NaN: it must stay finite (0.0), or the NaN "
            "spreads to every device through the gradient average.",
            lambda p, y, m: jnp.sum(_squared(p, y, m)) / jnp.sum(m)),
    Mistake("mask inverted", "That is the mean over the PADDING rows: the mask was inverted (True marks the real "
            "rows, the ones to keep).", lambda p, y, m: solution_masked_mse(p, y, ~m)),
    Mistake("root", "That is the square root of the mean squared error (an RMSE): the exercise asks for the mean of "
            "the squares itself.", lambda p, y, m: jnp.sqrt(solution_masked_mse(p, y, m))),
]


@exercise("05.3", "A mean squared error that ignores padding", solution=solution_masked_mse,
          returns="one number (a 0-d array): the mean of (pred - y) ** 2 over the rows where mask is True, "
                  "0.0 when there are none",
          hints=["Padding rows must count for nothing in the sum AND in the count you divide by; and a device "
                 "may get only padding.",
                 "A boolean array's astype method (to a float dtype), and jnp.maximum."])
def check_masked_mse(masked_mse):
    rng = np.random.default_rng(5)
    cases = []
    # The real rows come first in data.batches, but a mask may mark any rows: the last case scatters them, so an
    # answer that assumes the first k rows are the real ones gives another number.
    for mask in [np.arange(8) < 5, np.ones(16, bool), np.arange(4) < 1, np.array([0, 0, 0, 1, 0, 1, 0, 1, 1, 1], bool)]:
        pred, y = jnp.asarray(rng.normal(size=(2, mask.size)), jnp.float32)   # y in the padding rows too: not 0
        cases.append(Case((pred, y, jnp.asarray(mask)), f"masked_mse with {mask.sum()} real rows of {mask.size}"
                          + ("" if mask[0] else f" (mask {mask.astype(int)})")))
    cases.append(Case((jnp.ones(4), jnp.zeros(4), jnp.zeros(4, bool)), "masked_mse with no real rows at all (a "
                      "device that got only padding)"))
    engine = dict(solution=solution_masked_mse, mistakes=MISTAKES_05_3, name="masked_mse")
    diagnose(masked_mse, cases[:-1], **engine)
    traced = "A loss runs inside jax.grad and a compiled (pmap/jit) step, where its inputs are tracers: "
    python_value = traced + ("float(), int(), bool(), np.asarray(), np.float32() or a Python if on a value need a "
                             "concrete number, and a traced value has none: keep the computation in jax.numpy.")
    call(jax.jit(jax.grad(masked_mse)), jnp.ones(4), jnp.zeros(4), jnp.arange(4) < 2,
         name="jax.jit(jax.grad(masked_mse))",
         hints={"boolean indices": traced + "indexing with a boolean mask would give a shape that depends on the "
                                   "values, which a compiled program cannot have. Keep every row and let the mask "
                                   "weight them instead.",
                "Concretization": python_value, "boolean conversion": python_value,
                "__array__() was called on traced array": python_value})
    diagnose(masked_mse, cases, **engine)
    grad = np.asarray(jax.grad(masked_mse)(jnp.ones(4), jnp.zeros(4), jnp.zeros(4, bool)))
    if not np.all(np.isfinite(grad)):
        raise Mismatch(f"with no real rows masked_mse returns 0.0, but its gradient there is {grad}: the "
                       "0 / 0 is still computed, and choosing 0.0 afterwards (jnp.where, jnp.nan_to_num) hides it "
                       "in the value, not in the gradient. The NaN gradient reaches every device through the "
                       "gradient average.")
    if wrong := difference(*(jax.grad(f)(*cases[0].args) for f in (masked_mse, solution_masked_mse)), rtol=1e-4):
        raise Mismatch(f"{cases[0].label}: the value is right, but its gradient with respect to pred differs "
                       f"({wrong}): training follows the gradient, not the value.")
    return ("padding rows count for nothing, wherever they are, and a device with only padding gives 0, not NaN, "
            "in the value and in the gradient.")
