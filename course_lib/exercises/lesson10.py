"""Lesson 10 exercises: bytes per device for each ZeRO stage, the ZeRO update of a column-split matrix with
psum_scatter, choosing K from the compiled step's peak, the FSDP step of a model split leaf by leaf, and predicting
how often each stage's collectives run in an accumulated step before the compiled program shows them."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from .. import sharded_state
from . import Case, Mismatch, Mistake, call, describe_tree, diagnose, exercise, is_placeholder, returned_none, same
from .lesson12 import _expect_whole, _or_none, _read_counts
from .lesson07 import RESTARTED, _OWN_OPTIMIZER, _Spy
from .lesson08 import mixed_devices

AXIS = "data"

# Graded hints, one at a time: a nudge toward the idea, then the API or the lesson section, then the steps in words.
HINTS = {
    "10.1": ["Start from the replicated form: how many bytes per parameter do the parameters, the gradients and "
             "Adam's state take in float32? Then ask, stage by stage, which of the three is split over the devices.",
             "Section 1, then sections 2 and 3: which of the three parts does each stage split over the devices?",
             "Write the table first: three rows (params, grads, opt_state) in bytes per parameter, four columns "
             "(the stages); divide an entry by n_devices exactly where section 2 or 3 says that stage splits that "
             "part."],
    "10.2": ["Each device needs only its own slice of the summed gradient, never the whole sum. Which collective "
             "hands each device just its slice, and along which axis are the slices cut here?",
             "Section 2's step (cell \"The step\"): the same collectives and the same slicing of this device's "
             "block, but it cuts a flat vector and yours cuts another axis: read the axis arguments of "
             "jax.lax.psum_scatter in its documentation.",
             "Run your function under jax.shard_map on a small matrix whose columns differ, and print "
             "sharded_state.collectives of the compiled program and the shape each device gets back from the "
             "scatter: is it a reduce-scatter, and is it a block of columns?"],
    "10.3": ["The peak of a step with K micro-batches is not a formula you know here: the compiler decides it. "
             "Which K are allowed at all?",
             "Section 1's peak from the compiled step's memory_analysis (make_step gives the step, its compile "
             "method the program), or sharded_state.compiled_memory; section 4 for which K divide a device's "
             "examples.",
             "Print, for each allowed K, the compiled step's arguments, outputs, aliased and temporaries: which "
             "parts change with K, and does their total fall steadily?"],
    "10.4": ["FSDP keeps only a slice of each parameter on each device: the whole parameters exist only while the "
             "loss is computed. Where must the gathers happen so that jax.grad turns them into reduce-scatters?",
             "Section 3's hand-written FSDP step and Going further's \"FSDP layer by layer\": where the "
             "jax.lax.all_gather sits relative to the function that jax.grad differentiates, and what that does to "
             "the gradient of a slice.",
             "Compile your step under jax.shard_map and print sharded_state.collectives of it: one all-gather "
             "and one reduce-scatter per sharded leaf, and no gradient-sized all-reduce, is the mechanism."],
    "10.5": ["Ask, per stage, what each device keeps across the micro-batches: a whole accumulator or only its "
             "slice? What it keeps decides when it must communicate.",
             "Section 2 (what each ZeRO stage keeps on a device), section 4's hand-written accumulated step (the "
             "code cell: its lax.scan, and where its pmean sits) and sharded_state.collectives, whose in_loop "
             "says whether a collective runs once per micro-batch.",
             "Follow one step of each stage in order: K micro-batches each give a gradient, then one update. "
             "Which collective must run before a micro-batch's gradient can be added into what the device keeps "
             "(whole, or only its slice), and which can wait for the update? Leave out the loss's scalar."],
}

def _collectives(f, args, min_bytes):
    """The collectives of ``f``'s compiled program whose buffers hold at least ``min_bytes`` (not the loss's scalar)."""
    return [c for c in sharded_state.collectives(f.lower(*args).compile().as_text()) if c.payload >= min_bytes]


def _not_the_mechanism(what, found, kind, wanted) -> Mismatch:
    return Mismatch(f"{what}: the values are right, but the compiled program's {kind} are "
                    f"{', '.join(f'{c.op} {c.described}' for c in found) or 'none'}; {wanted}")


_VMA_HINTS = {
    "unbound axis name": f"The mesh axis is named {AXIS!r}: use that name in every collective.",
    "must be divisible": "A tiled psum_scatter splits the vector into n equal slices.",
    "out_specs": "An output declared the same on every device (P()) differs between devices: average it "
                 "over the mesh axis (the loss), or gather it (the parameters).",
    "vma": "The vma checker (check_vma=True) found a value that differs between devices where one that is the "
           "same on every device is needed (or the reverse): lesson 06 and section 2 of this lesson.",
}


# ----------------------------------------------------------------------------------------------
# 10.1 Bytes per device for each stage


def solution_zero_bytes(n_params, n_devices, stage):
    params, grads, opt_state = 4 * n_params, 4 * n_params, 2 * 4 * n_params    # float32, Adam's two moments
    # grads: the gradient accumulator a device keeps across the micro-batches of a step
    if stage in ("zero1", "zero2", "fsdp"):
        opt_state /= n_devices
    if stage in ("zero2", "fsdp"):
        grads /= n_devices
    if stage == "fsdp":
        params /= n_devices
    return {"params": params, "grads": grads, "opt_state": opt_state}


_SPLIT = {"replicated": (), "zero1": ("opt_state",), "zero2": ("opt_state", "grads"),
          "fsdp": ("opt_state", "grads", "params")}
_PARTS = ("params", "grads", "opt_state")


def _table(split=_SPLIT, adam=8, share=lambda p, n: p / n):
    """A zero_bytes that splits ``split[stage]`` over the devices, ``share(p, n)`` parameters' worth on each; ``adam``
    bytes of optimizer state per parameter."""
    def zero_bytes(n_params, n_devices, stage):
        per_param = dict(zip(_PARTS, (4, 4, adam)))
        return {k: b * (share(n_params, n_devices) if k in split[stage] else n_params) for k, b in per_param.items()}
    return zero_bytes


MISTAKES_10_1 = [
    Mistake("one moment", "The optimizer state is half what it should be. Adam keeps two float32 numbers per "
            "parameter (its first and second moments): 8 bytes, not 4.", _table(adam=4)),
    Mistake("nothing split", "Every stage keeps everything whole; but each ZeRO stage splits a part of the state "
            "over the devices.", _table({s: () for s in _SPLIT})),
    Mistake("everything split", "Every stage splits all three parts; but replicated keeps everything whole, "
            "zero1 shards only the optimizer state and zero2 also the gradients.",
            _table({s: _SPLIT["fsdp"] for s in _SPLIT})),
    Mistake("zero1 splits grads", "zero1 keeps the whole gradients on every device. ZeRO-1 reduce-scatters too, "
            "but with gradient accumulation it adds whole local gradients over the micro-batches and "
            "reduce-scatters once: its accumulator is whole.", _table({**_SPLIT, "zero1": _SPLIT["zero2"]})),
    Mistake("zero2 keeps grads whole", "zero2 keeps only its slice of the gradient accumulator; this answer keeps "
            "it whole, as zero1 does.", _table({**_SPLIT, "zero2": _SPLIT["zero1"]})),
    Mistake("fsdp keeps params whole", "fsdp splits the parameters too: that is what makes it FSDP rather than "
            "zero2; this answer keeps params whole.", _table({**_SPLIT, "fsdp": _SPLIT["zero2"]})),
    Mistake("n written in", "On every case these are the numbers for all of jax.devices(), whatever n_devices "
            "says: divide by the argument n_devices.",
            lambda p, n, s: solution_zero_bytes(p, len(jax.devices()), s)),
    Mistake("zero2 splits params", "zero2 keeps the whole params on every device; only fsdp splits them.",
            _table({**_SPLIT, "zero2": _SPLIT["fsdp"]})),
    Mistake("bits", "That looks like bits (8 per byte): return bytes.",
            lambda p, n, s: {k: 8 * v for k, v in solution_zero_bytes(p, n, s).items()}),
]


# Section 2's layout: each split part a slice of the flat vector padded to a multiple of n, ceil(p / n)
_padded_bytes = _table(share=lambda p, n: -(-p // n))


def _bytes_runner(fn, case):
    """``fn(*case.args)``, with numbers of any Python kind (Fraction, Decimal) read as floats; other keys named."""
    import numbers
    got = call(fn, *case.args, name="zero_bytes")
    if isinstance(got, dict) and set(got) != set(_PARTS):
        extra, missing = [k for k in got if k not in _PARTS], [k for k in _PARTS if k not in got]
        raise Mismatch(f"zero_bytes returned the keys {list(got)}; expected exactly {list(_PARTS)} (extra: "
                       f"{extra or 'none'}; missing: {missing or 'none'}).")
    if isinstance(got, dict):
        got = {k: float(v) if isinstance(v, numbers.Number) and not isinstance(v, bool) else v
               for k, v in got.items()}
    return got


@exercise("10.1", "Bytes per device for each ZeRO stage, from the formula", solution=solution_zero_bytes,
          returns="a dict {'params': bytes, 'grads': bytes, 'opt_state': bytes} per device")
def check_zero_bytes(zero_bytes):
    from .lesson11 import _watch
    cases = [Case((p, n, stage), f"zero_bytes({p:_}, {n}, {stage!r})", n=n)
             for p, n in [(1_000_000_000, 8), (19_210, 4), (3_001, 8)] for stage in _SPLIT]   # 1500.5 B: no rounding
    library, padded = [], []
    def either(*args):      # section 2's padded slices, ceil(N / n) each, are right too, where the answer counts them
        exact, pad, got = solution_zero_bytes(*args), _padded_bytes(*args), _or_none(lambda: zero_bytes(*args))
        return pad if same(got, pad, rtol=1e-9) and not same(got, exact, rtol=1e-9) and not padded.append(1) else exact

    with _watch(sharded_state, "formula_bytes", library):
        for case in cases:
            _or_none(lambda: zero_bytes(*case.args))
    if library:
        raise Mismatch("zero_bytes gives its numbers by calling sharded_state.formula_bytes, the course's own answer "
                       "to this exercise. Write the count yourself: bytes per parameter of each part, divided where "
                       "the stage shards it.")
    diagnose(zero_bytes, cases, solution=either, mistakes=MISTAKES_10_1, run=_bytes_runner, name="zero_bytes",
             rtol=1e-9, atol=1e-6)
    return ("replicated 16 bytes per parameter per device; zero1 cuts Adam's 8, zero2 also the gradient "
            "accumulator's 4, fsdp also the parameters' 4: 16 / n in the end. Going further, \"The four stages, "
            "side by side\", compares it with the compiled programs." + (" (Yours counts the padded slices of "
            "section 2's flat vector, ceil(N / n) each: right too.)" if padded else ""))


# ----------------------------------------------------------------------------------------------
# 10.2 The ZeRO update of a matrix whose columns are split over the devices, written with psum_scatter


def solution_zero2_sgd(params, grads, lr):
    n = jax.lax.axis_size("data")
    cols = params.shape[1] // n
    mine = jax.lax.psum_scatter(grads, "data", scatter_dimension=1, tiled=True) / n     # (R, C // n), averaged
    start = jax.lax.axis_index("data") * cols
    my_params = jax.lax.dynamic_slice_in_dim(params, start, cols, axis=1)              # my block of columns
    return jax.lax.all_gather(my_params - lr * mine, "data", axis=1, tiled=True,     # (R, C) on every device,
                              to="invarying")                                          # typed the same on all


def _zero(p, g, lr, mean=True, tiled=True, gather_axis=1, start_at=None):
    """A ZeRO update of a column-split matrix, right or with one of the declared mistakes."""
    n = jax.lax.axis_size(AXIS)
    cols = p.shape[1] // n
    mine = jax.lax.psum_scatter(g, AXIS, scatter_dimension=1, tiled=True) / (n if mean else 1)
    start = jax.lax.axis_index(AXIS) * cols if start_at is None else start_at
    mine = jax.lax.dynamic_slice_in_dim(p, start, cols, axis=1) - lr * mine
    return jax.lax.all_gather(mine, AXIS, axis=gather_axis, tiled=tiled)


MISTAKES_10_2 = [
    Mistake("summed", "The step is {n} times too large. psum_scatter adds the devices' gradients; the update needs "
            "their mean.", lambda p, g, lr: _zero(p, g, lr, mean=False)),
    Mistake("own gradient", "Each device applied only its own gradient: the devices' gradients were never summed.",
            lambda p, g, lr: p - lr * g),
    Mistake("not tiled", "Each device returned the blocks stacked on a new axis; expected the whole matrix. An "
            "all_gather that is not tiled stacks what it gathers; a tiled one joins the blocks along the axis you "
            "name (lesson 04).", lambda p, g, lr: _zero(p, g, lr, tiled=False)),
    Mistake("joined along the rows", "The blocks of columns were joined along the rows. Gather along the column "
            "axis to get the whole matrix back.", lambda p, g, lr: _zero(p, g, lr, gather_axis=0)),
    Mistake("first block everywhere", "Only the first block is right: every device updated the first columns of "
            "the parameters with its own block of the gradient. Device i owns the columns from i times the block "
            "width: cut its block where its index says.", lambda p, g, lr: _zero(p, g, lr, start_at=0)),
]


def _zero2_program(fn, mesh, lr):
    """``fn`` under a jitted shard_map: every device's result stacked, ``(n, ...)``. An error from ``fn`` is
    reported with what one device received."""
    def body(p, g):
        out = call(lambda *a: [fn(*a)], p, g, lr, name="zero2_sgd", hints=_SCATTER_HINTS)[0]
        if out is None:
            raise returned_none("zero2_sgd(params, grads, lr)", fn)
        return jnp.asarray(out)[None]
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P(AXIS)), out_specs=P(AXIS), check_vma=True))


_RAN: dict = {}   # (function, case label) -> what its run measured, read by the checks after diagnose


def _zero2_run(fn, case):
    """Each device's update (its result - params), or its result when that is not shaped like params; a result
    shaped like one device's block of columns is said so."""
    whole, grads, lr, mesh = case.args
    f = _zero2_program(fn, mesh, lr)
    _or_none(lambda: jax.eval_shape(f, whole, grads))   # an error or a None inside the program is reported here
    out = call(f, whole, grads, name="jax.shard_map(zero2_sgd)", hints=_SCATTER_HINTS)
    if case.n > 1 and out.shape[1:] == (whole.shape[0], whole.shape[1] // case.n):
        raise Mismatch(f"every device returned only its block, {out.shape[1:]}: one device's columns where the whole "
                       f"matrix, {whole.shape}, is expected. The forward pass of the next step needs the whole "
                       "matrix: gather the updated blocks.")
    return out if out.shape[1:] != whole.shape or out.dtype != whole.dtype else out - whole[None]


_SCATTER_HINTS = {
    **_VMA_HINTS,
    "must be divisible": "A tiled psum_scatter splits its operand along scatter_dimension (the first axis unless "
                         "told): here each device owns a block of columns, and the number of rows does not divide by "
                         "the device count.",
    "scatter dimension": "psum_scatter's scatter_dimension names the axis the slices are cut along.",
    "from=varying, to='varying'": "JAX refuses a pcast to 'varying' of a value that already varies over the axis: "
                                  "grads is this device's own gradient, already varying, so it needs no pcast.",
    "dynamic_slice": "A slice whose start depends on axis_index is traced, and Python slicing needs fixed bounds: "
                     "section 2 cuts the block with jax.lax.dynamic_slice_in_dim(..., axis=1)."}


@exercise("10.2", "The ZeRO update of a column-split matrix: psum_scatter, update your block, all_gather",
          solution=solution_zero2_sgd, returns="the whole updated parameter matrix, float32 (R, C), on every device")
def check_zero2_sgd(zero2_sgd):
    rng = np.random.default_rng(10)
    cases = []
    for n, rows, cols, lr in [(len(jax.devices()), 3, 2, 0.1), (4, 5, 3, 0.5), (2, 7, 5, 0.1)]:
        mesh = Mesh(np.array(mixed_devices(n)), (AXIS,))
        params = rng.normal(size=(rows, n * cols)).astype(np.float32)
        local = rng.normal(size=(n, rows, n * cols)).astype(np.float32)    # device i's own gradient: local[i]
        grads = jax.device_put(local.reshape(n * rows, n * cols), NamedSharding(mesh, P(AXIS)))
        cases.append(Case((jax.device_put(params, NamedSharding(mesh, P())), grads, lr, mesh),
                          f"zero2_sgd on {n} devices, lr {lr}, a ({rows}, {n * cols}) matrix ({cols} columns per "
                          "device), each device's update (its result - params)", n=n))
    diagnose(zero2_sgd, cases, solution=solution_zero2_sgd, mistakes=MISTAKES_10_2, run=_zero2_run,
             name="zero2_sgd", rtol=1e-4, atol=1e-5)
    for case in cases:
        whole, grads, lr, mesh = case.args
        (rows, c), cols = whole.shape, whole.shape[1] // mesh.size
        what = case.label.rsplit(", each", 1)[0]
        # The mechanism, read from the compiled program: each device must receive its block of the summed gradient.
        found = _collectives(program := _zero2_program(zero2_sgd, mesh, lr), (whole, grads), 4 * rows * c)
        ops = [x.op for x in found]
        blocks = [x for x in found if x.op == "reduce-scatter"           # axes of size 1 aside (an untiled scatter)
                  and sorted(d for d in x.shape if d != 1) == sorted((rows, cols))]
        if len(blocks) != ops.count("reduce-scatter") or not blocks or "all-reduce" in ops or "all-gather" not in ops:
            raise _not_the_mechanism(what, found, "gradient-sized collectives", f"ZeRO's are a reduce-scatter that "
                                     f"hands each device its ({rows}, {cols}) block of columns of the summed gradient, "
                                     "and an all-gather of the updated blocks, with no all-reduce.")
        linear = _or_none(lambda: str(jax.make_jaxpr(jax.linearize(lambda p: program(p, grads), whole)[1])(whole)))
        if linear and "all_gather" not in linear:            # the derivative by params has no gather: none carries them
            raise Mismatch(f"{what}: the values are right, but no all-gather carries parameters: every device updates "
                           "the whole matrix with the gathered gradient. Each device is to update only its block of "
                           "columns (ZeRO keeps only that block's optimizer state on it), then gather the blocks.")
        # section 2: the gathered matrix is the same on every device, and typed so (out_specs=P() accepts it)
        if _or_none(lambda: jax.eval_shape(jax.shard_map(lambda p, g: zero2_sgd(p, g, lr), mesh=mesh, in_specs=(
                P(), P(AXIS)), out_specs=P(), check_vma=True), whole, grads)) is None:
            raise Mismatch(f"{what}: the values are right, but shard_map refuses the result as one matrix the same "
                           "on every device (out_specs=P(), check_vma=True): JAX types the gathered matrix as "
                           f"varying over {AXIS!r}. Section 2: the gather that rebuilds the parameters says so itself.")
    return ("each device receives its block of columns of the reduced gradient (a reduce-scatter along axis 1), "
            "updates only that block, and an all-gather along the same axis hands every device every block: the "
            "same traffic as data parallelism's all-reduce, whichever axis the state is split along.")


# ----------------------------------------------------------------------------------------------
# 10.3 Choosing K for a memory budget, from the compiled step's peak


def solution_choose_k(make_step, state, batch, n_devices, budget):
    per_device = jax.tree.leaves(batch)[0].shape[0] // n_devices
    for k in [k for k in range(1, per_device + 1) if per_device % k == 0]:     # K must divide a device's examples
        m = make_step(k).compile(state, batch).memory_analysis()
        needed = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
        if needed <= budget:
            return k
    return None


def _k3_model(d_in, hidden, d_out, seed):
    k1, k2 = jax.random.split(jax.random.key(seed))
    params = [{"w": jax.random.normal(k1, (d_in, hidden)) * 0.1, "b": jnp.zeros(hidden)},
              {"w": jax.random.normal(k2, (hidden, d_out)) * 0.1, "b": jnp.zeros(d_out)}]

    def loss_fn(p, b):
        h = jnp.tanh(b["x"] @ p[0]["w"] + p[0]["b"])
        logits = h @ p[1]["w"] + p[1]["b"]
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(b["y"], d_out), axis=-1))
    return params, loss_fn


