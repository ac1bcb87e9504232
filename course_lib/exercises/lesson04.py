"""Lesson 04 exercises: collectives built from ppermute, global statistics, a ring rotation.

Each exercise asks for a function ``f(x, axis_name)`` that runs *inside* ``jax.pmap`` on one
device's value ``x``. The checkers run it on several device counts and shapes and compare
every device's result with the NumPy references of ``course_lib.collectives``; they read the
program (``jax.make_jaxpr``) to see which collectives it uses and how many bytes its
``ppermute`` calls send.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np

from .. import collectives as C
from . import Mismatch, as_array, call, describe_tree, exercise, expect_array, primitives

AXIS = "i"


def _run(fn, xs, name):
    """Run the learner's per-device ``fn(x, "i")`` under pmap over ``xs`` (n, ...); per-device results."""
    n = xs.shape[0]
    mapped = jax.pmap(lambda x: fn(x, AXIS), axis_name=AXIS, devices=jax.devices()[:n])
    try:
        got = call(mapped, jnp.asarray(xs), name=f"pmap({name})", hints={
            "unbound axis name": "Use the axis_name argument your function receives for every collective.",
            "not a valid JAX type": "A function run under pmap returns arrays (or tuples of them), not strings or "
                                    "other Python objects: return the jax.numpy result itself."})
    except Mismatch as e:
        message = str(e)
        n_all = len(jax.devices())
        if n < n_all and "reshape" in message and re.search(rf"\({n_all}\b|\b{n_all}\)|, {n_all}\b", message):
            raise Mismatch(f"{message} This ran on {n} devices, and the shape it asked for names {n_all}: it was "
                           "written for a fixed device count, and the checker runs it on 8, 4 and 2 devices.") from None
        if "must be unique" in message or "perm" in message:
            pairs = [int(v) for v in re.findall(r"\((\d+), (\d+)\)", message) for v in v]
            if pairs and max(pairs) >= n:
                raise Mismatch(f"{message} On {n} devices the device indices are 0 to {n - 1}, but the permutation "
                               f"names device {max(pairs)}: it was written for a fixed device count, and the checker "
                               "runs it on 8, 4 and 2 devices.") from None
            if "must be unique" in message:
                raise Mismatch(f"{message} A permutation lists each device at most once as a source and once as a "
                               "destination.") from None
        raise
    if getattr(got, "dtype", xs.dtype) != xs.dtype and not isinstance(got, (tuple, list, dict)):
        _same_dtype(np.empty(0, got.dtype), xs, f"pmap({name}) on {n} devices")
    return got


def _same_dtype(got: np.ndarray, xs: np.ndarray, what: str) -> None:
    """A collective keeps the dtype: a result in another float type lost (or invented) precision on the way."""
    if got.dtype != xs.dtype and got.dtype != bool:
        raise Mismatch(f"{what} returned {got.dtype.name} values from {xs.dtype.name} inputs. Collectives and "
                       f"ppermute keep the dtype; something in the function made {got.dtype.name} values (an astype, "
                       "or a new array created without the input's dtype), and that can change the numbers.")


def _ppermute_bytes(fn, xs) -> tuple[int, int]:
    """(ppermutes run, bytes one device sends in them) by ``fn``'s program under pmap over ``xs``.

    A ppermute inside a ``lax.scan`` or ``lax.fori_loop`` (a scan when its bounds are Python ints) runs once per
    iteration, so it counts that many times; in a ``lax.cond`` the costlier branch counts. A ppermute inside a
    ``lax.while_loop`` (a fori_loop with traced bounds) runs a number of times the program does not say: that
    raises ``Mismatch``, since the traffic cannot be counted.
    """
    mapped = jax.pmap(lambda x: fn(x, AXIS), axis_name=AXIS, devices=jax.devices()[:xs.shape[0]])
    try:
        closed = jax.make_jaxpr(mapped)(jnp.asarray(xs))
    except Exception:                                   # primitives() words the failure for the learner
        primitives(mapped, jnp.asarray(xs), name="your function")
        raise
    return _count_ppermutes(closed.jaxpr)


