"""Lesson 07 exercises: porting pmap code to shard_map, and a whole training step to a mesh."""

import contextlib
import re
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from ..hlo import compiled_collectives
from . import (Case, Mismatch, Mistake, _inner, call, describe_tree, diagnose, exercise, expect_placed_on,
               placement, primitives, same, watch)
from .lesson06 import AXIS, _mesh, _spec
from .lesson12 import _or_none


# ----------------------------------------------------------------------------------------------
# 07.1 Port a pmap function with a broadcast argument and a replicated output to shard_map


def pmap_version(x, w):
    """The pmap code to port: x (n, b, d) one block per device, w (d, k) broadcast -> ((n, b, k), (k,))."""
    def per_device(xb, wb):
        h = jnp.tanh(xb @ wb)
        return h, jax.lax.psum(h.sum(axis=0), "i")

    return jax.pmap(per_device, in_axes=(0, None), out_axes=(0, None), axis_name="i")(x, w)


def solution_ported(x, w, mesh):
    def per_device(xb, wb):                 # xb: this device's rows (B // n, d); wb: all of w
        h = jnp.tanh(xb @ wb)
        return h, jax.lax.psum(h.sum(axis=0), "i")

    return jax.shard_map(per_device, mesh=mesh, in_specs=(P("i"), P()), out_specs=(P("i"), P()))(x, w)


_SUMS = ("psum", "psum_invariant", "psum2", "reduce_scatter", "psum_scatter", "all_gather")   # then a sum


def _mesh_retry(mesh, build):
    """``build()``; if JAX refused a set_mesh in it, ``build()`` again with ``mesh`` entered and ``jax.set_mesh`` a
    no-op inside (for an answer that enters a mesh itself: JAX refuses set_mesh while a program is traced)."""
    try:
        return build()
    except Exception as e:  # noqa: BLE001: the learner's code; the second try raises what it raises
        if "set_mesh" not in str(e):
            raise
    real = jax.set_mesh
    with real(mesh), contextlib.ExitStack() as stack:
        for m in (jax, jax.sharding):
            if getattr(m, "set_mesh", None) is real:
                stack.enter_context(mock.patch.object(m, "set_mesh", lambda *a, **k: contextlib.nullcontext()))
        return build()


def _shard_maps(fn, *args, name, mesh):
    """(the shard_map equation, the names of the collectives inside it) for each shard_map in ``fn(*args)``'s
    program (pmap shows as one too: jit(shard_map(..., check_vma=False)) on stacked blocks)."""
    return [(eqn, {e.primitive.name for e in _inner(eqn.params)})
            for eqn in _mesh_retry(mesh, lambda: primitives(fn, *args, name=name)) if eqn.primitive.name == "shard_map"]


def _ported_as(reduce=jax.lax.psum, out_specs=(P("i"), P()), axis=0, order=slice(None)):
    """The port with one mistake: another collective (or none), other out_specs (nothing checks them), the sums
    along another axis, the outputs in another order."""
    def ported(x, w, mesh):
        def per_device(xb, wb):
            h = jnp.tanh(xb @ wb)
            return h, reduce(h.sum(axis=axis), "i") if reduce else h.sum(axis=axis)
        return jax.shard_map(per_device, mesh=mesh, in_specs=(P("i"), P()), out_specs=out_specs,
                             check_vma=False)(x, w)[order]
    return ported


