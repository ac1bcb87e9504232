"""Lesson 04 exercises: collectives built from ppermute, global statistics, a ring rotation.

Each exercise asks for a function ``f(x, axis_name)`` that runs *inside* ``jax.pmap`` on one
device's value ``x``. The checkers run it on several device counts, shapes and dtypes and
compare every device's result with the reference solution's; they read the program
(``jax.make_jaxpr``) to see which collectives it uses and how many bytes its ppermutes send.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np

from . import Case, Mismatch, Mistake, _NotStarted, _eqns, call, diagnose, exercise, jaxpr_of

AXIS = "i"


# Raw errors of a per-device function under pmap, and what they mean: added to the feedback.
_ERRORS = {
    "unbound axis name": "Use the axis_name argument your function receives for every collective.",
    "not a valid JAX type": "A function run under pmap returns arrays (or tuples of them), not strings or other "
                            "Python objects: return the jax.numpy result itself.",
    "Abstract tracer value": "Under pmap, x, what is computed from it, and jax.lax.axis_index are traced values with "
                             "no Python number yet: float(), int() or an if on one fails. Keep them in JAX (jnp.where "
                             "for an if; an array indexed with a traced index, or .at[...].set).",
    "perm was not hashable": "The perm of jax.lax.ppermute is one static Python list of every (source, destination) "
                             "pair, fixed when the function is traced; jax.lax.axis_index is a traced value and cannot "
                             "be in it. List the pairs of all n devices, with n = jax.lax.axis_size(axis_name).",
}


def _runner(name, pair=False):
    """``run(fn, case)``: the per-device ``fn(x, axis)`` under pmap over the case's ``(xs, axis)``. With ``pair``,
    a per-device array of shape (2, ...) stands for the pair it stacks."""

    def per_device(x, fn, axis):
        out = fn(x, axis)
        return (out[0], out[1]) if pair and getattr(out, "shape", ())[:1] == (2,) else out

    def run(fn, case):
        (xs, axis), n = case.args, case.n
        mapped = jax.pmap(lambda x: per_device(x, fn, axis), axis_name=axis, devices=jax.devices()[:n])
        try:
            return call(mapped, jnp.asarray(xs), name=f"pmap({name})", hints=_ERRORS)
        except Mismatch as e:
            raise Mismatch(str(e) + _names_absent_devices(str(e), n)) from None

    return run


def _names_absent_devices(message: str, n: int) -> str:
    """What an error on ``n`` devices shows about a count written in: a shape or permutation naming more."""
    n_all = len(jax.devices())
    fixed = ": it was written for a fixed device count, and the checker runs it on 8, 4 and 2 devices."
    if n < n_all and "reshape" in message and re.search(rf"\({n_all}\b|\b{n_all}\)|, {n_all}\b", message):
        return f" This ran on {n} devices, and the shape it asked for names {n_all}" + fixed
    pairs = [int(v) for pair in re.findall(r"\((\d+), (\d+)\)", message) for v in pair]
    if ("unique" in message or "perm" in message) and pairs and max(pairs) >= n:
        return (f" On {n} devices the device indices are 0 to {n - 1}, but the permutation names device "
                f"{max(pairs)}" + fixed)
    if "must be unique" in message:
        return " A permutation lists each device at most once as a source and once as a destination."
    return ""


def _cases(shapes, seed=0, other_dtype=None, spread=0.0):
    """Per-device values that differ per device and per element (not exact in bfloat16), on 8, 4 and 2 devices,
    for each shape (the second's axis named "batch", not "i"); then, with ``other_dtype``, one more case on 4 devices
    in that dtype. ``spread`` shifts device j's values by ``spread * j`` (shards with different means)."""
    rng = np.random.default_rng(seed)
    out = []
    for n in sorted({len(jax.devices()), 4, 2}, reverse=True):
        for k, shape in enumerate(shapes):
            xs = (rng.normal(size=(n,) + shape) * 3 + spread * np.arange(n).reshape((n,) + (1,) * len(shape)))
            out.append(Case((xs.astype(np.float32), "batch" if k == 1 else AXIS), f"on {n} devices, per-device "
                            f"shape {shape}" + ", axis_name 'batch'" * (k == 1), n=n))
    if other_dtype is not None:
        xs = rng.integers(-9, 10, size=(4,) + shapes[-1]).astype(other_dtype)
        out.append(Case((xs, AXIS), f"on 4 devices, per-device {np.dtype(other_dtype).name} values", n=4))
    return out


def _ring(a, shift=1):
    n = jax.lax.axis_size(a)
    return [(i, (i + shift) % n) for i in range(n)]


def _count_ppermutes(jaxpr) -> tuple[int, int]:
    """(ppermutes run, bytes one device sends in them) by a program, such as ``_jaxpr(fn, xs)``.

    A ppermute inside a ``lax.scan`` or ``lax.fori_loop`` (a scan when its bounds are Python ints) runs once per
    iteration, so it counts that many times; in a ``lax.cond`` the costlier branch counts. A ppermute inside a
    ``lax.while_loop`` (a fori_loop with traced bounds) runs a number of times the program does not say: that
    raises ``Mismatch``, since the traffic cannot be counted.
    """
    hops = sent = 0
    for e in jaxpr.eqns:
        name = e.primitive.name
        if name == "ppermute":
            hops += 1
            sent += sum(int(np.prod(v.aval.shape)) * np.dtype(v.aval.dtype).itemsize for v in e.invars)
            continue
        inner = [_count_ppermutes(getattr(j, "jaxpr", j)) for v in e.params.values()        # nested programs
                 for j in (v if isinstance(v, (tuple, list)) else [v]) if hasattr(getattr(j, "jaxpr", j), "eqns")]
        h, b = (max(inner, key=lambda c: c[1], default=(0, 0)) if name == "cond"          # the costlier branch
                else (sum(c[0] for c in inner), sum(c[1] for c in inner)))
        if h and name == "while":
            raise Mismatch("the program sends with ppermute inside a lax.while_loop (what a lax.fori_loop with "
                           "traced bounds becomes), so the checker cannot count how many times it runs. Loop a number "
                           "of times known when the function is traced: a Python for loop, or lax.fori_loop with "
                           "Python int bounds (jax.lax.axis_size gives one).")
        times = int(e.params["length"]) if name == "scan" else 1
        hops, sent = hops + times * h, sent + times * b
    return hops, sent


def _jaxpr(fn, xs):
    """``fn``'s program under pmap over ``xs`` (n, ...); one that cannot be traced raises ``Mismatch``."""
    mapped = jax.pmap(lambda x: fn(x, AXIS), axis_name=AXIS, devices=jax.devices()[:xs.shape[0]])
    return jaxpr_of(mapped, jnp.asarray(xs))


def _traffic(fn, xs) -> tuple[str, int, int]:
    """What ``fn`` under pmap over ``xs`` (n, ...) sends, in words ("on 8 devices your ring ran 7 ppermutes and each
    device sent 112 bytes for a 16-byte x: (N - 1) x V, ..."); the bytes one device sends; the optimal ring's
    2 (n - 1) / n x V (V: one x's bytes)."""
    n, v = xs.shape[0], xs[0].nbytes
    (hops, sent), optimal = _count_ppermutes(_jaxpr(fn, xs)), 2 * (n - 1) * v // n
    how = {(n - 1) * v: "(N - 1) x V in total, N - 1 times a whole x", optimal: "2 (N - 1) / N x V"}.get(
        sent, f"{sent / v:g} x V")
    return (f"on {n} devices your ring ran {hops} ppermutes and each device sent {sent} bytes for a {v}-byte x: "
            f"{how}"), sent, optimal


def _program(fn, xs) -> set:
    """The primitives of ``fn``'s program under pmap over ``xs`` (``_jaxpr``'s), less collectives of scalars only (a
    count, such as psum(jnp.int32(1)))."""
    return {e.primitive.name for e in _eqns(_jaxpr(fn, xs))
            if e.primitive.name not in _COLLECTIVES or any(getattr(v.aval, "shape", ()) for v in e.invars)}


_COLLECTIVES = ("psum", "pmax", "pmin", "reduce_scatter", "all_gather", "all_to_all")


def _ppermute_only(program, what="the sum", right=False) -> None:
    """``program`` (``_program``'s primitives; None: unread) uses no collective but ppermute; once the values are
    ``right``, it must hold a ppermute."""
    seen = [{"reduce_scatter": "psum_scatter"}.get(name, name) for name in _COLLECTIVES if name in (program or ())]
    if seen:
        raise Mismatch(f"the program uses {' and '.join(seen)}: {what} must be built from jax.lax.ppermute alone "
                       "(no other collective).")
    if right and "ppermute" not in program:
        raise Mismatch(f"right values, but the program has no ppermute: build {what} from jax.lax.ppermute.")


# ----------------------------------------------------------------------------------------------
# 04.1 A ring all-reduce from ppermute


def solution_ring_allreduce(x, axis_name):
    n = jax.lax.axis_size(axis_name)               # the number of devices, a Python int
    ring = [(i, (i + 1) % n) for i in range(n)]  # everyone sends to the right-hand neighbour
    total, passing = x, x
    for _ in range(n - 1):                       # after n - 1 hops every value has visited every device
        passing = jax.lax.ppermute(passing, axis_name, ring)
        total = total + passing
    return total


def _hops(x, a, hops, perm, snowball=False):
    """A ring of ``hops`` ppermutes over ``perm``, each adding what arrived; with ``snowball``, each hop passes
    the running total on, not the value in transit."""
    total, passing = x, x
    for _ in range(hops):
        passing = jax.lax.ppermute(total if snowball else passing, a, perm)
        total = total + passing
    return total


def _sent_added(x, a):
    """04.1's ring, adding at each hop the value it sent instead of the one that arrived."""
    total = x
    for _ in range(jax.lax.axis_size(a) - 1):
        jax.lax.ppermute(x, a, _ring(a))        # sent; what arrives is dropped
        total = total + x
    return total


MISTAKES_04_1 = [
    Mistake("one hop too many", "Every device ends with the sum plus its own value once more: its own value came "
            "back to it round the ring, one hop too many.", lambda x, a: _hops(x, a, jax.lax.axis_size(a), _ring(a))),
    Mistake("one hop only", "Each device ends with its own value plus its left neighbour's: the values travelled "
            "one hop only, so the others never arrived.", lambda x, a: x + jax.lax.ppermute(x, a, _ring(a))),
    Mistake("ring not closed", "Device i ends with the sum of devices 0 to i only: the ring is not closed. No pair "
            "sends from the last device back to device 0, so nothing travels past the end of the line.",
            lambda x, a: _hops(x, a, jax.lax.axis_size(a) - 1, _ring(a)[:-1])),
    Mistake("one hop short", "Each device ends with the sum less one device's value, the one n - 1 hops away: the "
            "values travelled n - 2 hops, one too few.", lambda x, a: _hops(x, a, jax.lax.axis_size(a) - 2, _ring(a))),
    Mistake("passes the running total", "The values are far too large: at each hop a device passed on its running "
            "total, not the value in transit, so each value arrived again and again.",
            lambda x, a: _hops(x, a, jax.lax.axis_size(a) - 1, _ring(a), snowball=True)),
    Mistake("adds what it sent", "Each device ends with n = {n} times its own value: at each hop it added what it "
            "sent, not what arrived.", lambda x, a: x * jax.lax.axis_size(a), answer=_sent_added),
]


@exercise("04.1", "Build psum from ppermute (a ring all-reduce)", solution=solution_ring_allreduce,
          returns="on each device, an array shaped like x: the sum of every device's x",
          hints=["A device can only hear from its neighbour, one hop at a time. What must each device do with "
                 "what arrives, and after how many hops has it heard from every other device?",
                 "One hop is one jax.lax.ppermute with the ring shift of section 2 (a list of (source, "
                 "destination) pairs). jax.lax.axis_size gives the device count as a Python int, so an ordinary "
                 "Python for loop can repeat the hop."])
def check_ring_allreduce(ring_allreduce):
    cases = _cases([(), (3,), (2, 2)], seed=1, other_dtype=np.int32)
    try:
        program = _program(ring_allreduce, cases[1].args[0])
    except Mismatch:                                    # running it then gives the clearer feedback
        program = None
    _ppermute_only(program)                                             # the mechanism, read first
    ring = program is None or "ppermute" in program     # every mistake named here is one of a ring
    try:
        diagnose(ring_allreduce, cases, solution=solution_ring_allreduce, mistakes=MISTAKES_04_1 if ring else (),
                 run=_runner("ring_allreduce"), rtol=1e-5, atol=1e-5)
    except Mismatch as e:
        if ring or isinstance(e, _NotStarted) or "returned None" in str(e):    # no values to read yet
            raise
        raise Mismatch(f"{e} Its program has no ppermute: nothing travelled round a ring.") from None
    _ppermute_only(_program(ring_allreduce, cases[-1].args[0]), "the sum", right=True)
    try:                                                # the traffic on every device, for a 16-byte x
        said, _, optimal = _traffic(ring_allreduce, np.ones((len(jax.devices()), 4), np.float32))
    except Mismatch as e:
        return f"every device holds the total: an all-reduce. Its traffic is not reported: {e}"
    return (f"every device holds the total: an all-reduce; {said}. Section 4's ring sends 2 (N - 1) / N x V = "
            f"{optimal} bytes, because it passes pieces of x, not all of it: optional exercise 04.5.")


# ----------------------------------------------------------------------------------------------
# 04.2 The global mean and variance from per-device shards


def solution_global_mean_var(x, axis_name):
    mean = jax.lax.pmean(jnp.mean(x), axis_name)                   # every shard has the same size
    var = jax.lax.pmean(jnp.mean((x - mean) ** 2), axis_name)      # deviations from the *global* mean
    return mean, var


def _right_mean(var_of):
    """A 04.2 mistake with the right mean: ``var_of(x, a, mean, var)`` is its variance."""
    def fn(x, a):
        mean, var = solution_global_mean_var(x, a)
        return mean, var_of(x, a, mean, var)
    return fn


MISTAKES_04_2 = [
    Mistake("local statistics", "The devices disagree: each computed its own shard's statistics, not those of the "
            "whole batch.", lambda x, a: (jnp.mean(x), jnp.var(x))),
    Mistake("mean of the variances", "Your variance equals the mean of the {n} per-device variances, each taken "
            "about its own shard's mean.",
            lambda x, a: (jax.lax.pmean(jnp.mean(x), a), jax.lax.pmean(jnp.var(x), a))),
    Mistake("summed means", "The mean is {n} times the mean of all the data, what adding the {n} shard means gives "
            "(or the total divided by one shard's count).", lambda x, a: (jax.lax.psum(jnp.mean(x), a),
                                                jax.lax.psum(jnp.mean((x - jax.lax.psum(jnp.mean(x), a)) ** 2), a))),
    Mistake("standard deviation", "The second value is the standard deviation of all the data, not its variance.",
            _right_mean(lambda x, a, m, v: jnp.sqrt(v))),
    Mistake("sample variance", "The variance is the sample variance (divided by the count minus one), not the "
            "variance of all the data (divided by the count).",
            _right_mean(lambda x, a, m, v: v * (k := x.size * jax.lax.axis_size(a)) / (k - 1))),
    Mistake("squared deviations summed", "The variance is {n} times too large: the {n} shards' squared deviations "
            "were added, not averaged.", _right_mean(lambda x, a, m, v: v * jax.lax.axis_size(a))),
    Mistake("variance not averaged", "The devices agree on the mean but not on the variance: each device's "
            "variance is computed from its own shard's values only; the variance of all the data needs an average "
            "over the devices too.", _right_mean(lambda x, a, m, v: jnp.mean((x - m) ** 2))),
    Mistake("swapped", "The two outputs are swapped: the variance came first and the mean second; the pair is "
            "(mean, var).", lambda x, a: solution_global_mean_var(x, a)[::-1]),
    Mistake("variance of the device means", "The variance is the variance of the {n} shard means (how far the devices' "
            "means spread), not of all the values.",
            _right_mean(lambda x, a, m, v: jnp.var(jax.lax.all_gather(jnp.mean(x), a)))),
]


@exercise("04.2", "A global mean and variance from per-device shards", solution=solution_global_mean_var,
          returns="a pair (mean, var), each one number per device, the same on every device",
          hints=["Each device sees only its shard, and the statistics of ALL the data need a collective. From "
                 "which mean is each value's deviation measured?",
                 "Section 2's reductions (psum, pmean, pmax, pmin): one of them averages a value over the devices."])
def check_global_mean_var(global_mean_var):
    diagnose(global_mean_var, _cases([(6,), (3,)], seed=2, spread=3.0), solution=solution_global_mean_var,
             mistakes=MISTAKES_04_2, run=_runner("global_mean_var", pair=True), rtol=1e-4, atol=1e-4,
             names=("the mean (output [0])", "the variance (output [1])"))
    return "every device knows the statistics of the whole batch."


# ----------------------------------------------------------------------------------------------
# 04.3 Rotate shards one device to the right


def solution_rotate_right(x, axis_name):
    n = jax.lax.axis_size(axis_name)
    return jax.lax.ppermute(x, axis_name, [(i, (i + 1) % n) for i in range(n)])


MISTAKES_04_3 = [
    Mistake("rotates left", "Device i got device i + 1's value: that rotates left, not right.",
            lambda x, a: jax.lax.ppermute(x, a, _ring(a, -1))),
    Mistake("unchanged", "Every device still holds its own x: nothing moved between the devices.", lambda x, a: x),
    Mistake("rolled on one device", "Each device rotated the values of its own x (jnp.roll works on one device's "
            "array): nothing moved between the devices. Moving values from device to device takes a collective "
            "(section 2).", lambda x, a: jnp.roll(x, 1)),
    Mistake("ring not closed", "Device 0 received nothing (zeros), so no pair sends to it: the ring is not "
            "closed, and the last device's value went nowhere.", lambda x, a: jax.lax.ppermute(x, a, _ring(a)[:-1])),
    *[Mistake(f"moved {k}", f"Device i holds the x of device i - {k}, counting round the ring: the values moved "
              f"{k} devices to the right, not 1.", lambda x, a, k=k: jax.lax.ppermute(x, a, _ring(a, k)))
      for k in range(2, 7)],
]


@exercise("04.3", "Rotate the shards one device to the right", solution=solution_rotate_right,
          returns="on device i, an array shaped like x: device (i - 1) % n's x",
          hints=["One collective, one hop: every device sends its x to its right-hand neighbour, and the last "
                 "device's x wraps round to device 0.",
                 "jax.lax.ppermute takes a list of (source, destination) pairs: section 2's ring shift. "
                 "jax.lax.axis_size gives the number of devices n, so the list can be built for any n."])
def check_rotate_right(rotate_right):
    cases = _cases([(2,), (2, 3)], seed=3, other_dtype=np.float16)
    diagnose(rotate_right, cases, solution=solution_rotate_right, mistakes=MISTAKES_04_3,
             run=_runner("rotate_right"))
    _ppermute_only(_program(rotate_right, cases[-1].args[0]), "the rotation", right=True)
    hops, _ = _count_ppermutes(_jaxpr(rotate_right, cases[-1].args[0]))
    if hops != 1:
        raise Mismatch(f"right values, but expected 1 ppermute, got {hops}: the exercise asks for one collective, one "
                       f"hop, and this program sends each value {hops} times to arrive at the same place.")
    return "each shard moved one device to the right, and the last one wrapped round to device 0."


# ----------------------------------------------------------------------------------------------
# 04.4 all_gather from ppermute


def solution_gather_all(x, axis_name):
    n = jax.lax.axis_size(axis_name)
    me = jax.lax.axis_index(axis_name)
    ring = [(i, (i + 1) % n) for i in range(n)]
    gathered = jnp.zeros((n,) + x.shape, x.dtype).at[me].set(x)
    passing, owner = x, me
    for _ in range(n - 1):
        passing = jax.lax.ppermute(passing, axis_name, ring)
        owner = (owner - 1) % n                      # the value now here came from one device further left
        gathered = gathered.at[owner].set(passing)
    return gathered


def _zero_row(x, a, k):
    """Every device's x in device order, with row (me + k) % n left at zero (for writing mistakes)."""
    return jax.lax.all_gather(x, a).at[(jax.lax.axis_index(a) + k) % jax.lax.axis_size(a)].set(0)


MISTAKES_04_4 = [
    Mistake("own row missing", "Every row is right except the device's own, which is zero: each device stored "
            "what arrived, but never wrote its own value into its result.", lambda x, a: _zero_row(x, a, 0)),
    Mistake("one hop short", "Every row is right except one, zero: the row of the device to the right, whose value "
            "is the last to arrive round the ring. The values stopped one hop short.",
            lambda x, a: _zero_row(x, a, 1)),
    Mistake("own value first", "Each device has every value, but starting with its own: row j of every device's "
            "result must be device j's value; here row k holds what arrived after k hops.",
            lambda x, a: jnp.roll(jax.lax.all_gather(x, a), -jax.lax.axis_index(a), axis=0)),
    Mistake("rows filed the other way", "Every device has every value, but in the wrong rows: the values travel "
            "round the ring in one direction, and the bookkeeping of where each came from assumes the other.",
            lambda x, a: jax.lax.all_gather(x, a)[(2 * jax.lax.axis_index(a) - jnp.arange(jax.lax.axis_size(a)))
                                      % jax.lax.axis_size(a)]),
    Mistake("only its own value", "Every row of each device's result is its own value: nothing arrived from the "
            "other devices.", lambda x, a: jnp.stack([x] * jax.lax.axis_size(a))),
]


@exercise("04.4", "Build all_gather from ppermute", solution=solution_gather_all,
          returns="on each device, an array of shape (n,) + x.shape: row j is device j's x",
          hints=["The ring of 04.1 again, but instead of adding what arrives, store it; and keep track of "
                 "which device each arriving value came from.",
                 "jax.lax.axis_index tells a device where it is (section 1); an array's .at[...].set method "
                 "writes one row of a new array, and works with a traced index."])
def check_gather_all(gather_all):
    cases = _cases([(), (2,)], seed=4, other_dtype=np.float16)
    diagnose(gather_all, cases, solution=solution_gather_all, mistakes=MISTAKES_04_4, run=_runner("gather_all"))
    _ppermute_only(_program(gather_all, cases[-1].args[0]), "the gather", right=True)
    for n in sorted({c.n for c in cases}, reverse=True):     # extra hops change no value: read the traffic
        xs = np.ones((n, 64), np.float32)                    # a 256-byte x: an index sent along costs little
        try:
            said, sent, _ = _traffic(gather_all, xs)
        except Mismatch:                                     # a loop the checker cannot count: not refused for it
            break
        if sent >= n * xs[0].nbytes:                         # at least one whole x sent again
            raise Mismatch(f"right values, but {said}. A gather needs (N - 1) x V: each device receives each of the "
                           "n - 1 other values once, one x per hop.")
    return "every device holds every device's value, in device order: an all-gather."


# ----------------------------------------------------------------------------------------------
# 04.5 (optional) The bandwidth-optimal ring: reduce-scatter, then all-gather


def solution_ring_allreduce_chunked(x, axis_name):
    n = jax.lax.axis_size(axis_name)
    me = jax.lax.axis_index(axis_name)
    ring = [(i, (i + 1) % n) for i in range(n)]
    chunks = x.reshape(n, -1)                     # n pieces of V / n bytes
    # Reduce-scatter: n - 1 hops. Each device passes on a partial sum of one piece and adds its own part of
    # the next; afterwards device `me` holds the full sum of piece (me + 1) % n.
    passing = chunks[me]
    for step in range(1, n):
        passing = jax.lax.ppermute(passing, axis_name, ring) + chunks[(me - step) % n]
    # All-gather: n - 1 more hops pass the finished pieces round, each stored in its place.
    total = jnp.zeros_like(chunks).at[(me + 1) % n].set(passing)
    for step in range(1, n):
        passing = jax.lax.ppermute(passing, axis_name, ring)
        total = total.at[(me + 1 - step) % n].set(passing)
    return total.reshape(x.shape)


def _summed_pieces(x, a):
    """``x`` cut into n pieces, each summed over the devices: (n, V / n)."""
    return jax.lax.psum(x.reshape(jax.lax.axis_size(a), -1), a)


def _reduce_scatter_only(x, a):  # the finished piece in its place, the all-gather phase missing
    total, mine = _summed_pieces(x, a), (jax.lax.axis_index(a) + 1) % jax.lax.axis_size(a)
    return jnp.zeros_like(total).at[mine].set(total[mine]).reshape(x.shape)


MISTAKES_04_5 = [
    *[Mistake(f"pieces {k:+d} row", "Every device holds all the summed pieces, but each one is stored one "
              "piece-row off from its place: the bookkeeping of which piece is in transit at each hop is off by one.",
              lambda x, a, k=k: jnp.roll(_summed_pieces(x, a), k, axis=0).reshape(x.shape))
      for k in (1, -1)],
    Mistake("no all-gather phase", "Each device holds one fully summed piece and zeros elsewhere: the "
            "reduce-scatter is done, but the finished pieces were never passed round (the all-gather phase).",
            _reduce_scatter_only),
]


@exercise("04.5", "Optional: the bandwidth-optimal ring all-reduce", solution=solution_ring_allreduce_chunked,
          returns="on each device, an array shaped like x (a vector whose length divides by n): the sum of every "
                  "device's x",
          hints=["Section 4's ring never sends a whole x. Cut x into n pieces: a reduce-scatter makes each device "
                 "the owner of one fully summed piece, and an all-gather passes the finished pieces round. Each "
                 "phase is n - 1 hops of one piece.",
                 "Reshaping x to (n, V / n) gives the pieces; jax.lax.axis_index says which device you are, and "
                 "indexing with it (or an .at[...].set) works with the traced index. jax.lax.psum_scatter and "
                 "jax.lax.all_gather (section 2) are the two phases you are rebuilding."])
def check_ring_allreduce_chunked(ring_allreduce):
    rng = np.random.default_rng(5)
    cases = [Case(((rng.normal(size=(n, 3 * n)) * 3).astype(np.float32), "batch" if n == 4 else AXIS), f"on {n} "
                  f"devices, each x a vector of {3 * n}" + ", axis_name 'batch'" * (n == 4), n=n)
             for n in sorted({len(jax.devices()), 4, 2}, reverse=True)]
    diagnose(ring_allreduce, cases, solution=solution_ring_allreduce_chunked, mistakes=MISTAKES_04_5,
             run=_runner("ring_allreduce_chunked"), rtol=1e-5, atol=1e-5)
    reports = []
    for xs in [case.args[0] for case in cases]:         # the first, on every device, is reported
        _ppermute_only(_program(ring_allreduce, xs), "the sum", right=True)
        said, sent, optimal = _traffic(ring_allreduce, xs)
        if sent > optimal:
            raise Mismatch(f"right values, but {said}; the bandwidth-optimal ring sends 2 (N - 1) / N x V = "
                           f"{optimal} bytes in {2 * (len(xs) - 1)} hops of one piece (V / N = "
                           f"{xs[0].nbytes // len(xs)} bytes) each.")
        reports.append(said)
    return (f"the sum on every device, and {reports[0]}, the ring all-reduce of section 4 (a reduce-scatter, then an "
            "all-gather).")