def _sub_jaxprs(value):
    if hasattr(value, "eqns"):                          # a Jaxpr
        yield value
    elif hasattr(getattr(value, "jaxpr", None), "eqns"):  # a ClosedJaxpr
        yield value.jaxpr
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _sub_jaxprs(v)


def _count_ppermutes(jaxpr) -> tuple[int, int]:
    hops = sent = 0
    for e in jaxpr.eqns:
        name = e.primitive.name
        if name == "ppermute":
            hops += 1
            sent += sum(int(np.prod(v.aval.shape)) * np.dtype(v.aval.dtype).itemsize for v in e.invars)
            continue
        if name == "cond":
            counts = [_count_ppermutes(b) for b in _sub_jaxprs(e.params["branches"])]
            h, b = max(counts, key=lambda c: c[1], default=(0, 0))
            hops, sent = hops + h, sent + b
            continue
        inner = [_count_ppermutes(j) for v in e.params.values() for j in _sub_jaxprs(v)]
        h, b = sum(c[0] for c in inner), sum(c[1] for c in inner)
        if h and name == "while":
            raise Mismatch("the program sends with ppermute inside a lax.while_loop (a lax.fori_loop whose bounds "
                           "are traced values becomes one), so the checker cannot count how many times it runs, "
                           "nor the bytes each device sends. Loop a number of times known when the function is "
                           "traced: a Python for loop, or lax.fori_loop with Python int bounds (jax.lax.axis_size "
                           "gives one).")
        times = int(e.params["length"]) if name == "scan" else 1
        hops, sent = hops + times * h, sent + times * b
    return hops, sent


def _inputs_and_device(xs, got, device: int) -> str:
    """What each device held, and what one device returned: for feedback on a small case."""
    held = np.array2string(np.asarray(xs), separator=", ")
    returned = np.array2string(np.asarray(got)[device], separator=", ")
    return f"device j held x = row j of {held}; device {device} returned {returned}"


_PROGRAMS: dict = {}


def _uses(fn, xs, primitive: str) -> bool:
    """Whether ``fn``'s program under pmap over ``xs`` holds ``primitive``. Read once per (fn, shape, dtype)."""
    key = (fn, xs.shape, str(xs.dtype))
    if key not in _PROGRAMS:
        if len(_PROGRAMS) > 64:
            _PROGRAMS.clear()
        mapped = jax.pmap(lambda x: fn(x, AXIS), axis_name=AXIS, devices=jax.devices()[:xs.shape[0]])
        _PROGRAMS[key] = {e.primitive.name for e in primitives(mapped, jnp.asarray(xs), name="your function")}
    return primitive in _PROGRAMS[key]


def _uses_if_readable(fn, xs, primitive: str) -> bool:
    """``_uses``, or False when the program cannot be traced: running it then gives the clearer feedback."""
    try:
        return _uses(fn, xs, primitive)
    except Mismatch:
        return False


def _cases(shapes, seed=0, other_dtype=None):
    """Per-device values that differ per device and per element, on 8, 4 and 2 devices, for each shape; then, with
    ``other_dtype``, one more case on 4 devices in that dtype (a collective keeps the dtype)."""
    rng = np.random.default_rng(seed)
    n_all = len(jax.devices())
    for n in sorted({n_all, 4, 2}, reverse=True):
        for shape in shapes:
            yield rng.integers(-9, 10, size=(n,) + shape).astype(np.float32)
    if other_dtype is not None:
        yield rng.integers(-9, 10, size=(4,) + shapes[-1]).astype(other_dtype)


# ----------------------------------------------------------------------------------------------
# 04.1 A ring all-reduce from ppermute


def solution_ring_allreduce(x, axis_name):
    n = jax.lax.psum(1, axis_name)               # the number of devices, a Python int
    ring = [(i, (i + 1) % n) for i in range(n)]  # everyone sends to the right-hand neighbour
    total, passing = x, x
    for _ in range(n - 1):                       # after n - 1 hops every value has visited every device
        passing = jax.lax.ppermute(passing, axis_name, ring)
        total = total + passing
    return total