_PMAP_SUMS = " The pmap version adds up every device's sums."
MISTAKES_07_1 = [
    Mistake("pmean", "The column sums are the total divided by {n}: the mean over the devices, not their sum."
            + _PMAP_SUMS, _ported_as(jax.lax.pmean)),
    Mistake("no collective", "No collective adds the devices' column sums: JAX refuses the out_specs P() of a "
            "value it cannot verify is the same on every device, and with check_vma off the output is device 0's "
            "sums only. Add the collective." + _PMAP_SUMS,
            _ported_as(None)),
    Mistake("total stacked", "The column sums came back once per device, stacked: out_specs naming 'i' stacks the "
            "devices' values; this one is the same on every device, and pmap's out_axes=None returned it once.",
            _ported_as(out_specs=(P("i"), P("i")))),
    Mistake("rows claimed replicated", "tanh(x @ w) came back as one device's block: an out_specs entry naming no "
            "axis claims the output is the same on every device and returns a single block (JAX refuses that "
            "claim where it can check it; with check_vma=False nothing does): name the axis the rows are split "
            "over.", _ported_as(out_specs=(P(), P()))),
    Mistake("swapped", "The two outputs are swapped: return (tanh(x @ w), column sums), in that order.",
            _ported_as(order=slice(None, None, -1))),
    Mistake("row sums", "The second output holds each row's sum (along axis 1), not the column sums: sum the "
            "rows of tanh(x @ w), along axis 0, and add the devices' sums.", _ported_as(axis=1)),
]
_SPEC_HINTS = {
    **dict.fromkeys(("marked as manual", "not found in mesh"), "A spec or a collective names a mesh axis that this "
                    "mesh does not have: its only axis is 'i'."),
    "Closing over inputs": "An in_specs entry is None: pmap's in_axes=None (every device gets all of it) is P() in "
                           "shard_map's in_specs (lesson 07, migration table).",
    "pytree structure error": "shard_map's specs do not match the arguments or outputs: one spec per argument and "
                              "per output, and no None (pmap's out_axes=None is P() in out_specs: migration table).",
    "should match the mesh passed to shard_map": "A shard_map (pmap is one too) was built on another mesh than the "
                                                 "one you were given: build on that mesh.",
}
# JAX's long message (device ids, a cut-off location) in one sentence
_OTHER_MESH = {"incompatible devices": "the shard_map runs on another mesh than the one its inputs live on: use the "
                                       "mesh you were given."}
_PORT_SUMMARIES = {**_OTHER_MESH, "passed args[1] of": "w is split over 'i' too. w is broadcast in the pmap version "
                   "(in_axes=None), so every device needs all of it, and its in_specs entry should split nothing."}
_PORT_HINTS = {**_SPEC_HINTS,
               "does not match the specs of the input": "in_specs must match how the inputs are placed: x split "
                                                        "over 'i', w whole on every device.",
               "unbound axis name": "A collective names an axis that only exists inside shard_map: compute the "
                                    "total in the per-device function."}
_AXIS_USE = re.compile(r"(?:psum|pmean|pcast|all_gather|psum_scatter|axis_index|axis_size)\((?:[^()]|\([^()]*\))*?"
                       r"[\"'](\w+)[\"']")


def _bare_assertion(fn, text: str):
    """JAX's bare AssertionError (no message) for a collective or pcast naming an axis the mesh lacks, in words."""
    if "raised AssertionError:" not in text:
        return
    import inspect
    named = set()
    with contextlib.suppress(OSError, TypeError):
        named = set(_AXIS_USE.findall(inspect.getsource(fn))) - {AXIS, "varying", "invarying"}
    said = (f"your collective or pcast names axis {sorted(named)[0]!r}, but the mesh's only axis is 'i'" if named
            else "the known cause is a collective or pcast naming an axis the mesh does not have (its only axis is "
                 "'i'; section 2's mesh names it 'data')")
    raise Mismatch(f"JAX raised a bare AssertionError while tracing your per-device code: {said}.") from None


_REFUSED: list = []    # the cases of the answer being checked that JAX refused and that ran with check_vma off
_KEPT: list = []       # (make, what it left undonated), said by 07.2 once the values are right


def _unchecked(run, fn, case, solution, refused):
    """``run(fn, case)`` with check_vma off, for diagnose to name its mistake or say what differs, where JAX refused
    an output declared P() that it types as varying. Right numbers raise what JAX refused."""
    real = jax.shard_map
    try:
        with mock.patch.object(jax, "shard_map", lambda *a, **k: real(*a, **{**k, "check_vma": False})):
            got = run(fn, case)
    except Mismatch:             # JAX's words (less the name of its own inner function), and the course's
        raise Mismatch(re.sub(r" applied to the function '\w+'", "", str(refused)) + _TYPED) from None
    _REFUSED.append(case)
    if not same(got, run(solution, case), rtol=1e-4, atol=1e-5):
        return got
    raise Mismatch("JAX refused an out_specs entry P() (the same on every device) for a value it types as varying "
                   "over 'i'; with check_vma off your numbers are right." + _TYPED) from None


