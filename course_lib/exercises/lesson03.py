"""Lesson 03 exercises: in_axes=None for a shared scalar, pytree in_axes for parameters, out_axes."""

import jax
import jax.numpy as jnp
import numpy as np

from . import Case, Mismatch, Mistake, call, diagnose, exercise, expect_placed_on, expect_pmapped, watch
from .lesson00 import _data
from .lesson06 import DUPLICATE, _mesh


# Fragments of JAX's messages for the typical mistakes, and what they mean.
SCALAR_MAPPED = ("rank at least 1", "A scalar was mapped: pmap maps every argument over axis 0 unless told "
                 "otherwise, and an argument passed by keyword always (section 3).")
TOO_MANY_SLICES = ("squeeze out", "That is pmap's message for more slices than devices: the leading axis it "
                   "mapped is longer than the number of devices.")
DEVICE_IDS = ("no attribute 'process_index'", "pmap's devices argument takes Device objects (entries of "
              "jax.devices()), not the devices' numbers.")
LEAF_MAPPED = ("squeeze out", "pmap takes the number of slices from the first mapped argument and cuts the "
               "others to match, so a mapped argument whose axis 0 is not the device count breaks it: was a "
               "leaf of the parameters mapped? The parameters are the same for every device.")
PARAMS_MAPPED = ("is partitioned", "An argument was split over the devices along axis 0 but its axis 0 is not "
                 "the device axis: were the parameters mapped? They are the same for every device.")


# ----------------------------------------------------------------------------------------------
# 03.1 The classic: scale a batch by a shared scalar on 2 devices