@functools.lru_cache(maxsize=None)
def _k3_case(stage, n, per_device, d_in, hidden, d_out, optimizer_name):
    """One case of 10.3, built once per process: (make_step, state, batch, {K: memory parts})."""
    optimizer = {"adam": optax.adam(1e-3), "sgd+momentum": optax.sgd(0.1, momentum=0.9)}[optimizer_name]
    params, loss_fn = _k3_model(d_in, hidden, d_out, seed=n)
    mesh = sharded_state.data_mesh(jax.devices()[:n])
    state = sharded_state.init_state(params, optimizer, mesh, stage=stage)
    rows = n * per_device
    batch = {"x": np.zeros((rows, d_in), np.float32), "y": np.zeros(rows, np.int32)}
    steps, calls = {}, []

    def make_step(k):
        calls.append(k)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"make_step: k must be a whole number of micro-batches >= 1, got {k!r}.")
        if int(k) not in steps:
            steps[int(k)] = sharded_state.make_train_step(loss_fn, optimizer, stage=stage, accumulate=int(k))
        return steps[int(k)]

    parts = {}
    for k in range(1, per_device + 1):
        if per_device % k == 0:
            m = make_step(k).compile(state, batch).memory_analysis()
            p = {"arguments": int(m.argument_size_in_bytes), "outputs": int(m.output_size_in_bytes),
                 "aliased": int(m.alias_size_in_bytes), "temporaries": int(m.temp_size_in_bytes),
                 "xla_peak": int(getattr(m, "peak_memory_in_bytes", -1))}
            parts[k] = {**p, "peak": p["arguments"] + p["outputs"] - p["aliased"] + p["temporaries"]}
    return make_step, state, batch, parts, calls