_TYPED = (" A value is typed the same everywhere only when it comes from a reduction over 'i' (psum, pmean), from "
          "all_gather(..., to='invarying') or from replicated inputs alone (lesson 06, section 3).")


def _port_runner(fn, case):
    x, w, mesh = case.args
    try:
        return call(fn, x, w, mesh, name="ported", hints=_PORT_HINTS, summaries=_PORT_SUMMARIES)
    except Mismatch as e:
        text = str(e)
        _bare_assertion(fn, text)
        if "raised KeyError: 'i'" in text:
            pmapped, real = [], jax.pmap
            watch(fn, case.args, [(jax, "pmap", lambda *a, **k: pmapped.append(1) or real(*a, **k))])
            raise Mismatch("the port raised KeyError: 'i'. " + (
                "That is what jax.pmap does with arrays already placed on a mesh with an Explicit axis, as x and w "
                "are here. The port replaces pmap: the per-device function runs under jax.shard_map on the given "
                "mesh, on the global x with no reshape (lesson 07, migration table)." if pmapped else "JAX looked "
                "for the axis 'i' of the mesh x and w are placed on, and did not find it where your code ran them: "
                "build the shard_map on the `mesh` argument.")) from None
        size = re.search(r"mesh given has shape \((\d+),\)", text)
        if size and int(size.group(1)) != mesh.size:
            raise Mismatch(f"{case.label} raised an error: its shard_map ran on a mesh of {size.group(1)} devices, "
                           f"not on the mesh of {mesh.size} it was given, and x's {x.shape[0]} rows do not split "
                           "over that many. Build the shard_map on the `mesh` argument.") from None
        if "can't be statically inferred" in text:
            return _unchecked(lambda f, c: call(f, *c.args, name="ported"), fn, case, solution_ported, e)
        raise


@exercise("07.1", "Port a pmap function with a broadcast argument and a replicated output",
          solution=solution_ported,
          returns="a pair: tanh(x @ w) of shape (B, k) split by rows over 'i', and its column sums over the "
                  "global batch, shape (k,), replicated",
          hints=["Go through pmap's arguments one by one: which argument is divided between the devices, which "
                 "one does every device need whole, which output differs per device and which is the same "
                 "everywhere? shard_map works on the global shapes: no reshape to (n, b, ...).",
                 "Lesson 07's migration table: row 2 (in_axes=None), row 3 (out_axes=None and the collective that "
                 "makes it checkable) and row 1 (the axis name). The per-device body needs no change.",
                 "Translate pmap's arguments one entry at a time: axis_name into the mesh's axis, each in_axes "
                 "entry into an in_specs entry, each out_axes entry into an out_specs entry (a value that differs "
                 "per device names the axis, one that is whole or the same everywhere names none), on the mesh "
                 "you were given. Keep the per-device function, its collective included."])