@exercise("04.1", "Build psum from ppermute (a ring all-reduce)", solution=solution_ring_allreduce,
          returns="on each device, an array shaped like x: the sum of every device's x",
          hints=["Pass a value round the ring: each device sends to its right-hand neighbour and adds what "
                 "arrives from its left. How many hops until every value has visited every device?",
                 "One hop is one jax.lax.ppermute with the ring shift of section 2 (a list of (source, "
                 "destination) pairs). jax.lax.axis_size gives the device count as a Python int, so an ordinary "
                 "Python for loop can repeat the hop.",
                 "Keep two values: a running total that starts as your own x, and the value in transit, also "
                 "your own x at first. Repeat n - 1 times: pass the value in transit one hop to the right, then add "
                 "what arrived to the total."])
def check_ring_allreduce(ring_allreduce):
    first = next(_cases([(3,)], seed=1))
    for banned in ("psum", "all_gather", "reduce_scatter", "all_to_all"):   # the mechanism, read first
        if _uses_if_readable(ring_allreduce, first, banned):
            shown = "psum_scatter" if banned == "reduce_scatter" else banned
            raise Mismatch(f"the program uses {shown}: the sum must be built from jax.lax.ppermute alone "
                           "(and +).")
    for xs in _cases([(), (3,), (2, 2)], seed=1, other_dtype=np.int32):
        n = xs.shape[0]
        what = f"ring_allreduce on {n} devices, per-device shape {xs.shape[1:]}"
        got = as_array(_run(ring_allreduce, xs, "ring_allreduce"), what=what, expected_shape=xs.shape)
        right = np.shape(got) == xs.shape and np.allclose(got, C.psum(xs))
        if not right and np.shape(got) == xs.shape and np.allclose(got, C.psum(xs) + xs):
            raise Mismatch(f"{what}: every device ends with the sum plus its own value once more: its own value "
                           "came back to it round the ring, one hop too many.")
        if not right and np.shape(got) == xs.shape and np.allclose(got, xs + C.ppermute(xs, C.ring_permutation(n))):
            raise Mismatch(f"{what}: each device ends with its own value plus its left neighbour's: the values "
                           "travelled one hop only, so the others never arrived.")
        if not right and np.shape(got) == xs.shape and n > 2 and np.allclose(got, np.cumsum(xs, axis=0)):
            raise Mismatch(f"{what}: device i ends with the sum of devices 0 to i only: the ring is not closed. No "
                           f"pair sends from the last device ({n - 1}) back to device 0, so nothing travels past "
                           "the end of the line, and device 0 only ever receives zeros.")
        snowball = xs.copy()
        for _ in range(n - 1):
            snowball = snowball + np.roll(snowball, 1, axis=0)
        if not right and np.shape(got) == xs.shape and np.allclose(got, snowball):
            raise Mismatch(f"{what}: the values are far too large: at each hop a device passed on its running "
                           "total, not the value in transit, so each value arrived again and again, inside the "
                           "totals it was already part of.")
        if not right and np.shape(got) == xs.shape and np.allclose(got, xs * n):
            raise Mismatch(f"{what}: each device ends with n = {n} times its own value: at each hop it added what "
                           "it sent, not what arrived.")
        expect_array(got, C.psum(xs), what=what)
        _same_dtype(got, xs, what)
    for banned in ("psum", "all_gather", "reduce_scatter", "all_to_all"):
        if _uses(ring_allreduce, xs, banned):
            shown = "psum_scatter" if banned == "reduce_scatter" else banned
            raise Mismatch(f"right values, but the program uses {shown}: the sum must be built from "
                           "jax.lax.ppermute alone (and +).")
    if not _uses(ring_allreduce, xs, "ppermute"):
        raise Mismatch("right values, but the program has no ppermute: the sum must be built from "
                       "jax.lax.ppermute (and +).")
    xs = np.ones((len(jax.devices()), 4), np.float32)     # report the traffic for every device, 16-byte x
    n = xs.shape[0]
    try:
        hops, sent = _ppermute_bytes(ring_allreduce, xs)
    except Mismatch as e:
        return f"every device holds the total: an all-reduce. Its traffic is not reported: {e}"
    v = xs[0].nbytes
    optimal = 2 * (n - 1) * v // n
    how = "(N - 1) x V" if sent == (n - 1) * v else f"{sent / v:g} x V"
    return (f"every device holds the total: an all-reduce. On {n} devices your ring ran {hops} ppermutes and each "
            f"device sent {sent} bytes for a {v}-byte x: {how}. Section 4's ring sends 2 (N - 1) / N x V = "
            f"{optimal} bytes, because it passes pieces of x, not all of it: optional exercise 04.5.")