def _search(measure=lambda p: p["peak"], order=lambda ks: ks, fits=lambda need, budget: need <= budget,
            candidates=lambda ks: ks, stop_at_misfit=False):
    """A choose_k that reads each K's memory parts (from the case's cache) and returns the first K that fits."""
    def choose_k(make_step, state, batch, n_devices, budget):
        parts = _K3_PARTS[id(make_step)]
        found = None
        for k in order(candidates(sorted(parts))):
            make_step(k)                                   # built (and cached) as an answer would
            if fits(measure(parts[k]), budget):
                found = k
                if not stop_at_misfit:
                    return k
            elif stop_at_misfit:
                break
        return found
    return choose_k


MISTAKES_10_3 = [
    Mistake("temporaries only", "Your answer counted only the temporaries; the step also needs its arguments (the "
            "state and the batch) and whatever outputs are not written into donated buffers.",
            _search(lambda p: p["temporaries"])),
    Mistake("XLA's peak field", "Your peak leaves out the temporaries, as memory_analysis().peak_memory_in_bytes "
            "does on the CPU backend (section 1): add arguments + outputs - aliased + temporaries yourself.",
            _search(lambda p: p["xla_peak"])),
    Mistake("aliased not subtracted", "Your answer counted the outputs written into donated buffers twice: subtract "
            "the aliased bytes.", _search(lambda p: p["arguments"] + p["outputs"] + p["temporaries"])),
    Mistake("strictly below", "A step that needs exactly the budget fits: compare with <=.",
            _search(fits=lambda need, budget: need < budget)),
    Mistake("largest K", "Your answer takes the largest K that fits; every extra micro-batch is one more pass "
            "through the model: take the smallest K that fits.", _search(order=lambda ks: ks[::-1])),
    Mistake("the count itself left out", "Wherever only K equal to the examples per device fits, your answer "
            "finds none: does its search reach that K (a range's end is excluded), and every divisor before it?",
            _search(candidates=lambda ks: ks[:-1])),
    Mistake("peak assumed to fall", "Your search assumes the peak falls steadily as K grows: it walks down from "
            "the largest K and stops at the first that does not fit. The compiled peak need not fall steadily: "
            "try every K that divides the batch.", _search(order=lambda ks: ks[::-1], stop_at_misfit=True)),
]
_K3_PARTS: dict = {}