def check_ported(ported):
    rng = np.random.default_rng(6)
    cases = []
    for n, b, d, k in [(len(jax.devices()), 2, 3, 4), (4, 3, 5, 2), (2, 5, 2, 3)]:
        mesh = _mesh(n)
        x = jax.device_put(rng.normal(size=(n * b, d)).astype(np.float32), NamedSharding(mesh, P(AXIS)))
        w = jax.device_put(rng.normal(size=(d, k)).astype(np.float32), NamedSharding(mesh, P()))
        cases.append(Case((x, w, mesh), f"ported(x {x.shape}, w {w.shape}) on {n} devices", n=n))
    try:
        results = diagnose(ported, cases, solution=solution_ported, mistakes=MISTAKES_07_1, run=_port_runner,
                           name="ported", rtol=1e-4, atol=1e-5)
    except Mismatch as e:                  # the pmap layout kept, when the program shows it
        x, w, mesh = cases[0].args
        maps = []
        with contextlib.suppress(Mismatch):
            maps = _shard_maps(lambda a, c: ported(a, c, mesh), x, w, name="ported", mesh=mesh)
        if any(len(v.aval.shape) == 3 for eqn, _ in maps for v in eqn.invars if hasattr(v.aval, "shape")):
            raise Mismatch(f"{e} Your shard_map runs on x reshaped to stacked blocks (n, B // n, d), pmap's layout: "
                           "shard_map hands each device a block of the same rank as the global array (its rows, no "
                           "leading device axis), so pass x with no reshape.") from None
        raise
    for case, (h, total) in zip(cases, results):
        x, w, mesh = case.args
        (n, b), d, what = (mesh.size, x.shape[0] // mesh.size), x.shape[1], case.label
        expect_placed_on(h, mesh.devices.flat, what=f"{what}: tanh(x @ w)", in_order=True)
        if isinstance(total, jax.Array):        # pmap's out_axes=None output: on every device of the mesh
            expect_placed_on(total, mesh.devices.flat, what=f"{what}: the total of the column sums", split=False)
        maps = _shard_maps(lambda a, c: ported(a, c, mesh), x, w, name="ported", mesh=mesh)
        if not maps:
            raise Mismatch(f"{what} has the right values but does not use jax.shard_map.")
        if len(maps) > 1 or not any("tanh" in names for _, names in maps):
            raise Mismatch(f"{what} has the right values, but its program runs {len(maps)} shard_map(s), "
                           f"{'none' if len(maps) == 1 else 'not one'} with tanh(x @ w) inside: the exercise ports "
                           "the per-device function, whole, into one jax.shard_map.")
        for eqn, _ in maps:
            if (n, b, d) in [tuple(v.aval.shape) for v in eqn.invars if hasattr(v.aval, "shape")]:
                how = "a shard_map" if eqn.params.get("check_vma", True) else "jax.pmap"
                raise Mismatch(f"{what} has the right values, but its program still runs {how} on stacked blocks: "
                               f"x reshaped to ({n}, {b}, {d}), one per device, pmap's layout. The exercise is the "
                               "port itself.")
        for m in {getattr(getattr(a, "sharding", None), "mesh", mesh) for a in (h, total)} - {mesh}:
            raise Mismatch(f"{what}: the results live on {m} (devices {[d.id for d in m.devices.flat]}), another "
                           f"mesh than the one given, {mesh} (devices {[d.id for d in mesh.devices.flat]}). The port "
                           "runs on the mesh it is given: build on the `mesh` argument.")
        if tuple(_spec(h) or ())[:1] != (AXIS,):
            raise Mismatch(f"{what}: tanh(x @ w) has sharding {_spec(h)}; expected the rows split over 'i', as x was.")
        if not any(names & set(_SUMS) for _, names in maps):
            raise Mismatch(f"{what} has the right values, but no shard_map in it combines the devices' sums with "
                           "psum, psum_scatter or all_gather, as pmap's psum does: port the pmap version as it is, "
                           "collective included, into one shard_map.")
    return ("the pmap version's program on a mesh: x split, w whole, the rows returned split and the psum total "
            "returned once, on 8, 4 and 2 devices.")


# ----------------------------------------------------------------------------------------------
# 07.2 The training step in shard_map form, for any loss and any optax optimizer


def mlp_loss(params, x, y):
    """A small classifier: x (B, d) float32, y (B,) int32 class labels -> the mean cross entropy."""
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    logits = hidden @ params["w2"] + params["b2"]
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))


def image_loss(params, x, y):
    """A linear classifier on (B, 2, 3) inputs: flattened, then one dense layer -> the mean cross entropy."""
    logits = x.reshape(x.shape[0], -1) @ params["dense"]["kernel"] + params["dense"]["bias"]
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))


