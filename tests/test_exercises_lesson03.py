"""Lesson 03 checkers: the reference passes; typical mistakes get feedback that names them."""

import jax
import jax.numpy as jnp
import numpy as np

from course_lib.exercises import check
from course_lib.exercises.lesson03 import solution_device_axis_last, solution_predict, solution_scale_on_two

TWO = jax.devices()[:2]


def on_two(x, s, in_axes=(0, None)):
    return jax.pmap(lambda a, f: a * f, in_axes=in_axes, devices=TWO)(x.reshape(2, -1, x.shape[1]), s)


def test_03_1_scale_on_two():
    assert check("03.1", solution_scale_on_two)
    mapped_scalar = check("03.1", lambda x, s: on_two(x, s, in_axes=0).reshape(x.shape))
    assert "raised ValueError" in mapped_scalar.message and "split a scalar (rank 0)" in mapped_scalar.message and "A scalar was mapped" in mapped_scalar.message
    assert "None" not in mapped_scalar.message  # the fix is left to hint()
    no_reshape = check("03.1", lambda x, s: jax.pmap(lambda a, f: a * f, in_axes=(0, None), devices=TWO)(x, s))
    assert "more slices than devices: the leading axis it mapped is longer" in no_reshape.message
    not_back = check("03.1", on_two)
    assert "That is the per-device blocks as pmap stacks them" in not_back.message
    assert "eshape" not in not_back.message  # the fix is left to hint()
    no_pmap = check("03.1", lambda x, s: x * s)
    assert "has the right values but lives on one device" in no_pmap.message
    hard_coded = check("03.1", lambda x, s: on_two(x, 2.0).reshape(x.shape))
    assert "Its values are right in the other case" in hard_coded.message


def test_03_2_predict():
    assert check("03.2", solution_predict)
    params_mapped = check("03.2", lambda p, xs: jax.pmap(lambda p, x: x @ p["w"] + p["b"])(p, xs))
    assert "were the parameters mapped? They are the same for every device" in params_mapped.message
    no_bias = check("03.2", lambda p, xs: jax.pmap(lambda p, x: x @ p["w"], in_axes=(None, 0))(p, xs))
    assert "the bias b is missing" in no_bias.message
    one_device = check("03.2", lambda p, xs: xs @ p["w"] + p["b"])
    assert "lives on one device" in one_device.message


def test_03_3_device_axis_last():
    assert check("03.3", solution_device_axis_last)
    first = check("03.3", jax.pmap(lambda r: 2.0 * r))
    assert "got shape (8, 5) [" in first.message and "Row i holds 2 * xs[i]: the result keeps xs's layout" in first.message
    host = check("03.3", lambda xs: (2.0 * xs).T)
    assert "lives on one device" in host.message
    undoubled = check("03.3", jax.pmap(lambda r: r, out_axes=1))
    assert "2x too small" in undoubled.message
    square_first = check("03.3", lambda xs: jax.pmap(lambda r: 2.0 * r)(xs) if xs.shape[0] == xs.shape[1]
                         else solution_device_axis_last(xs))
    assert "the expected values, transposed" in square_first.message
    assert "Row i holds" not in square_first.message, "right on the other cases: no cause is named"


def test_03_1_scalar_must_be_broadcast_and_survives_wrong_structures():
    def scalar_stacked(x, s):
        return jax.pmap(lambda a, f: a * f, devices=TWO)(x.reshape(2, -1, x.shape[1]), jnp.full(2, s)).reshape(x.shape)

    fb = check("03.1", scalar_stacked)
    assert not fb and "the scalar was mapped too" in fb.message and "the same for both devices" in fb.message
    fb = check("03.1", lambda x, s: (solution_scale_on_two(x, s), s))
    assert not fb and "expected Array float32[4, 3], got tuple(" in fb.message
    # x read with NumPy: make_jaxpr cannot read the program, so the pmap is watched as it runs
    assert check("03.1", lambda x, s: on_two(np.asarray(x), s).reshape(x.shape))
    fb = check("03.1", lambda x, s: jax.pmap(jnp.copy, devices=TWO)(np.asarray(x).reshape(2, -1, x.shape[1]))
               .reshape(x.shape) * s)
    assert not fb and "no multiplication runs inside its pmap" in fb.message