def _k_run(fn, case):
    """Run a choose_k on a case: on copies of the state and batch, counting the steps it builds."""
    make_step, state, batch, n, budget, calls = case.args
    before = len(calls)
    got = call(lambda *a: [fn(*a)], make_step, jax.tree.map(lambda a: a, state),
               {k: np.array(a) for k, a in batch.items()}, n, budget, name="choose_k", hints={
                   "micro-batches": "K must divide each device's examples (the batch's rows divided by "
                                    "n_devices), so that every micro-batch has the same size; try only those K."
               })[0]
    if got is None and is_placeholder(fn):     # None is an answer here: "no K fits"
        raise returned_none("choose_k(make_step, state, batch, n_devices, budget)", fn)
    if len(calls) == before:       # the solution and every declared mistake build at least one
        raise Mismatch(f"choose_k returned {got!r} without building a single step: the peak of a step with K "
                       "micro-batches is read from its compiled program, make_step(K) compiled for this state "
                       "and batch.")
    return got


@exercise("10.3", "Choose the number of micro-batches for a memory budget, from the compiled step",
          solution=solution_choose_k, returns="the smallest K (an int) whose compiled step fits the budget, or None")
def check_choose_k(choose_k):
    cases = []
    for stage, n, per_device, d_in, hidden, d_out, opt_name in [
            ("zero2", len(jax.devices()), 6, 20, 160, 6, "adam"), ("replicated", 4, 6, 24, 96, 4, "sgd+momentum"),
            ("fsdp", 2, 12, 16, 128, 5, "adam")]:
        make_step, state, batch, parts, calls = _k3_case(stage, n, per_device, d_in, hidden, d_out, opt_name)
        _K3_PARTS[id(make_step)] = parts
        peaks = {k: p["peak"] for k, p in parts.items()}
        ks = sorted(parts)
        # budgets: room for every K (even with the aliased bytes counted twice: every declared mistake finds one);
        # exactly the peak of a K that beats every smaller one (not K = 1); too little
        record = [k for i, k in enumerate(ks) if all(peaks[k] < peaks[j] for j in ks[:i])]
        # and budgets where the declared mistakes' measures part: only some K's temporaries or XLA's field fit
        budgets = [max(p["peak"] + p["aliased"] for p in parts.values()) + 4096,
                   *([peaks[k] for k in record[1:][:2]] or [peaks[ks[0]]]),
                   min(peaks.values()) - 1, *{min(p[m] for p in parts.values()) for m in ("temporaries", "xla_peak")}]
        cases += [Case((make_step, state, batch, n, budget, calls), f"a {stage!r} state on {n} devices "
                       f"({per_device} examples each, {opt_name}), budget={budget:_}", n=n) for budget in budgets]
    try:
        diagnose(choose_k, cases, solution=solution_choose_k, mistakes=MISTAKES_10_3, run=_k_run,
                 name="choose_k", rtol=0, atol=0)
    except Mismatch as e:                 # None where a K fits: say which K, not only the types
        case = next((c for c in cases if str(e).startswith(f"{c.label}: expected one number, got NoneType")), None)
        if case is None:
            raise
        k, per = solution_choose_k(*case.args[:5]), case.args[2]["x"].shape[0] // case.args[3]
        raise Mismatch(f"{str(e).replace('got NoneType', 'got None')} None says no K fits, but K = {k} (a divisor "
                       f"of the {per} examples per device) fits this budget.") from None
    return ("the smallest K whose compiled step, arguments + outputs - aliased + temporaries, fits: read from the "
            "program, not guessed, since the peak need not fall steadily with K.")


