"""Lesson 07's migration table, row by row: the pmap form and today's form give the same result."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from course_lib import sharding

X = jnp.arange(16.0).reshape(8, 2)


@pytest.fixture
def mesh(devices):
    return jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Explicit,))


def test_axis_name_becomes_a_mesh_axis(mesh):
    old = jax.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i")(X)
    new = jax.shard_map(lambda x: jax.lax.psum(x, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i"))(
        jax.device_put(X, NamedSharding(mesh, P("i"))))
    np.testing.assert_array_equal(old, new)


def test_in_axes_none_becomes_P(mesh):
    scale = jnp.float32(3.0)
    old = jax.pmap(lambda x, s: x * s, in_axes=(0, None))(X, scale)
    new = jax.shard_map(lambda x, s: x * s, mesh=mesh, in_specs=(P("i"), P()), out_specs=P("i"))(
        jax.device_put(X, NamedSharding(mesh, P("i"))), jax.device_put(scale, NamedSharding(mesh, P())))
    np.testing.assert_array_equal(old, new)


def test_out_axes_none_becomes_P_with_a_replication_the_checker_sees(mesh):
    xs = jax.device_put(X, NamedSharding(mesh, P("i")))
    old = jax.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i", out_axes=None)(X)
    new = jax.shard_map(lambda x: jax.lax.psum(x, "i"), mesh=mesh, in_specs=P("i"), out_specs=P())(xs)
    np.testing.assert_array_equal(old, new[0])
    # pmap accepts out_axes=None for values that differ and returns device 0's; shard_map refuses at trace time.
    np.testing.assert_array_equal(jax.pmap(lambda x: x, out_axes=None)(X), X[0])
    with pytest.raises(ValueError, match="out_specs which require replication which can't be statically inferred"):
        jax.shard_map(lambda x: x, mesh=mesh, in_specs=P("i"), out_specs=P())(xs)


def test_replicate_becomes_device_put_with_P(mesh):
    params = {"w": jnp.arange(3.0)}
    old = sharding.replicate(params)
    new = jax.device_put(params, NamedSharding(mesh, P()))
    assert new["w"].shape == (3,) and old["w"].shape == (8, 3)
    assert new["w"].sharding.is_fully_replicated and len(new["w"].devices()) == 8
    for shard in new["w"].addressable_shards:
        np.testing.assert_array_equal(shard.data, np.asarray(old["w"])[shard.device.id])


def test_unreplicate_or_x0_becomes_addressable_shards(mesh, devices):
    new = jax.device_put(jnp.arange(3.0), NamedSharding(mesh, P()))
    first = new.addressable_shards[0].data
    assert first.devices() == {devices[0]}
    np.testing.assert_array_equal(first, sharding.unreplicate(sharding.replicate(jnp.arange(3.0))))
    np.testing.assert_array_equal(sharding.unreplicate(new), first)


def test_nested_pmap_becomes_one_shard_map_over_a_2d_mesh(devices):
    with pytest.raises(ValueError, match="should match the mesh passed to shard_map"):
        jax.pmap(jax.pmap(lambda x: jax.lax.psum(x, "inner"), axis_name="inner"), axis_name="outer")(
            jnp.ones((2, 4)))
    mesh2d = jax.make_mesh((2, 4), ("outer", "inner"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    x = jnp.arange(8.0).reshape(2, 4)
    out = jax.shard_map(lambda b: jax.lax.psum(b, "inner"), mesh=mesh2d, in_specs=P("outer", "inner"),
                        out_specs=P("outer", "inner"))(jax.device_put(x, NamedSharding(mesh2d, P("outer", "inner"))))
    np.testing.assert_array_equal(out, np.repeat(x.sum(axis=1, keepdims=True), 4, axis=1))


def test_device_put_replicated_becomes_device_put_with_a_named_sharding(mesh):
    with pytest.raises(AttributeError, match="device_put_replicated is deprecated; use jax.device_put instead"):
        jax.device_put_replicated(jnp.ones(3), jax.devices())
    stacked = jax.device_put(jnp.broadcast_to(jnp.ones(3), (8, 3)), NamedSharding(mesh, P("i")))
    assert [s.data.shape for s in stacked.addressable_shards] == [(1, 3)] * 8


def test_pmap_in_axes_becomes_smap_on_a_mesh_axis(mesh):
    # Row 8: jax.smap keeps pmap's in_axes/out_axes; its blocks keep their rank; it needs the input split.
    w = jnp.arange(6.0).reshape(2, 3)
    shapes = []

    def block(v, w):
        shapes.append(v.shape)
        return v @ w

    old = jax.pmap(block, in_axes=(0, None))(X, w)
    with jax.set_mesh(mesh):
        smapped = jax.jit(jax.smap(block, in_axes=(0, None), out_axes=0, axis_name="i"))
        new = smapped(jax.device_put(X, P("i")), w)
        assert str(jax.typeof(new)) == "float32[8@i,3]"
        with pytest.raises(ValueError, match="does not match the specs of the input"):
            smapped(X, w)
        with pytest.raises(ValueError, match="should match the mesh passed to shard_map"):
            jax.pmap(block, in_axes=(0, None))(X, w)                     # pmap refuses a mesh context
    np.testing.assert_array_equal(old, new)
    assert shapes[:2] == [(2,), (1, 2)]


def test_a_classifier_gradient_on_an_explicit_mesh_needs_set_mesh(mesh):
    # Lesson 07 section 2: optax's integer-label cross entropy under sharded jit, Explicit mesh.
    import optax

    def xent(params, x, labels):
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(x @ params["w"], labels))

    params = jax.device_put({"w": jnp.zeros((2, 4))}, NamedSharding(mesh, P()))
    x = jax.device_put(X, NamedSharding(mesh, P("i")))
    labels = jax.device_put(jnp.arange(8) % 4, NamedSharding(mesh, P("i")))
    grad = jax.jit(jax.grad(xent))
    with pytest.raises(Exception, match="out_sharding") as failure:
        grad(params, x, labels)
    assert type(failure.value).__name__ == "ShardingTypeError"
    with jax.set_mesh(mesh):
        g = grad(params, x, labels)
    assert g["w"].shape == (2, 4) and g["w"].sharding.is_fully_replicated
    reference = jax.grad(xent)({"w": jnp.zeros((2, 4))}, np.asarray(X), np.arange(8) % 4)
    np.testing.assert_allclose(g["w"], reference["w"], rtol=1e-6)


def test_with_sharding_constraint_asserts_under_set_mesh_and_is_ignored_outside(mesh):
    # Lesson 07, section 2: on an Explicit mesh the constraint is an assertion under jax.set_mesh; outside a mesh
    # context it is neither checked nor applied (the value keeps its sharding), while jax.reshard changes it.
    xs = jax.device_put(jnp.ones((16, 3)), NamedSharding(mesh, P("i")))
    constrained = jax.jit(lambda v: jax.lax.with_sharding_constraint(v * 2, NamedSharding(mesh, P())))
    with jax.set_mesh(mesh):
        with pytest.raises(AssertionError, match="acts as an assert"):
            constrained(xs)
    assert constrained(xs).sharding.spec == P("i", None)
    assert jax.jit(lambda v: jax.reshard(v * 2, NamedSharding(mesh, P())))(xs).sharding.is_fully_replicated


def test_grad_of_a_shard_map_loss_runs_under_jit_and_fails_eagerly_without_a_mesh_context(mesh):
    # Lesson 06, idiom 2: grad outside shard_map of a pmean-ed loss; jitted it needs no mesh context, eagerly it does.
    w = jax.device_put(jnp.float32(1.0), NamedSharding(mesh, P()))
    xb = jax.device_put(jnp.arange(16.0), NamedSharding(mesh, P("i")))
    loss = jax.shard_map(lambda w, b: jax.lax.pmean(jnp.mean((w * b) ** 2), "i"), mesh=mesh,
                         in_specs=(P(), P("i")), out_specs=P())
    want = float(jax.grad(lambda w, b: jnp.mean((w * b) ** 2))(jnp.float32(1.0), jnp.arange(16.0)))
    assert float(jax.jit(jax.grad(loss))(w, xb)) == pytest.approx(want)
    with pytest.raises(ValueError, match="set_mesh"):
        jax.grad(loss)(w, xb)
    with jax.set_mesh(mesh):
        assert float(jax.grad(loss)(w, xb)) == pytest.approx(want)


def test_slurm_auto_detection_gives_each_process_one_gpu(monkeypatch):
    # Lesson 08, section 4: under SLURM, initialize() without arguments sets local_device_ids to the task's local id
    # (one GPU per process), so one task per node would drive only its node's first GPU.
    clusters = pytest.importorskip("jax._src.clusters")
    env = {"SLURM_JOB_ID": "1", "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_NTASKS": "16", "SLURM_PROCID": "11",
           "SLURM_LOCALID": "3", "SLURM_STEP_NUM_NODES": "2"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in ("KUBERNETES_SERVICE_HOST", "OMPI_MCA_orte_hnp_uri", "PMIX_SERVER_URI2", "TPU_WORKER_HOSTNAMES"):
        monkeypatch.delenv(name, raising=False)
    detect = clusters.ClusterEnv.auto_detect_unset_distributed_params
    try:
        address, count, pid, local_ids = detect(None, None, None, None, None, None)
    except TypeError:
        pytest.skip("this JAX's cluster detection has another signature")
    assert (count, pid, list(local_ids)) == (16, 11, [3])
    assert address.startswith("node1:")


def test_row_8_smap_keeps_pmaps_argument_names_not_its_semantics():
    # Lesson 07, row 8: pmap's pmean(grad) step, ported to jax.smap unchanged, returns an n-times gradient
    # (smap checks vma, so a broadcast parameter's gradient comes back summed); pcast to varying fixes it.
    n = len(jax.devices())
    mesh = jax.make_mesh((n,), ("i",))
    xb = jnp.arange(2.0 * n)
    mean_loss = lambda w, b: jnp.mean((w * b) ** 2)
    true = float(jax.grad(mean_loss)(jnp.float32(1.0), xb))
    pmap_grad = lambda w, b: jax.lax.pmean(jax.grad(mean_loss)(w, b), "i")
    fixed = lambda w, b: pmap_grad(jax.lax.pcast(w, "i", to="varying"), b)
    args = dict(in_axes=(None, 0), out_axes=None, axis_name="i")
    assert float(jax.pmap(pmap_grad, **args)(jnp.float32(1.0), xb.reshape(n, 2))) == pytest.approx(true)
    with jax.set_mesh(mesh):
        xs = jax.device_put(xb, P("i"))
        assert float(jax.smap(pmap_grad, **args)(jnp.float32(1.0), xs)) == pytest.approx(n * true)
        assert float(jax.smap(fixed, **args)(jnp.float32(1.0), xs)) == pytest.approx(true)
        with pytest.raises(TypeError, match="out_axes"):
            jax.smap(pmap_grad, in_axes=(None, 0), axis_name="i")
        # A negative axis acts as axis 0: -1 on a (3, 2n) array split along axis 1 maps the 3 rows and fails.
        cols = jax.device_put(jnp.ones((3, 2 * n)), P(None, "i"))
        assert jax.smap(lambda v: v, in_axes=1, out_axes=1, axis_name="i")(cols).shape == (3, 2 * n)
        with pytest.raises(ValueError, match="divisible"):
            jax.smap(lambda v: v, in_axes=-1, out_axes=-1, axis_name="i")(cols)