def test_03_2_parameters_must_be_broadcast_not_stacked():
    # Fails on the checker before issue 14: stacked parameters passed as if broadcast.
    def stacked(p, xs):
        n = xs.shape[0]
        copies = jax.tree.map(lambda v: jnp.broadcast_to(v, (n,) + v.shape), p)
        return jax.pmap(lambda q, x: x @ q["w"] + q["b"])(copies, xs)

    fb = check("03.2", stacked)
    assert not fb and "the parameters were mapped over the devices" in fb.message and "not about mapping copies" in (
        fb.message)

    def replicated(p, xs):
        from course_lib import sharding
        return jax.pmap(lambda q, x: x @ q["w"] + q["b"])(sharding.replicate(p, jax.devices()[:xs.shape[0]]), xs)

    fb = check("03.2", replicated)
    assert not fb and "the parameters were mapped over the devices" in fb.message   # read from the pmap it ran
    assert check("03.2", lambda p, xs: jax.pmap(lambda q, x: x @ q["w"] + q["b"], in_axes=(None, 0))(p, xs))


def test_03_2_raises_or_wrong_structure():
    fb = check("03.2", lambda p, xs: jax.pmap(lambda q, x: x @ q["weights"], in_axes=(None, 0))(p, xs))
    assert not fb and "raised KeyError: 'weights'" in fb.message
    fb = check("03.2", lambda p, xs: {"pred": solution_predict(p, xs)})
    assert not fb and "expected Array float32[8, 2, 2], got dict" in fb.message


def test_03_3_device_axis_last_needs_out_axes_not_a_transpose():
    # Fails on the checker before issue 14: pmap(...)(xs).T passed.
    fb = check("03.3", lambda xs: jax.pmap(lambda r: 2.0 * r)(xs).T)
    assert not fb and "swapped afterwards (.T, transpose" in fb.message and "with out_axes (section 4)" in fb.message
    fb = check("03.3", lambda xs: jnp.swapaxes(jax.pmap(lambda r: 2.0 * r)(xs), 0, 1))
    assert not fb and "with out_axes (section 4)" in fb.message


def test_03_2_block_i_on_device_i_and_the_bias_inside_pmap():
    fb = check("03.2", lambda p, xs: jax.pmap(lambda q, x: x @ q["w"] + q["b"], in_axes=(None, 0),
                                              devices=jax.devices()[:xs.shape[0]][::-1])(p, xs))
    assert not fb and "lives on devices [7, 6, 5, 4, 3, 2, 1, 0], in block order" in fb.message
    fb = check("03.2", lambda p, xs: jax.pmap(lambda x, w: x @ w, in_axes=(0, None))(xs, p["w"]) + p["b"])
    assert not fb and "no addition of the bias runs inside its pmap" in fb.message


def test_03_3_doubling_outside_pmap_fails_and_numpy_input_passes():
    fb = check("03.3", lambda xs: jax.pmap(lambda r: r, out_axes=1)(xs) * 2)
    assert not fb and "no doubling runs inside its pmap" in fb.message
    assert check("03.3", lambda xs: jax.pmap(lambda r: r + r, in_axes=0, out_axes=1)(np.asarray(xs)))


def test_03_3_raises_or_wrong_structure():
    fb = check("03.3", jax.pmap(lambda r: 2.0 * r, out_axes=2))
    assert not fb and "raised ValueError" in fb.message
    fb = check("03.3", lambda xs: [solution_device_axis_last(xs)])
    assert not fb and "expected Array float32[5, 8], got list[Array float32[5, 8]]" in fb.message


# ---- 03.4: the prediction with jax.smap on a mesh axis ----------------------------------------

from jax.sharding import PartitionSpec as P  # noqa: E402

from course_lib.exercises.lesson03 import solution_smap_predict  # noqa: E402


def _mm(a, b):
    return a @ b


def _smap(in_axes=(0, None), out_axes=0):
    return jax.smap(_mm, in_axes=in_axes, out_axes=out_axes, axis_name="i")


def test_03_4_reference_and_a_jitted_smap_pass():
    assert check("03.4", solution_smap_predict)

    def jitted(x, w, mesh):
        with jax.set_mesh(mesh):
            return jax.jit(_smap())(jax.device_put(x, P("i")), w)
    fb = check("03.4", jitted)
    assert fb, fb.message
    # Run twice: a jit cache must not hide the smap from the checker.
    assert check("03.4", jitted)


def test_03_4_input_not_placed_is_named():
    def unplaced(x, w, mesh):
        with jax.set_mesh(mesh):
            return _smap()(x, w)
    fb = check("03.4", unplaced)
    assert not fb and "smap does not move an input for you" in fb.message


def test_03_4_weight_mapped_is_named():
    def w_mapped(x, w, mesh):
        with jax.set_mesh(mesh):
            return _smap(in_axes=0)(jax.device_put(x, P("i")), w)
    fb = check("03.4", w_mapped)
    assert not fb and "along an axis that count does not divide: only x is split" in fb.message