def regression_loss(params, x, y):
    """Linear regression: x (B, 4), y (B,) float32 -> the mean squared error."""
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def solution_make_sharded_step(loss_fn, optimizer, mesh):
    def per_device(params, opt_state, x, y):             # x, y: this device's rows
        local = jax.tree.map(lambda p: jax.lax.pcast(p, "i", to="varying"), params)
        loss, grads = jax.value_and_grad(loss_fn)(local, x, y)
        grads, loss = jax.lax.pmean((grads, loss), "i")  # each device's own gradient, averaged
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    step = jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P(), P("i"), P("i")), out_specs=(P(), P(), P()))
    return jax.jit(step, donate_argnums=(0, 1))


class _Spy:
    """Wraps an optax optimizer and counts the calls of its update while the learner's step is traced."""

    def __init__(self, tx):
        self.tx, self.updates = tx, 0

    def transformation(self):
        def update(grads, state, params=None, **extra):
            self.updates += 1
            return self.tx.update(grads, state, params, **extra)
        return optax.GradientTransformation(self.tx.init, update)


def _cases(rng):
    """(devices, loss, params, batches, optimizer, label): another model, batch and optimizer in each case."""
    n0 = len(jax.devices())
    f32 = lambda *shape: rng.normal(size=shape).astype(np.float32)
    labels = lambda k, rows: rng.integers(0, k, size=rows).astype(np.int32)
    return [(n0, regression_loss, {"w": f32(4) * 0.5, "b": np.float32(0.3)},
             [(f32(3 * n0, 4), f32(3 * n0)) for _ in range(3)], optax.sgd(0.1), "plain SGD (learning rate 0.1)"),
            (2, image_loss, {"dense": {"kernel": f32(6, 4) * 0.3, "bias": np.zeros(4, np.float32)}},
             [(f32(2 * 5, 2, 3), labels(4, 2 * 5)) for _ in range(3)], optax.sgd(0.05, momentum=0.9),
             "SGD with momentum 0.9"),
            (4, mlp_loss, {"w1": f32(5, 8) * 0.5, "b1": f32(8) * 0.1, "w2": f32(8, 3) * 0.5,
                           "b2": np.zeros(3, np.float32)},
             [(f32(4 * 4, 5), labels(3, 4 * 4)) for _ in range(3)],
             optax.chain(optax.clip_by_global_norm(0.5), optax.adamw(0.05, weight_decay=0.1)),
             "gradient clipping (global norm 0.5) before AdamW (weight decay 0.1)")]   # last: Adam hides a scale


def _step_as(pcast=True, reduce=jax.lax.pmean, loss_reduce=jax.lax.pmean, state="new", check_vma=True,
             after=False):
    """make_sharded_step with one mistake: no pcast, another collective (or none), the loss of one device, the
    state that came in returned ("old") or not read ("init"), each device's own update averaged after."""
    def make(loss_fn, optimizer, mesh):
        def per_device(params, opt_state, x, y):
            local = jax.tree.map(lambda p: jax.lax.pcast(p, "i", to="varying"), params) if pcast else params
            loss, grads = jax.value_and_grad(loss_fn)(local, x, y)
            grads = reduce(grads, "i") if reduce else grads
            loss = loss_reduce(loss, "i") if loss_reduce else loss
            if after:
                updates, new = optimizer.update(grads, jax.lax.pcast(opt_state, "i", to="varying"), local)
                return *jax.lax.pmean((optax.apply_updates(local, updates), new), "i"), loss
            updates, new = optimizer.update(grads, optimizer.init(params) if state == "init" else opt_state, params)
            return optax.apply_updates(params, updates), opt_state if state == "old" else new, loss
        return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P(), P("i"), P("i")),
                                     out_specs=(P(), P(), P()), check_vma=check_vma), donate_argnums=(0, 1))
    return make


_SUMMED = ("Under shard_map, the gradient of a replicated (P()) parameter that is not marked varying comes back "
           "already summed over the devices (lesson 06, section 3)")
RESTARTED = ("Every step's numbers are those of a fresh optimizer.init state: the opt_state passed in is never read, "
             "so momentum and Adam's moments never build up.")          # 07.2's and 10.4's "state restarted"