# ----------------------------------------------------------------------------------------------
# 04.2 The global mean and variance from per-device shards


def solution_global_mean_var(x, axis_name):
    mean = jax.lax.pmean(jnp.mean(x), axis_name)                   # every shard has the same size
    var = jax.lax.pmean(jnp.mean((x - mean) ** 2), axis_name)      # deviations from the *global* mean
    return mean, var


@exercise("04.2", "A global mean and variance from per-device shards", solution=solution_global_mean_var,
          returns="a pair (mean, var), each one number per device, the same on every device",
          hints=["Each device sees only its shard. The statistics of ALL the data need a collective; and the "
                 "variance must measure deviations from the global mean, not the shard's.",
                 "jax.lax.pmean averages a value over the devices (section 2). Every shard has the same size, so "
                 "the average of the shard means is the mean of all the data.",
                 "Two steps: first the global mean (each shard's mean, averaged over the devices); then the mean "
                 "squared deviation from THAT mean, computed on each shard and averaged over the devices the "
                 "same way."])
def check_global_mean_var(global_mean_var):
    for xs in _cases([(6,), (3,)], seed=2):
        xs = xs + np.arange(xs.shape[0], dtype=np.float32)[:, None] * 3  # shards with different means
        got = _run(global_mean_var, xs, "global_mean_var")
        n = xs.shape[0]
        what = f"global_mean_var on {n} devices with {xs.shape[1]} values each"
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise Mismatch(f"{what} should return a pair (mean, var); got {describe_tree(got)}.")
        mean, var = (as_array(v, what=f"{what}: {k}", expected_shape=(n,)) for k, v in zip(("mean", "var"), got))
        if mean.shape != (n,) or var.shape != (n,):
            raise Mismatch(f"{what}: mean and var should be one number per device (pmap gives shape ({n},)); got "
                           f"{mean.shape} and {var.shape}.")
        if not np.allclose(mean, mean[0]):
            raise Mismatch(f"{what}: the devices disagree on the mean (means {[round(float(m), 2) for m in mean]}): "
                           "each computed its own shard's statistics, not those of the whole batch.")
        if not np.allclose(var, var[0]):
            raise Mismatch(f"{what}: the devices agree on the mean but not on the variance (variances "
                           f"{[round(float(v), 2) for v in var]}): each device's variance is computed from its own "
                           "shard's values only; the variance of all the data needs an average over the devices "
                           "too.")
        if np.allclose(var, xs.var(axis=1).mean(), rtol=1e-4) and not np.isclose(xs.var(axis=1).mean(), xs.var()):
            raise Mismatch(f"{what}: the variance is the mean of the per-device variances, "
                           f"{xs.var(axis=1).mean():.4f}; the variance of all the data is {xs.var():.4f}: each "
                           "value's deviation was measured from its own shard's mean.")
        if not np.isclose(xs.mean(), 0) and np.allclose(mean, n * xs.mean(), rtol=1e-4):
            raise Mismatch(f"{what}: the mean is {float(mean[0]):.4f}, {n} times the mean of all the data "
                           f"({xs.mean():.4f}): it adds the {n} shard means instead of averaging them.")
        expect_array(mean, np.full(n, xs.mean()), what=f"{what}: the mean", rtol=1e-4, atol=1e-4)
        if np.allclose(var, np.sqrt(xs.var()), rtol=1e-4):
            raise Mismatch(f"{what}: the variance is {float(var[0]):.4f}, the standard deviation of all the data, "
                           f"not its variance ({xs.var():.4f}).")
        if np.allclose(var, xs.var(ddof=1), rtol=1e-4):
            raise Mismatch(f"{what}: the variance is {float(var[0]):.4f}, the sample variance (divided by the count "
                           f"minus one); the variance of all the data, divided by the count, is {xs.var():.4f}.")
        if np.allclose(var, xs.mean(axis=1).var(), rtol=1e-4):
            raise Mismatch(f"{what}: the variance is {float(var[0]):.4f}, the variance of the {n} shard means (how "
                           "far the devices' means spread), not of all the values: each value's own deviation from "
                           f"the global mean counts ({xs.var():.4f}).")
        if np.allclose(var, xs.var() * n, rtol=1e-4) or np.allclose(var, n * xs.var(axis=1).mean(), rtol=1e-4):
            raise Mismatch(f"{what}: the variance is {float(var[0]):.4f}, {n} times too large: the {n} shards' "
                           "squared deviations were added, not averaged.")
        total, count = float(((xs - xs.mean()) ** 2).sum()), xs.size
        if float(var[0]) > 0 and not np.allclose(var, xs.var(), rtol=1e-4):
            divisor = total / float(var[0])
            raise Mismatch(f"{what}: the variance is {float(var[0]):.4f}: the squared deviations of all {count} "
                           f"values from the global mean add up to {total:.2f}, and your variance is that sum "
                           f"divided by {divisor:.2f}, not by the number of values, {count}. Count what each "
                           "division divides by: a pmean divides by the number of devices, jnp.mean by the values "
                           "on one device, and N - 1 instead of N gives the sample variance.")
        expect_array(var, np.full(n, xs.var()), what=f"{what}: the variance", rtol=1e-4, atol=1e-4)
        _same_dtype(mean, xs, f"{what}: the mean")
    return "every device knows the statistics of the whole batch."