# ----------------------------------------------------------------------------------------------
# 10.4 Write the FSDP step for a model whose every leaf is split along its first axis


def solution_fsdp_step(loss_fn, optimizer):
    def step(my_params, opt_state, batch):
        n = jax.lax.axis_size("data")

        def sliced_loss(p):
            whole = jax.tree.map(lambda s: jax.lax.all_gather(s, "data", tiled=True), p)   # every leaf, whole
            return loss_fn(whole, batch)

        loss, grads = jax.value_and_grad(sliced_loss)(my_params)            # grads: my rows of each leaf, summed
        updates, opt_state = optimizer.update(jax.tree.map(lambda g: g / n, grads), opt_state, my_params)
        return optax.apply_updates(my_params, updates), opt_state, jax.lax.pmean(loss, "data")

    return step


def _toy_problem(n, d_in, hidden, d_out, seed):
    """A one-hidden-layer classifier whose leaves all split along their first axis over ``n`` devices:
    ``loss_fn(params, batch)`` with ``params = {"w1": (d_in, hidden), "b1": (hidden,), "w2": (hidden, d_out)}``."""
    def loss_fn(params, batch):
        h = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
        logits = h @ params["w2"]
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(batch["y"], d_out), axis=-1))

    rng = np.random.default_rng(seed)
    params = {"w1": (rng.normal(size=(d_in, hidden)) * 0.5).astype(np.float32),
              "b1": (rng.normal(size=hidden) * 0.1).astype(np.float32),
              "w2": (rng.normal(size=(hidden, d_out)) * 0.5).astype(np.float32)}
    rows = 4 * n
    data = [{"x": rng.normal(size=(rows, d_in)).astype(np.float32), "y": rng.integers(0, d_out, rows).astype(np.int32)}
            for _ in range(3)]
    return loss_fn, params, data