MISTAKES_07_2 = [
    Mistake("gradient summed", "The optimizer was fed {n} times the mean gradient: the devices' gradients "
            "were summed, not averaged. Two ways give that: a psum (it sums), or a pmean of gradients that were "
            "already sums. " + _SUMMED + ". Count the sums your step makes.", _step_as(reduce=jax.lax.psum)),
    Mistake("summed twice", "The optimizer was fed the gradient summed twice over the devices ({n} x {n} times "
            "the mean). " + _SUMMED + ", and a psum sums too: count the sums your step makes.",
            _step_as(pcast=False, reduce=jax.lax.psum)),
    Mistake("own gradient", "The devices' gradients were never averaged: each device fed its optimizer its own "
            "gradient, from its rows only. JAX refuses to return such parameters as P() (they differ per device); "
            "with check_vma off the output is device 0's, the numbers shown.", _step_as(reduce=None, check_vma=False)),
    Mistake("loss of device 0", "The loss is that of device 0's rows only: average the loss over the devices "
            "too, not only the gradients.", _step_as(loss_reduce=None, check_vma=False)),
    Mistake("gradient and loss summed", "The optimizer was fed {n} times the mean gradient, and the loss is {n} "
            "times the mean loss: a psum of (grads, loss) sums both; the step needs their mean.",
            _step_as(reduce=jax.lax.psum, loss_reduce=jax.lax.psum)),
    Mistake("old optimizer state", "The optimizer state returned is the one that came in: return the new state "
            "that optimizer.update gives, or the next step starts from the old one.", _step_as(state="old")),
    Mistake("state restarted", RESTARTED, _step_as(state="init")),
    Mistake("averaged after the optimizer", "Each device ran the optimizer on its own gradient, and the results "
            "were averaged afterwards: that equals the update of the averaged gradient only for an optimizer linear "
            "in the gradient (SGD, momentum), not with clipping or Adam. Average the gradients first.",
            _step_as(reduce=None, after=True)),
]