# ----------------------------------------------------------------------------------------------
# 04.3 Rotate shards one device to the right


def solution_rotate_right(x, axis_name):
    n = jax.lax.psum(1, axis_name)
    return jax.lax.ppermute(x, axis_name, [(i, (i + 1) % n) for i in range(n)])


@exercise("04.3", "Rotate the shards one device to the right", solution=solution_rotate_right,
          returns="on device i, an array shaped like x: device (i - 1) % n's x",
          hints=["One collective, one hop: every device sends its x to its right-hand neighbour, and the last "
                 "device's x wraps round to device 0.",
                 "jax.lax.ppermute takes a list of (source, destination) pairs: section 2's ring shift. "
                 "jax.lax.axis_size gives the number of devices n, so the list can be built for any n.",
                 "Print the perm of section 2's ring shift cell and read it as a rule: which destination does "
                 "each source get, and what is special about the last device? Then write that rule as a list "
                 "comprehension over range(n)."])
def check_rotate_right(rotate_right):
    for xs in _cases([(2,), (2, 3)], seed=3, other_dtype=np.float16):
        n = xs.shape[0]
        what = f"rotate_right on {n} devices"
        got = as_array(_run(rotate_right, xs, "rotate_right"), what=what, expected_shape=xs.shape)
        shifted = np.roll(xs, 1, axis=0)
        right = np.shape(got) == xs.shape and np.allclose(got, shifted)
        if not right and np.shape(got) == xs.shape and np.allclose(got, np.roll(xs, -1, axis=0)):
            raise Mismatch(f"{what}: device i got device i + 1's value: that rotates left, not right.")
        if not right and np.shape(got) == xs.shape and np.allclose(got[1:], shifted[1:]) and np.allclose(got[0], 0):
            raise Mismatch(f"{what}: device 0 received nothing (zeros), so no pair sends to it: the ring is not "
                           f"closed, and the last device's value ({n - 1}) went nowhere.")
        if not right and np.shape(got) == xs.shape:
            for k in range(2, n - 1):
                if np.allclose(got, np.roll(xs, k, axis=0)):
                    raise Mismatch(f"{what}: device i got device i - {k}'s value: the values moved {k} devices "
                                   "to the right, not one.")
        expect_array(got, shifted, what=f"{what} (row i is what device i holds)")
        _same_dtype(got, xs, what)
    if not _uses(rotate_right, xs, "ppermute"):
        raise Mismatch("right values, but the program has no ppermute: the values did not travel between devices "
                       "as the exercise asks.")
    return "each shard moved one device to the right, and the last one wrapped round to device 0."