_NEEDS_WHOLE = ("Shapes that do not fit: loss_fn needs every parameter whole, and the optimizer's update this "
                "device's rows of each (gradients, state and params alike).")


def _gradient_all_reduces(found, slice_bytes):
    """The all-reduces of ``found`` that carry more than a scalar and the slices: a reduced gradient, whole or most
    of it."""
    return [c for c in found if c.op == "all-reduce" and slice_bytes < sum(
        sharded_state._array_bytes(dt, shape) for dt, shape in (c.operands or ((c.dtype, c.shape),)) if shape)]


def _fsdp_run(make, case):
    """Run ``make(loss_fn, optimizer)``'s step under shard_map for 3 steps: {first update, losses, params after 3
    steps}. Mechanism facts raise here; ``_RAN[make, label]`` keeps the program for the checks after."""
    n, (d_in, hidden, d_out), opt_name, optimizer = case.args
    loss_fn, params, data = _toy_problem(n, d_in, hidden, d_out, seed=n)
    spy = _Spy(optimizer)

    def whole_loss(p, batch):       # the shapes of what the answer's step gives loss_fn, measured while tracing
        for k, (rows, *rest) in [(k, v.shape) for k, v in params.items() if isinstance(p, dict) and k in p]:
            _expect_whole(f"loss_fn received params[{k!r}]", np.shape(p[k]), (rows // n, *rest), 0)
        return loss_fn(p, batch)
    step = call(make, whole_loss, spy.transformation(), name="make_fsdp_step")
    if not callable(step):
        raise Mismatch(f"make_fsdp_step(loss_fn, optimizer) returned {describe_tree(step)}; expected the step "
                       "function, step(my_params, opt_state, batch), that runs on each device.")
    mesh = Mesh(np.array(mixed_devices(n)), (AXIS,))
    split = jax.tree.map(lambda _: P(AXIS), params)
    opt_state = optimizer.init(jax.tree.map(jnp.asarray, params))
    opt_specs = jax.tree.map(lambda a: P(AXIS) if np.ndim(a) else P(), opt_state)
    put = lambda tree, specs: jax.device_put(tree, jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                                                                is_leaf=lambda s: isinstance(s, P)))

    def body(p, o, b):
        out = step(p, o, b)
        if out is None:
            raise returned_none("step(my_params, opt_state, batch)", step, "the new slices, the new optimizer "
                                "state and the loss")
        kinds = {jax.tree.structure(t): k for t, k in ((p, "params"), (o, "opt_state"), (0., "loss"), (None, "None"))}
        order = isinstance(out, (tuple, list)) and tuple(
            kinds.get(jax.tree.structure(v), "something else") for v in out)
        if order != ("params", "opt_state", "loss"):            # the order, or a None, said before any value
            shaped = f": shaped like ({', '.join(order)})" if order else ""
            raise Mismatch(f"step returned {describe_tree(out)}{shaped}; expected (params, opt_state, loss), three "
                           "things: the new slices of the parameters, the new optimizer state and the loss.")
        return tuple(out)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(split, opt_specs, P(AXIS)),
                              out_specs=(split, opt_specs, P()), check_vma=True))
    args = (put(params, split), put(opt_state, opt_specs), put(data[0], P(AXIS)))
    rows = _or_none(lambda: {k: s.shape[0] for k, s in jax.eval_shape(f, *args)[0].items()}) or {}
    for k, v in params.items():
        if rows.get(k) == n * v.shape[0]:
            raise Mismatch(f"each device returned {k} with {v.shape[0]} rows; FSDP keeps only this device's "
                           f"{v.shape[0] // n} rows of it between steps: return the updated slices, not the "
                           "gathered parameters.")
    p, o, losses, first = args[0], args[1], [], None
    for batch in data:
        p, o, loss = call(f, p, o, put(batch, P(AXIS)), name="step", hints={
            **_VMA_HINTS, **_OWN_OPTIMIZER, "dot_general requires contracting dimensions": _NEEDS_WHOLE,
            "Incompatible shapes for broadcasting": _NEEDS_WHOLE, "add got incompatible shapes": _NEEDS_WHOLE})
        losses.append(loss)
        first = {k: np.asarray(p[k]) - params[k] for k in params} if first is None else first
    if not spy.updates:
        raise Mismatch("your step never calls the update of the optimizer it was given. Whatever optimizer "
                       "make_fsdp_step receives (SGD, momentum, Adam) must make the update.")
    _RAN[make, case.label] = (f, args, sum(v.size for v in params.values()))
    return {"first update": first, "losses": np.stack(losses), "params after 3 steps": dict(p),
            "opt_state after 3 steps": jax.tree.map(np.asarray, o)}