def _steps_runner(make, case, unchecked=False):
    """Run ``make(loss, optimizer, mesh)``'s step for 3 steps: [(params, opt_state, loss) after each]; mechanism
    facts (the step, the optimizer calls, donation, placement) raise here."""
    n, loss_fn, params0, batches, tx, label = case.args
    mesh, where, spy = _mesh(n), f"on {n} devices with {label} ({loss_fn.__name__})", _Spy(tx)
    step = call(make, loss_fn, spy.transformation(), mesh, name="make_sharded_step")
    if not callable(step):
        raise Mismatch(f"make_sharded_step should return the step function; got {describe_tree(step)}.")
    replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P(AXIS))
    params, opt_state = jax.device_put((params0, tx.init(params0)), replicated)
    out = []
    with jax.set_mesh(mesh):
        for i, batch in enumerate(batches):
            try:
                got = call(step, params, opt_state, *jax.device_put(batch, split), name="step", hints=_STEP_HINTS,
                           summaries=_OTHER_MESH)
            except Mismatch as e:
                _bare_assertion(make, str(e))
                if "can't be statically inferred" in str(e) and not unchecked:
                    return _unchecked(lambda m, c: _steps_runner(m, c, unchecked=True), make, case,
                                      solution_make_sharded_step, e)
                if spy.updates or "State" not in str(e) or any(f in str(e) for f in _STEP_HINTS):
                    raise
                got = e                  # an error from another optimizer's state: said with what comes next
            if spy.updates == 0:
                raise Mismatch(f"the step {where} never calls the optimizer it was given (its update)"
                               + (f", and fails: {got}" if isinstance(got, Mismatch) else ".") + " make_sharded_step "
                               "must work for any optax optimizer: feed the gradients to that optimizer's update.")
            swapped = next((k for k in (0, 2) if isinstance(got, (tuple, list)) and len(got) == 3 and  # the state
                            jax.tree.structure(got[k]) == jax.tree.structure(opt_state) != jax.tree.structure(got[1])),
                           None)
            if swapped is not None or not isinstance(got, (tuple, list)) or len(got) != 3:
                raise Mismatch(f"step should return a triple (params, opt_state, loss), in that order; step {i + 1} "
                               f"{where} returned " + (describe_tree(got) if swapped is None else
                                                       f"the optimizer state as output [{swapped}]") + ".")
            kept = [name for name, tree in (("parameters", params), ("optimizer state", opt_state))
                    if not all(getattr(a, "is_deleted", lambda: False)() for a in jax.tree.leaves(tree))]
            if i == 0 and kept:          # said once the values are right: jit drops the donation of an unread input
                how = "does not donate them" if hasattr(step, "lower") else "is not jitted (nothing donates them)"
                _KEPT.append((make, f"after step 1 {where}, the {' and the '.join(kept)} passed in still "
                              f"exist{'s' if kept == ['optimizer state'] else ''}: the step {how}, so the devices "
                              "hold two copies of the state while it runs. Tell jax.jit which arguments it may reuse "
                              "(lesson 07, section 2, donation)."))
            for leaf in jax.tree.leaves(got[:2]):      # a host array (NumPy) too: the next step would move it
                if not isinstance(leaf, jax.Array) or (set(leaf.devices()) != set(mesh.devices.flat)
                                                       or not leaf.sharding.is_fully_replicated):
                    spec = "" if _spec(leaf) is None else f"with sharding {_spec(leaf)} "
                    raise Mismatch(f"the state after step {i + 1} {where} has a leaf {spec}{placement(leaf)}: it "
                                   f"should be replicated on all {n} devices of the mesh, as it came in, ready for the "
                                   "next step.")
            if i == 0:                   # the first update leads: with SGD a factor of the gradient shows in it
                same_tree = jax.tree.structure(got[0]) == jax.tree.structure(params0)
                out.append(jax.tree.map(lambda a, b: np.asarray(np.asarray(a) - b, np.asarray(a).dtype), got[0],
                                        params0) if same_tree else got[0])
            params, opt_state = got[0], got[1]
            out += jax.tree.map(np.asarray, tuple(got))
            if params is None or opt_state is None:      # nothing to feed back: diagnose names the None
                return tuple(out) + (None,) * (len(_STEP_NAMES) - len(out))
    return tuple(out)


_STEP_NAMES = ("step 1's update (new params - params)", *(f"step {i}'s {what}" for i in (1, 2, 3)
                                                          for what in ("new params", "opt_state", "loss")))
@exercise("07.2", "The training step in shard_map form, for any loss and optimizer",
          solution=solution_make_sharded_step,
          returns="a jitted step(params, opt_state, x, y) -> (params, opt_state, loss) built with jax.shard_map: "
                  "params and opt_state replicated on the mesh (and donated), x and y split over 'i', loss a scalar",
          hints=["Write the step as per-device code: each device sees its own rows and a whole copy of the "
                 "parameters. Which gradient must reach the optimizer, and what does shard_map already do to the "
                 "gradient of a replicated parameter?",
                 "Lesson 07, section 2: the jit(shard_map) step (with SGD by hand) and, at the end of the section, "
                 "the optax step with donate_argnums; lesson 06, section 3, for the two gradient idioms. The "
                 "checker's mesh names its axis 'i' (section 2's is 'data'), and the optimizer state is one more "
                 "replicated argument and output.",
                 "Go through the per-device function value by value: which copy of the parameters does the loss "
                 "see, and which does the optimizer update (the replicated params that came in stay the same on "
                 "every device)? Which values vary over 'i' and must be the same everywhere at the end (the "
                 "gradients, the loss), and which collective makes them so? The APIs: jax.lax.pcast, "
                 "jax.lax.pmean, jax.jit's donate_argnums."])