# ----------------------------------------------------------------------------------------------
# 04.4 all_gather from ppermute


def solution_gather_all(x, axis_name):
    n = jax.lax.psum(1, axis_name)
    me = jax.lax.axis_index(axis_name)
    ring = [(i, (i + 1) % n) for i in range(n)]
    gathered = jnp.zeros((n,) + x.shape, x.dtype).at[me].set(x)
    passing, owner = x, me
    for _ in range(n - 1):
        passing = jax.lax.ppermute(passing, axis_name, ring)
        owner = (owner - 1) % n                      # the value now here came from one device further left
        gathered = gathered.at[owner].set(passing)
    return gathered


@exercise("04.4", "Build all_gather from ppermute", solution=solution_gather_all,
          returns="on each device, an array of shape (n,) + x.shape: row j is device j's x",
          hints=["The ring of 04.1 again, but instead of adding what arrives, store it; and keep track of "
                 "which device each arriving value came from.",
                 "jax.lax.axis_index tells a device where it is (section 1); an array's .at[...].set method "
                 "writes one row of a new array, and works with a traced index.",
                 "Start with an (n, *x.shape) array of zeros holding your own x in your own row. At each of the "
                 "n - 1 hops to the right, the value that arrives comes from one device further to the left than "
                 "the one before: store it in that device's row, and pass it on."])
def check_gather_all(gather_all):
    for xs in _cases([(), (2,)], seed=4, other_dtype=np.float16):
        n = xs.shape[0]
        what = f"gather_all on {n} devices, per-device shape {xs.shape[1:]}"
        expected = C.all_gather(xs)
        got = got_arr = as_array(_run(gather_all, xs, "gather_all"), what=what, expected_shape=expected.shape)
        if got_arr.shape == expected.shape and not np.allclose(got_arr, expected):
            shown = f" ({_inputs_and_device(xs, got_arr, 1)})" if xs.ndim == 1 else ""
            rolled = np.stack([np.roll(xs, -i, axis=0) for i in range(n)])
            if np.allclose(got_arr, rolled):
                raise Mismatch(f"{what}: each device has every value, but starting with its own: row j of every "
                               f"device's result must be device j's value{shown}; here row k holds what arrived "
                               "after k hops.")
            # Values that travelled one way round the ring, filed as if they had come the other way: device i
            # stores device i + s's value in row i - s.
            mirrored = np.stack([xs[(2 * i - np.arange(n)) % n] for i in range(n)])
            if np.allclose(got_arr, mirrored):
                raise Mismatch(f"{what}: every device has every value, but in the wrong rows{shown}: the values "
                               "travel round the ring in one direction, and your bookkeeping of where each came "
                               "from assumes the other.")
            if xs.ndim == 1:
                raise Mismatch(f"{what}: every device's result should be all {n} values in device order, "
                               f"{np.array2string(expected[0], separator=', ')}; {shown[2:-1]}.")
        expect_array(got, expected, what=f"{what} (every device should hold all {n} values, in device order)")
        _same_dtype(got_arr, xs, what)
    if _uses(gather_all, xs, "all_gather") or not _uses(gather_all, xs, "ppermute"):
        raise Mismatch("right values, but it must be built from jax.lax.ppermute, not all_gather.")
    return "every device holds every device's value, in device order: an all-gather."


# ----------------------------------------------------------------------------------------------
# 04.5 (optional) The bandwidth-optimal ring: reduce-scatter, then all-gather