def solution_scale_on_two(x, s):
    two = jax.devices()[:2]
    blocks = x.reshape(2, x.shape[0] // 2, *x.shape[1:])
    out = jax.pmap(lambda block, factor: block * factor, in_axes=(0, None), devices=two)(blocks, s)
    return out.reshape(x.shape)


def _unmapped(maps) -> int:
    """The most inputs one of the pmaps in ``maps`` (shard_map equations) sent whole to every device (P())."""
    return max((sum(len(tuple(s)) == 0 for s in m.params["in_specs"]) for m in maps), default=0)


MISTAKES_03_1 = [
    Mistake("blocks not put back", "That is the per-device blocks as pmap stacks them, shape (2, B // 2, ...): x "
            "had shape (B, ...).", lambda x, s: solution_scale_on_two(x, s).reshape(2, -1, *x.shape[1:])),
    Mistake("rows interleaved", "The rows are out of order: rows 0, 2, 4, ... first, then 1, 3, ...: the rows were "
            "interleaved over the two devices (every second row to a device, a swap of axes as in exercise 02.1) "
            "and never put back in order.",
            lambda x, s: (x.reshape(-1, 2, *x.shape[1:]).swapaxes(0, 1) * s).reshape(x.shape)),
]


@exercise("03.1", "Scale a batch by a shared scalar on 2 devices", solution=solution_scale_on_two,
          returns="an array of x's shape (B, d), x * s, computed with pmap on the first 2 devices",
          hints=["pmap gives each device one slice of the leading axis, so the leading axis must be 2 here; and "
                 "the scalar is the same for both devices: it must not be split.",
                 "Section 5 of the lesson, \"The classic example, done right\". pmap's `in_axes` (section 1) "
                 "marks an argument that goes whole to every device; its `devices` argument picks the devices."])
def check_scale_on_two(scale_on_two):
    two = jax.devices()[:2]
    cases = [Case((jnp.asarray(_data(shape, seed=shape[0] * shape[1])), s), f"scale_on_two(x {shape}, {s})")
             for shape, s in [((4, 3), 2.0), ((8, 2), -0.3), ((6, 5), 3.0)]]      # -0.3: no float16 number
    summaries = {"rank at least 1": "pmap was asked to split a scalar (rank 0) over the devices.",
                 DEVICE_IDS[0]: "pmap looked for a Device and found an int.",
                 "is partitioned": "pmap could not cut an argument's mapped axis into equal blocks, one per device."}
    hints = dict([SCALAR_MAPPED, TOO_MANY_SLICES, DEVICE_IDS])
    results = diagnose(scale_on_two, cases, solution=solution_scale_on_two, mistakes=MISTAKES_03_1,
                       run=lambda fn, case: call(fn, *case.args, name="scale_on_two", summaries=summaries, hints=hints))
    for case, got in zip(cases, results):
        x, s = case.args    # s a plain number: a static argument (static_broadcasted_argnums) or a closure needs it
        maps = expect_pmapped(lambda x: scale_on_two(x, float(s)), got, (x,), two, what=case.label,
                              name="scale_on_two", how="the scalar broadcast and the blocks reshaped back",
                              work=[({"mul"}, "multiplication")], in_order=True)   # the text: jax.devices()[:2]
    if not any(len(m.params["in_specs"]) == 1 or _unmapped([m]) for m in maps):
        raise Mismatch("scale_on_two has the right values, but the scalar was mapped too (made into an array with "
                       "one copy per device), although it is the same for both devices.")
    return "one block per device, the scalar whole on both devices (not split), and the result reshaped back."


# ----------------------------------------------------------------------------------------------
# 03.2 Parameters broadcast, batch mapped


def solution_predict(params, xs):
    def predict_block(p, x):
        return x @ p["w"] + p["b"]

    return jax.pmap(predict_block, in_axes=({"w": None, "b": None}, 0))(params, xs)


MISTAKES_03_2 = [
    Mistake("transposed", "That is each block's predictions transposed: a column, not a row, is one example (the "
            "product taken the other way round).", lambda p, xs: jnp.swapaxes(solution_predict(p, xs), 1, 2)),
    Mistake("no bias", "That is xs @ w: the bias b is missing.",
            lambda p, xs: solution_predict({"w": p["w"], "b": jnp.zeros_like(p["b"])}, xs)),
    Mistake("bias subtracted", "That is xs @ w - b: the bias was subtracted, not added.",
            lambda p, xs: solution_predict({"w": p["w"], "b": -p["b"]}, xs)),
]


@exercise("03.2", "Broadcast the parameters, map the batch", solution=solution_predict,
          returns="a jax.Array of shape (n, b, k), xs[i] @ w + b for each device i, spread over the n devices",
          hints=["The parameters are the same for every device: they must not be split, nor copied by hand "
                 "into a stack of n.",
                 "`in_axes` (section 1, \"A pytree of parameters\"): one entry per positional argument, and an "
                 "entry can be None for a whole pytree, or a pytree of entries."])
def check_predict(predict):
    devices = jax.devices()
    name = getattr(predict, "__name__", "predict")
    cases = [Case(({"w": jnp.asarray(_data((d, k), seed=d * k)), "b": jnp.asarray(_data((k,), seed=k))},
                   jnp.asarray(_data((n, b, d), seed=n * b))), f"{name}(params w {(d, k)} b {(k,)}, xs {(n, b, d)})",
                  n=n) for n, b, d, k in [(len(devices), 2, 3, 2), (4, 3, 2, 5), (2, 4, 5, 1)]]

    def run(fn, case):
        params, xs = case.args
        sizes = ", ".join(f"{k} {tuple(np.shape(v))}" for k, v in params.items())
        summaries = {"is partitioned": f"pmap tried to cut axis 0 of every mapped argument into {case.n} equal "
                                       f"blocks, one per device, and could not (params: {sizes}; xs "
                                       f"{tuple(xs.shape)}).",
                     "rank at least 1": "pmap was asked to split a scalar (rank 0) over the devices.",
                     "squeeze out": "a mapped argument was cut into blocks of more than one slice each.",
                     "different types at key path": "in_axes must match the arguments: a tuple (not a list), one "
                                                    "entry (None, an int or a pytree) per argument."}
        return call(fn, dict(params), xs, name=name, hints=dict([PARAMS_MAPPED, SCALAR_MAPPED, LEAF_MAPPED]),
                    summaries=summaries)

    results = diagnose(predict, cases, solution=solution_predict, mistakes=MISTAKES_03_2, run=run, rtol=1e-4,
                       atol=1e-5)
    for case, got in zip(cases, results):
        maps = expect_pmapped(predict, got, case.args, devices[:case.n], what=case.label, name=name,
                              how="the parameters broadcast and the batch mapped", in_order=True,
                              work=[({"dot_general"}, "product x @ w"), ({"add"}, "addition of the bias")])
    (params, _), what = cases[-1].args, cases[-1].label
    if _unmapped(maps) < len(params):
        raise Mismatch(f"{what} has the right values, but the parameters were mapped over the devices (stacked "
                       "or replicated into one copy per device, then in_axes=0): this exercise is about sending "
                       "them whole to every device, not about mapping copies.")
    return "the parameters went whole to every device, the batch one block per device."


# ----------------------------------------------------------------------------------------------
# 03.3 The device axis last, with out_axes


def solution_device_axis_last(xs):
    return jax.pmap(lambda row: 2.0 * row, out_axes=1)(xs)


def _doubled(xs, **kwargs):
    return jax.pmap(lambda row: 2.0 * row, **kwargs)(xs)


MISTAKES_03_3 = [
    Mistake("negative out_axes", "That is what pmap does with a negative out_axes: its documentation asks for a "
            "non-negative axis number, and a negative one is not checked. Count the output's axes from 0 (section "
            "4).", lambda xs: _doubled(xs, out_axes=-1)),
    Mistake("device axis first", "Row i holds 2 * xs[i]: the result keeps xs's layout, (n, b); expected (b, n), "
            "column i holding 2 * xs[i], device i's result. pmap's out_axes chooses the axis the per-device "
            "results are stacked along (section 4).", _doubled),
    Mistake("reshaped", "That is a reshape of the (n, b) result: a reshape keeps the values in their order and only "
            "cuts them anew, so column i is not device i's result. Moving the device axis is what out_axes does "
            "(section 4).", lambda xs: _doubled(xs).reshape(xs.shape[1], xs.shape[0])),
]


@exercise("03.3", "Put the device axis last with out_axes", solution=solution_device_axis_last,
          returns="a jax.Array of shape (b, n): column i is 2 * xs[i], computed on device i",
          hints=["pmap stacks the per-device results along some axis of the output; you choose which one, "
                 "inside pmap, not with a transpose afterwards.",
                 "Section 4 of the lesson: pmap has an argument that does for its output what in_axes does for "
                 "its inputs."])
def check_device_axis_last(device_axis_last):
    devices = jax.devices()
    cases = [Case((jnp.asarray(_data((n, b), seed=n + 10 * b)),), f"device_axis_last(xs {(n, b)})", n=n)
             for n, b in [(len(devices), 5), (4, 3), (3, 3)]]
    results = diagnose(device_axis_last, cases, solution=solution_device_axis_last, mistakes=MISTAKES_03_3,
                       name="device_axis_last")
    for case, got in zip(cases, results):
        maps = expect_pmapped(device_axis_last, got, case.args, devices[:case.n], what=case.label,
                              name="device_axis_last", how="putting the device axis last itself",
                              work=[({"mul", "add"}, "doubling")], in_order=True)
        if not any(len(tuple(s)) >= 2 and tuple(s)[0] is None and tuple(s)[1] is not None
                   for m in maps for s in m.params["out_specs"]):
            raise Mismatch(f"{case.label} has the right values, but pmap stacked the results along axis 0 and the axes "
                           "were swapped afterwards (.T, transpose, swapaxes or moveaxis): an extra copy. Let pmap "
                           "put the device axis last itself, with out_axes (section 4).")
    return "each device's result is a column: the device axis is axis 1."


# ----------------------------------------------------------------------------------------------
# 03.4 The prediction with jax.smap on a mesh axis


def solution_smap_predict(x, w, mesh):
    from jax.sharding import PartitionSpec as P

    def block_predict(xb, wb):
        return xb @ wb

    with jax.set_mesh(mesh):
        x_split = jax.device_put(x, P("i"))
        return jax.smap(block_predict, in_axes=(0, None), out_axes=0, axis_name="i")(x_split, w)


def _shard_maps_run(fn, *args):
    """``[(axis names of the mesh, [(operand shape, spec), ...])]`` of every ``shard_map`` that ran while
    ``fn(*args)`` ran (``smap`` is one; so is ``pmap``), or ``None`` if JAX cannot tell. ``make_jaxpr`` cannot
    read an answer that enters ``jax.set_mesh`` itself, so this watches the calls instead (``watch``, with
    ``again``). A closed-over array is no operand: only what was passed to the mapped function shows."""
    try:
        from jax._src.shard_map import shard_map_p as prim
    except (ImportError, AttributeError):
        return None
    seen, original = [], prim.bind

    def watching_bind(*a, **params):
        specs = tuple(params.get("in_specs", ()))
        operands = [tuple(getattr(x, "shape", ())) for x in a[-len(specs):]] if specs else []
        seen.append((tuple(getattr(params.get("mesh"), "axis_names", ())),
                     [(shape, tuple(spec)) for shape, spec in zip(operands, specs)]))
        return original(*a, **params)

    return seen if watch(fn, args, [(prim, "bind", watching_bind)], again=lambda: not seen) else None


def _product(x, w):
    return np.asarray(x) @ np.asarray(w)


MISTAKES_03_4 = [
    Mistake("device axis in front", "A device axis in front, the pmap habit: smap's blocks keep their rank, and "
            "each device's block is joined to the others along the axis out_axes names, with no reshape.",
            lambda x, w, mesh: _product(x, w).reshape(mesh.size, -1, w.shape[1])),
    Mistake("blocks side by side", "The blocks were joined along axis 1, side by side, where the rows of the batch "
            "are joined along axis 0: out_axes names the axis the blocks are joined along.",
            lambda x, w, mesh: np.concatenate(np.split(_product(x, w), mesh.size), axis=1)),
    Mistake("one block", "That is the first device's block of rows alone, not the blocks joined along axis 0.",
            lambda x, w, mesh: _product(x, w)[: x.shape[0] // mesh.size]),
]
_NO_MESH = ("smap's axis_name names an axis of the mesh in context, and this call ran with no mesh in context: smap "
            "takes its mesh from jax.set_mesh.")
SMAP_ERRORS = {
    "specs of the input": "smap's in_axes asks for an input split over \"i\", and one arrived otherwise: smap does "
                          "not move an input for you.",
    "evenly divi": "An input was cut into as many blocks as the mesh in context has devices (JAX names the count), "
                   "along an axis that count does not divide: only x is split, over the mesh given.",
    "should match the mesh passed to shard_map": "An smap built once and called again keeps the mesh of its first "
                                                 "call, and this call gives another mesh.",
    "require replication": "out_axes=None says every device holds the same result, and here each device holds a "
                           "different block of rows: out_axes names the axis along which smap joins the blocks.",
    "truth value of an array": "That is NumPy refusing to treat an array of Devices as true or false: pmap's devices "
                               "argument wants a list of Devices. The exercise is jax.smap on the mesh given.",
    "PartitionSpec is passed to device_put": "A PartitionSpec alone names mesh axes, and this device_put ran with "
                                             "no mesh in context to say which mesh.",
    "mesh context": _NO_MESH, "Auto or Manual": _NO_MESH, "empty mesh": _NO_MESH, "set a mesh": _NO_MESH, **DUPLICATE,
}


@exercise("03.4", "The prediction with jax.smap on a mesh axis", solution=solution_smap_predict,
          returns='a jax.Array of shape (B, k), x @ w, split over the axis "i" of the mesh given',
          hints=["smap works on blocks that keep their rank, so no reshape is needed; but it does not move an "
                 "input for you, and it needs to know which mesh its axis name belongs to.",
                 "Lesson 07, Going further, the section on `jax.smap`: the paragraph that begins 'jax.smap keeps "
                 "pmap's argument names, not its semantics' says what smap needs around the call and in what "
                 "state a mapped input must arrive; the `block_matmul` cell after it runs smap both ways. Use the "
                 "mesh you were given, not one of your own."])
def check_smap_predict(smap_predict):
    name = getattr(smap_predict, "__name__", "smap_predict")
    cases = [Case((put(_data((B, d), seed=B * d)), jnp.asarray(_data((d, k), seed=d + k + n)), _mesh(n, mixed=True)),
                  f"{name}(x {(B, d)}, w {(d, k)}, a mesh of {n} devices)", n=n)     # x on the host, or on a device
             for n, B, d, k, put in [(len(jax.devices()), 16, 3, 2, np.asarray), (4, 12, 5, 3, jnp.asarray),
                                     (2, 10, 4, 3, np.asarray)]]
    results = diagnose(smap_predict, cases, solution=solution_smap_predict, mistakes=MISTAKES_03_4, rtol=1e-4,
                       atol=1e-5, run=lambda fn, case: call(fn, *case.args, name=name, hints=SMAP_ERRORS, summaries={
                           "require replication": "smap was asked for a result the same on every device (out_axes=None)"
                                                  ", and JAX cannot see that it is."}))
    for case, got in zip(cases, results):
        x, w, mesh = case.args
        expect_placed_on(got, mesh.devices.flat, in_order=True,
                         what=f"{case.label}: the values are right, but the result")
        split = tuple(getattr(got.sharding, "spec", ()))[:1] == ("i",)
        maps = _shard_maps_run(smap_predict, x, w, mesh) if split else None
        on_i = [ops for axes, ops in maps or () if "i" in axes]
        # JAX's own inner maps show too, with 3-D operands: a 2-D operand split over "i" that is not x is w (a spec
        # with any entry, a mesh axis name, splits an axis)
        wrong = (f"axis 0 is not split over the mesh axis \"i\" (its sharding: {got.sharding}). smap's result is "
                 "split over the axis it maps" if not split else
                 None if maps is None else                      # JAX cannot tell which shard_maps ran
                 "no smap over the mesh's axis \"i\" ran; "
                 f"{'shard_maps ran over other meshes' if maps else 'no shard_map ran at all'}" if not on_i else
                 "an operand of shape other than x's was split over \"i\": smap maps x split along its axis 0, "
                 "and w reaches every device whole"
                 if any(any(spec) and len(shape) == 2 and shape != x.shape for ops in on_i for shape, spec in ops) else
                 "x did not reach smap split over \"i\" along its axis 0"
                 if not any(shape == x.shape and spec[:1] == ("i",) for ops in on_i for shape, spec in ops) else None)
        if wrong:
            raise Mismatch(f"{case.label}: the values are right, but {wrong}.")
    return 'the batch was split over "i", w went whole to every device, and each device\'s block kept its rank.'