def check_make_sharded_step(make_sharded_step):
    cases = [Case(c, f"on {c[0]} devices with {c[5]} ({c[1].__name__}), 3 steps", n=c[0])
             for c in _cases(np.random.default_rng(7))]
    _REFUSED.clear()
    _KEPT.clear()
    try:
        diagnose(make_sharded_step, cases, solution=solution_make_sharded_step, mistakes=MISTAKES_07_2,
                 run=_steps_runner, name="make_sharded_step", rtol=1e-4, atol=1e-5, names=_STEP_NAMES)
    except Mismatch as e:       # numbers of a step JAX refused: say where they come from
        raise type(e)(f"{e} (JAX refused your step; the numbers shown are what it returns with check_vma off.)"
                      if _REFUSED and "check_vma" not in str(e) else str(e)) from None
    for said in [said for make, said in _KEPT if make is make_sharded_step][:1]:
        raise Mismatch(said)
    for case in cases:                               # the mechanism: shard_map, and an all-reduce of the gradients
        n, loss_fn, params0, batches, tx, label = case.args
        mesh, where = _mesh(n), case.label
        step = make_sharded_step(loss_fn, tx, mesh)
        with jax.set_mesh(mesh):
            args = (*jax.device_put((params0, tx.init(params0)), NamedSharding(mesh, P())),
                    *jax.device_put(batches[0], NamedSharding(mesh, P(AXIS))))
            if not _shard_maps(step, *args, name="step", mesh=mesh):
                raise Mismatch(f"the step {where} has no jax.shard_map in its program. This exercise asks for "
                               "the per-device form, where you write the collective yourself (the sharded-jit "
                               "form of lesson 07's last step is not it).")
            # a jitted step's own program, else jit's; None if it cannot be built
            compiled = _or_none(lambda: _mesh_retry(mesh, lambda: (step if hasattr(step, "lower") else jax.jit(step))
                                                    .lower(*args).compile()))
        if compiled is None:
            raise Mismatch(f"the step {where} computes the right values, but its program could not be compiled "
                           "from outside (jax.jit(step).lower(...)): the checker cannot read its collectives. Return a "
                           "jitted function of (params, opt_state, x, y), called inside the checker's jax.set_mesh.")
        counts = compiled_collectives(compiled.as_text())       # {kind: (runs, bytes)}
        wrong = (f"{counts['all-gather'][0]} all-gather(s): it gathers values onto every device (the batch, or the "
                 "devices' gradients) where a data-parallel step gathers nothing and averages the gradients (pmean)"
                 if "all-gather" in counts else "no all-reduce: its devices never combine their gradients, so it "
                 "cannot be data parallel" if not {"all-reduce", "reduce-scatter"} & set(counts) else None)
        if wrong:
            raise Mismatch(f"the step's compiled program {where} has {wrong}.")
    return ("one device's step on the whole batch, reproduced for 3 steps on 8, 2 and 4 devices with SGD, "
            "momentum and clipping before AdamW, on three models; the state donated, and the gradients combined "
            "by an all-reduce inside your shard_map.")


# an optimizer state read by another optimizer's update: the step's own optimizer, not its argument (05.1, 10.4)
_OWN_OPTIMIZER = dict.fromkeys(("State' object has no attribute", "has to be the same in chain"), (
    "The optimizer state the step was given was made by its optimizer argument's init, and an update of another "
    "optimizer cannot read it: use the optimizer argument."))
_STEP_HINTS = {      # (07.2 itself says "never calls the optimizer it was given" for another optimizer's state error)
    **_SPEC_HINTS,
    "not evenly divisible": "Build nothing for a fixed device count: use the mesh make_sharded_step was given.",
    "can't be statically inferred": "shard_map refuses an output declared P() (the same on every device) that "
                                    "JAX types as varying over 'i': which of your outputs is computed from a "
                                    "varying value (a device's rows, a pcast copy) after the last collective over "
                                    "'i'? (lesson 06, section 3)",
    "unbound axis name": "A collective (pmean, psum) names a mesh axis, and only per-device code under "
                         "shard_map has one.",
    "too long to be compatible": "An out_specs entry splits an axis that its output does not have: the loss is "
                                 "a scalar. Make it the same on every device and return it once, like the state.",
    "does not match the specs of the input": "in_specs must match how the checker places the arguments: params "
                                             "and opt_state replicated, x and y split over 'i'.",
}