def test_03_4_no_mesh_context_is_named():
    fb = check("03.4", lambda x, w, mesh: _smap()(jax.device_put(x, P("i")), w))
    assert not fb and "this device_put ran with no mesh in context" in fb.message
    placed = check("03.4", lambda x, w, mesh: _smap()(jax.device_put(x, jax.NamedSharding(mesh, P("i"))), w))
    assert not placed and "smap takes its mesh from jax.set_mesh" in placed.message
    assert "PartitionSpec" not in placed.message


def test_03_4_skipping_smap_is_named():
    def sharded_jit(x, w, mesh):
        with jax.set_mesh(mesh):
            return jax.jit(_mm)(jax.device_put(x, P("i")), w)
    fb = check("03.4", sharded_jit)
    assert not fb and 'no smap over the mesh\'s axis "i" ran' in fb.message

    def with_pmap(x, w, mesh):
        devs = list(mesh.devices.flat)
        blocks = jnp.asarray(x).reshape(len(devs), -1, x.shape[1])
        return jax.pmap(_mm, in_axes=(0, None), devices=devs)(blocks, w).reshape(x.shape[0], -1)
    fb = check("03.4", with_pmap)
    assert not fb and 'not split over the mesh axis "i"' in fb.message

    fb = check("03.4", lambda x, w, mesh: jnp.asarray(x) @ w)
    assert not fb and "the result lives on 1 device(s) (ids [0]); expected the 8 devices with ids [5, 2, 6, 1, 3, 4, " \
        "0, 7]" in fb.message


def test_03_4_works_on_8_devices_but_not_on_the_4_given():
    def own_mesh(x, w, mesh):
        with jax.set_mesh(jax.make_mesh((8,), ("i",))):
            return _smap()(jax.device_put(x, P("i")), w)
    fb = check("03.4", own_mesh)
    assert not fb and "Its values are right in the other case; wrong also in: own_mesh(x (10, 4)" in fb.message

    def rotated(x, w, mesh):       # the mesh's devices rotated by one: block k is not on the mesh's k-th device
        devs = list(mesh.devices.flat)
        with jax.set_mesh(jax.sharding.Mesh(np.array(devs[1:] + devs[:1]), ("i",))):
            return _smap()(jax.device_put(x, P("i")), w)
    fb = check("03.4", rotated)
    assert not fb and "the result lives on devices [2, 6, 1, 3, 4, 0, 7, 5], in block order; expected block k on " \
        "the k-th of the devices [5, 2" in fb.message

    built_once = _smap()

    def reused(x, w, mesh):
        with jax.set_mesh(mesh):
            return built_once(jax.device_put(x, P("i")), w)
    fb = check("03.4", reused)
    assert not fb and "keeps the mesh of its first call" in fb.message


def test_03_4_out_axes_none_host_result_dtype_and_replication_are_named():
    def out_none(x, w, mesh):
        with jax.set_mesh(mesh):
            return _smap(out_axes=None)(jax.device_put(x, P("i")), w)
    fb = check("03.4", out_none)
    assert not fb and "out_axes=None says every device holds the same result" in fb.message
    fb = check("03.4", lambda x, w, mesh: np.asarray(solution_smap_predict(x, w, mesh)))
    assert not fb and "the result should be a jax.Array on 8 devices, got ndarray" in fb.message
    for dtype in (jnp.float16, jnp.bfloat16):
        fb = check("03.4", lambda x, w, mesh: solution_smap_predict(x, w, mesh).astype(dtype))
        assert not fb and f"dtype {jnp.dtype(dtype).name} where float32 was expected" in fb.message

    def replicated(x, w, mesh):
        with jax.set_mesh(mesh):
            return jax.device_put(solution_smap_predict(x, w, mesh), P())
    fb = check("03.4", replicated)
    assert not fb and "the result holds a full copy on every device; expected one block per device" in fb.message


def test_03_4_an_input_changed_in_place_is_named_and_the_checker_never_raises():
    def in_place(x, w, mesh):
        x *= 2.0
        return solution_smap_predict(x / 2.0, w, mesh)
    fb = check("03.4", in_place)
    assert not fb and "changed its input x in place" in fb.message
    for wrong in (None, 3, lambda x, w, mesh: "x @ w", lambda x, w, mesh: 1 / 0):
        fb = check("03.4", wrong)
        assert not fb
    from jax._src import shard_map as _sm
    assert "bind" not in vars(_sm.shard_map_p), "the checker leaves shard_map as it found it"