def solution_ring_allreduce_chunked(x, axis_name):
    n = jax.lax.psum(1, axis_name)
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


@exercise("04.5", "Optional: the bandwidth-optimal ring all-reduce", solution=solution_ring_allreduce_chunked,
          returns="on each device, an array shaped like x (a vector whose length divides by n): the sum of every "
                  "device's x",
          hints=["Section 4's ring never sends a whole x. Cut x into n pieces: first make each device the owner "
                 "of one fully summed piece (a reduce-scatter), then pass the finished pieces round (an "
                 "all-gather). Each phase is n - 1 hops of one piece.",
                 "Reshaping x to (n, V / n) gives the pieces; jax.lax.axis_index says which device you are, and "
                 "indexing with it (or an .at[...].set) works with the traced index. jax.lax.psum_scatter and "
                 "jax.lax.all_gather (section 2) are the two phases you are rebuilding.",
                 "Reduce-scatter: start by sending your own piece number me; at each hop add to what arrives your "
                 "own copy of the piece it is a partial sum of (one further to the left each hop) and send that "
                 "on. After n - 1 hops you hold the full sum of piece me + 1 (mod n). All-gather: pass that piece "
                 "round n - 1 times, storing each arrival in its row."])
def check_ring_allreduce_chunked(ring_allreduce):
    for n in sorted({len(jax.devices()), 4, 2}, reverse=True):
        rng = np.random.default_rng(n)
        xs = rng.integers(-9, 10, size=(n, 3 * n)).astype(np.float32)
        what = f"the ring all-reduce on {n} devices, each x a vector of {3 * n}"
        got = as_array(_run(ring_allreduce, xs, "ring_allreduce_chunked"), what=what, expected_shape=xs.shape)
        if got.shape == xs.shape and not np.allclose(got, C.psum(xs)):
            pieces = xs.sum(axis=0).reshape(n, -1)                 # the n fully summed pieces
            mine = got.reshape(n, n, -1)                           # device, piece, values
            shuffled = all(any(np.allclose(row, p) for p in pieces) for dev in mine for row in dev)
            if shuffled and all(len({min(range(n), key=lambda k: np.abs(row - pieces[k]).sum()) for row in dev}) == n
                                for dev in mine):
                raise Mismatch(f"{what}: every device holds all {n} fully summed pieces, but not in their places "
                               "(piece k is the k-th of the n equal slices of the result). The sums are right; the "
                               "bookkeeping of "
                               "which piece a device finishes the reduce-scatter with, or which one arrives at "
                               "each hop of the all-gather, is off: work it out by hand for 2 devices.")
        expect_array(got, C.psum(xs), what=what)
        _same_dtype(got, xs, what)
        for banned in ("psum", "psum_scatter", "reduce_scatter", "all_gather", "all_to_all"):
            if _uses(ring_allreduce, xs, banned):
                raise Mismatch(f"right values, but the program uses {banned}: build both phases from "
                               "jax.lax.ppermute alone.")
        hops, sent = _ppermute_bytes(ring_allreduce, xs)
        v, optimal = xs[0].nbytes, 2 * (n - 1) * xs[0].nbytes // n
        if hops == 0:
            raise Mismatch("right values, but the program has no ppermute: build it from jax.lax.ppermute.")
        if sent > optimal:
            whole = " That is (N - 1) x V: the ring of 04.1, passing all of x at every hop." if sent == (n - 1) * v \
                else ""
            raise Mismatch(f"right values, but on {n} devices each device sends {sent} bytes in {hops} ppermutes "
                           f"for a {v}-byte x; the bandwidth-optimal ring sends 2 (N - 1) / N x V = {optimal} bytes "
                           f"in {2 * (n - 1)} hops of one piece (V / N = {v // n} bytes) each.{whole}")
        if n == len(jax.devices()):
            report = (f"the sum on every device, and on {n} devices each device sent {sent} bytes for a {v}-byte "
                      "x: 2 (N - 1) / N x V, the ring all-reduce of section 4 (a reduce-scatter, then an "
                      "all-gather).")
    return report