def _fsdp_as(by=lambda n: n, then=lambda g: g, state="new"):
    """The FSDP step: gradient / ``by(n)``, through ``then``; the state in returned ("old") or never read ("init")."""
    def make(loss_fn, optimizer):
        def step(my_params, opt_state, batch):
            n = jax.lax.axis_size(AXIS)
            loss, grads = jax.value_and_grad(lambda p: loss_fn(jax.tree.map(
                lambda s: jax.lax.all_gather(s, AXIS, tiled=True), p), batch))(my_params)
            old = optimizer.init(my_params) if state == "init" else opt_state
            updates, new = optimizer.update(jax.tree.map(lambda g: then(g / by(n)), grads), old, my_params)
            return optax.apply_updates(my_params, updates), old if state == "old" else new, jax.lax.pmean(loss, AXIS)
        return step
    return make


MISTAKES_10_4 = [
    Mistake("summed, not averaged", "The steps are those of the mean gradient times the device count: the update "
            "was fed a sum over the devices where it needs the mean. The gradient of a slice gathered inside the "
            "loss arrives summed (the transpose of a gather is a reduce-scatter); one taken through a gather "
            "declared invarying arrives summed already, and a psum_scatter then sums again. Count the sums and "
            "divide once by the device count.", _fsdp_as(by=lambda n: 1)),
    *[Mistake(name, "Each device's gradient is the mean of all the devices' gradient slices, different rows of each "
              "leaf: a pmean after the reduce-scatter mixes them. The reduce-scatter already summed each slice over "
              "the devices" + (", and dividing by the device count makes that sum the mean." if by else
                               "; divide it by the device count, with no collective."),
              _fsdp_as(by=by or (lambda n: 1), then=lambda g: jax.lax.pmean(g, AXIS)))
      for name, by in [("pmean of the scattered slices", None), ("pmean after dividing", lambda n: n)]],
    Mistake("old optimizer state", "The optimizer state returned is always a fresh one, as optimizer.init gives (the "
            "one that came in, or a new init): return the state optimizer.update gives.", _fsdp_as(state="old")),
    Mistake("state restarted", RESTARTED, _fsdp_as(state="init")),
]


@exercise("10.4", "Write the FSDP step: every leaf split, gathered for the loss, its gradient reduce-scattered",
          solution=solution_fsdp_step,
          returns="a function step(my_params, opt_state, batch) -> (new my_params, new opt_state, mean loss)")
def check_fsdp_step(make_fsdp_step):
    cases = [Case((n, dims, name, opt), f"your FSDP step on {n} devices with {name}, leaves w1 {dims[:2]}, b1 "
                  f"({dims[1]},), w2 {dims[1:]}, each split along its first axis", n=n)
             for n, dims, name, opt in [(len(jax.devices()), (8, 16, 3), "optax.sgd(0.5)", optax.sgd(0.5)),
                                        (4, (12, 8, 5), "optax.adamw(0.05, weight_decay=0.1)",
                                         optax.adamw(0.05, weight_decay=0.1)),
                                        (2, (6, 10, 4), "optax.sgd(0.3, momentum=0.9)",
                                         optax.sgd(0.3, momentum=0.9))]]
    _RAN.clear()
    try:
        diagnose(make_fsdp_step, cases, solution=solution_fsdp_step, mistakes=MISTAKES_10_4, run=_fsdp_run,
                 name="make_fsdp_step", rtol=1e-4, atol=1e-5)
    except Mismatch as e:
        texts = [f.lower(*args).as_text() for (make, _), (f, args, _) in _RAN.items() if make is make_fsdp_step]
        low = {name for name, t in (("bfloat16", "bf16"), ("float16", r"[x<]f16\b")) if re.search(t, " ".join(texts))}
        if low:                   # values that differ, from a half-precision computation
            raise Mismatch(f"{e} Your code computes in {' and '.join(sorted(low))}: with 8 bits of mantissa "
                           "(bfloat16) or 11 (float16) the result is no longer float32's. Keep this exercise in "
                           "float32.") from None
        raise
    for case in cases:
        f, args, n_params = _RAN[make_fsdp_step, case.label]
        every = _collectives(f, args, 1)
        if _gradient_all_reduces(every, 4 * n_params // case.n) or {"all-gather", "reduce-scatter"} - {
                c.op for c in every}:
            raise _not_the_mechanism(case.label, every, "collectives", "FSDP's are an all-gather of the parameters "
                                     "and a reduce-scatter of the gradient, with no gradient-sized all-reduce. Let "
                                     "jax.grad transpose the gather (section 3); a gather declared the same on every "
                                     "device (invarying) makes jax.grad sum the whole gradient everywhere instead.")
    return ("every leaf stays split between steps; the gathers inside the loss make jax.grad return each slice's "
            "reduce-scattered (summed) gradient, divided by n for the mean; the same training as data parallelism, "
            "whatever the model's leaves.")


# ----------------------------------------------------------------------------------------------
# 10.5 Predict how often each collective runs in one accumulated step, then read it from the compiled program


def solution_predict_collectives(stage, k):
    # collectives on parameter-sized buffers, runs per step with k micro-batches (the loss's scalar left out)
    return {"replicated": {"all-reduce": 1},
            "zero1": {"reduce-scatter": 1, "all-gather": 1},
            "zero2": {"reduce-scatter": k, "all-gather": 1}}[stage]


_K5 = (3, 5)


@functools.lru_cache(maxsize=None)
def _compiled_counts():
    """``{(stage, k): ({op: runs per step}, [Collective])}`` for sharded_state's accumulated steps of a small MLP,
    read from the compiled programs: a collective inside the loop runs k times."""
    params, loss_fn = _k3_model(10, 24, 3, seed=5)
    n = len(jax.devices())
    optimizer = optax.adam(1e-3)
    compiled = {}
    for k in _K5:
        batch = {"x": np.zeros((k * 2 * n, 10), np.float32), "y": np.zeros(k * 2 * n, np.int32)}
        # FSDP left out (its counts depend on XLA hoisting a gather); replicated's and zero1's do not depend on k
        for stage in ("replicated", "zero1", "zero2") if k == _K5[0] else ("zero2",):
            state = sharded_state.init_state(params, optimizer, stage=stage)
            step = sharded_state.make_train_step(loss_fn, optimizer, stage=stage, accumulate=k)
            found = [c for c in sharded_state.collectives(step.compile(state, batch).as_text()) if c.shape]
            counts = {op: sum(k if c.in_loop else 1 for c in found if c.op == op) for op in {c.op for c in found}}
            compiled[stage, k] = (counts, found)
    return compiled


def _table_5(**changes):
    """A prediction: the right table, with ``changes[stage](k)`` for the stages named."""
    return lambda stage, k: changes[stage](k) if stage in changes else solution_predict_collectives(stage, k)


_KEEPS = ("What does a {} device keep across the micro-batches: a whole gradient accumulator, or only its slice? "
          "Where, then, must its {} sit: inside the micro-batch loop, or after it?")
MISTAKES_10_5 = [
    Mistake("zero2 scatters once", _KEEPS.format("ZeRO-2", "reduce-scatter"),
            _table_5(zero2=lambda k: {"reduce-scatter": 1, "all-gather": 1})),
    Mistake("zero1 scatters every micro-batch", _KEEPS.format("ZeRO-1", "reduce-scatter"),
            _table_5(zero1=lambda k: {"reduce-scatter": k, "all-gather": 1})),
    Mistake("zero2 gathers every micro-batch", "The all-gather rebuilds the whole parameters from the updated "
            "slices: is the update made for each micro-batch, or for the step?",
            _table_5(zero2=lambda k: {"reduce-scatter": k, "all-gather": k})),
    Mistake("replicated all-reduces every micro-batch", _KEEPS.format("data-parallel", "all-reduce"),
            _table_5(replicated=lambda k: {"all-reduce": k})),
    Mistake("zero1 all-reduces", "Does a ZeRO-1 device need the whole summed gradient, or only its slice of it? "
            "(The counts asked for are of parameter-sized buffers: they leave out the loss's scalar all-reduce.)",
            _table_5(zero1=lambda k: {"all-reduce": 1, "all-gather": 1})),
    Mistake("the loss's all-reduce counted", "ZeRO-1 and ZeRO-2 have an all-reduce in your prediction: if it is "
            "the loss's, a scalar, leave it out: the counts asked for are of parameter-sized buffers.",
            _table_5(zero1=lambda k: {"reduce-scatter": 1, "all-gather": 1, "all-reduce": 1},
                     zero2=lambda k: {"reduce-scatter": k, "all-gather": 1, "all-reduce": 1})),
    Mistake("zero2 without its gather", "ZeRO-2's prediction has no all-gather: after each device has updated only "
            "its slice, how does every device get the whole parameters back for the next forward pass?",
            _table_5(zero2=lambda k: {"reduce-scatter": k})),
]


@exercise("10.5", "Predict how often each collective runs in an accumulated step, for each stage",
          solution=solution_predict_collectives,
          returns='a dict {collective: runs per step}, e.g. {"all-reduce": 1}, for a stage ("replicated", '
                  '"zero1" or "zero2") and k micro-batches')
def check_predict_collectives(predict):
    cases = [Case((stage, k), f"predict({stage!r}, {k})") for stage, k in _compiled_counts()]
    diagnose(predict, cases, solution=lambda stage, k: _compiled_counts()[stage, k][0], mistakes=MISTAKES_10_5,
             run=lambda fn, case: _read_counts(call(fn, *case.args, name="predict")),
             name="predict", reveal=False)
    return ("read from the compiled programs: a collective inside the micro-batch loop runs k times per step. "
            "ZeRO-1 communicates once per step like data parallelism; ZeRO-2 scatters every micro-batch and "
            "gathers once.")
