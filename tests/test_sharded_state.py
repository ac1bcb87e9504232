"""course_lib.sharded_state: every stage trains the same, shards what it says, and says what it sends."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from course_lib import sharded_state as ss

N = 8
RTOL = 1e-5          # float32 sums in a different order (psum against psum_scatter): a few ulps per step


def mlp(seed=0, d_in=12, hidden=24, d_out=5):      # 5 and 12 * 24 + 24 + 24 * 5 + 5 = 437 parameters: not / 8
    k1, k2 = jax.random.split(jax.random.key(seed))
    return [{"w": jax.random.normal(k1, (d_in, hidden)) * 0.3, "b": jnp.zeros(hidden)},
            {"w": jax.random.normal(k2, (hidden, d_out)) * 0.3, "b": jnp.zeros(d_out)}]


def loss_fn(p, batch):
    h = jnp.tanh(batch["x"].astype(p[0]["w"].dtype) @ p[0]["w"] + p[0]["b"])
    logits = (h @ p[1]["w"] + p[1]["b"]).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()


def batches(count, size=64, seed=1):
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(size, 12)).astype(np.float32), "y": rng.integers(0, 5, size).astype(np.int32)}
            for _ in range(count)]


def train(stage, steps=4, accumulate=1, compute_dtype=jnp.float32, data=None, opt=None):
    opt = opt or optax.adam(0.05)
    state = ss.init_state(mlp(), opt, stage=stage)
    step = ss.make_train_step(loss_fn, opt, stage=stage, accumulate=accumulate, compute_dtype=compute_dtype)
    losses = []
    for b in data or batches(steps):
        state, metrics = step(state, b)
        losses.append(float(metrics["loss"]))
    return state, losses, step


def reference_losses(data, lr=0.05):
    """Single-device, whole-batch Adam on the pytree: the training every stage must reproduce."""
    opt = optax.adam(lr)
    params, opt_state, losses = mlp(), None, []
    opt_state = opt.init(params)
    for b in data:
        loss, g = jax.value_and_grad(loss_fn)(params, b)
        updates, opt_state = opt.update(g, opt_state, params)
        params = optax.apply_updates(params, updates)
        losses.append(float(loss))
    return params, losses


@pytest.mark.parametrize("stage", ss.STAGES)
def test_every_stage_trains_like_single_device_adam(devices, stage):
    data = batches(4)
    ref_params, ref_losses = reference_losses(data)
    state, losses, _ = train(stage, data=data)
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
    for got, want in zip(jax.tree.leaves(ss.params_of(state)), jax.tree.leaves(ref_params)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("stage, grad_op, per_micro_batch", [
    ("replicated", "all-reduce", False), ("zero1", "reduce-scatter", False), ("zero2", "reduce-scatter", True),
    ("fsdp", "reduce-scatter", True)])
def test_accumulating_k_micro_batches_is_one_step_on_the_k_times_larger_batch(devices, stage, grad_op,
                                                                              per_micro_batch):
    """ZeRO-1 keeps a whole accumulator and reduce-scatters once after the loop; ZeRO-2 and FSDP reduce-scatter
    every micro-batch inside the loop and keep only their slice."""
    data = batches(3, size=128)
    _, one_big, _ = train(stage, data=data)
    state_k, accumulated, step = train(stage, data=data, accumulate=4)
    np.testing.assert_allclose(accumulated, one_big, rtol=RTOL)
    sent = [c for c in ss.collectives(step.lower(state_k, data[0]).as_text(dialect="hlo")) if c.shape]
    assert [(c.op, c.in_loop) for c in sent if c.op == grad_op] == [(grad_op, per_micro_batch)], sent
    assert "all-reduce" not in {c.op for c in sent if c.shape} or stage == "replicated", sent


def test_a_collective_inside_a_scan_is_counted_as_in_loop(devices):
    mesh = ss.data_mesh()

    def per_micro_batch(x):            # the mistake: one all-reduce per micro-batch, inside the loop
        return jax.lax.scan(lambda acc, m: (acc + jax.lax.psum(m, "data"), None), jnp.zeros(3), x)[0]

    f = jax.jit(jax.shard_map(per_micro_batch, mesh=mesh, in_specs=P("data"), out_specs=P(), check_vma=False))
    x = jnp.ones((N * 4, 3))
    for text in (f.lower(x).as_text(dialect="hlo"), f.lower(x).compile().as_text()):
        found = ss.communication(text)
        assert found["all-reduce"]["count"] == 1 and found["all-reduce"]["in_loop"] == 1, found


def test_accumulation_uses_less_temporary_memory(devices):
    data = batches(1, size=1024)
    s1, _, step1 = train("replicated", data=data)
    s8, _, step8 = train("replicated", data=data, accumulate=8)
    assert ss.compiled_memory(step8, s8, data[0])["temporaries"] < ss.compiled_memory(step1, s1, data[0])["temporaries"]


def test_bfloat16_compute_stays_close_and_keeps_float32_master_weights(devices):
    data = batches(4)
    _, f32, _ = train("fsdp", data=data)
    state, bf16, step = train("fsdp", data=data, compute_dtype=jnp.bfloat16)
    assert state.params.dtype == jnp.float32
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(state.opt_state) if leaf.ndim)
    np.testing.assert_allclose(bf16, f32, rtol=2e-2)
    assert bf16 != f32, "bfloat16 compute must change the numbers a little"
    sent = ss.collectives(step.lower(state, data[0]).as_text(dialect="hlo"))
    assert {c.dtype for c in sent if c.op in ("all-gather", "reduce-scatter")} == {"bf16"}


def test_sharded_stages_hold_at_most_one_nth_of_the_optimizer_state(devices):
    slack = 64     # bytes: Adam's step count, replicated on every device, and the padding to a multiple of 8
    replicated = ss.state_bytes(ss.init_state(mlp(), optax.adam(0.1), stage="replicated"))
    for stage in ("zero1", "zero2", "fsdp"):
        got = ss.state_bytes(ss.init_state(mlp(), optax.adam(0.1), stage=stage))
        assert got["opt_state"] <= replicated["opt_state"] / N + slack, (stage, got, replicated)
        expected_params = replicated["params"] / N + slack if stage == "fsdp" else replicated["params"]
        assert got["params"] <= expected_params and got["params"] > 0
    assert replicated["params"] == 440 * 4 and replicated["opt_state"] == 2 * 440 * 4 + 4   # padded 437 -> 440


def test_live_bytes_sum_the_shards_each_device_holds(devices):
    state = ss.init_state(mlp(), optax.adam(0.1), stage="fsdp")
    per_device = ss.live_bytes(state.params)
    assert sorted(per_device) == [d.id for d in devices]
    assert set(per_device.values()) == {440 // N * 4}


def test_formula_divides_what_each_stage_shards():
    f = {s: ss.formula_bytes(1_000_000_000, 8, s) for s in ss.STAGES}
    assert f["replicated"] == {"params": 4e9, "grads": 4e9, "opt_state": 8e9, "total": 16e9}
    assert f["zero1"]["opt_state"] == 1e9 and f["zero1"]["grads"] == 4e9
    assert f["zero2"]["grads"] == 0.5e9 and f["zero2"]["params"] == 4e9
    assert f["fsdp"]["total"] == 2e9


def test_hlo_counts_reduce_scatter_and_all_gather(devices):
    """ZeRO-1 and ZeRO-2: one reduce-scatter and one all-gather, no all-reduce of the gradients (DP's traffic);
    FSDP: the backward pass gathers the parameters again (3 collectives' worth, 1.5x DP)."""
    data = batches(1)
    gathers = {"replicated": 0, "zero1": 1, "zero2": 1, "fsdp": 2}
    for stage in ss.STAGES:
        state, _, step = train(stage, data=data)
        hlo = step.lower(state, data[0]).compile().as_text()
        found = ss.communication(hlo)
        big = [c for c in ss.collectives(hlo) if c.shape]
        if stage == "replicated":
            assert [c.op for c in big] == ["all-reduce"], big
        else:
            assert "all-reduce" not in {c.op for c in big}, (stage, big)
            assert found["reduce-scatter"]["count"] == 1 and found["reduce-scatter"]["payload"] == 440 * 4
            assert found["all-gather"]["count"] == gathers[stage]
            assert found["all-gather"]["payload"] == gathers[stage] * 440 * 4
        sent = sum(c.sent_per_device for c in big)
        assert sent == pytest.approx(ss.formula_sent(440, N, stage), abs=8), stage      # + the loss, 4 bytes


def test_zero1_and_zero2_compile_to_the_same_step_and_differ_with_accumulation(devices):
    data = batches(1, size=256)
    programs, memory = {}, {}
    for stage in ("zero1", "zero2"):
        for k in (1, 4):
            state, _, step = train(stage, data=data, accumulate=k)
            programs[stage, k] = [(c.op, c.shape, c.in_loop) for c in ss.collectives(step.compile(state, data[0]).as_text())]
            memory[stage, k] = ss.compiled_memory(step, state, data[0])
    assert programs["zero1", 1] == programs["zero2", 1]
    assert memory["zero1", 1]["temporaries"] == pytest.approx(memory["zero2", 1]["temporaries"], rel=0.02)
    assert programs["zero1", 4] != programs["zero2", 4]


def test_with_accumulation_zero2_and_fsdp_send_k_times_the_gradient_and_zero1_sends_what_dp_sends(devices):
    """formula_sent's docstring: with accumulate=K, ZeRO-2 and FSDP reduce-scatter every micro-batch (FSDP also
    gathers for every micro-batch's backward pass), while replicated and ZeRO-1 communicate once."""
    k, data = 4, batches(1, size=256)
    sent = {}
    for stage in ss.STAGES:
        state, _, step = train(stage, data=data, accumulate=k)
        found = [c for c in ss.collectives(step.compile(state, data[0]).as_text()) if c.shape]
        sent[stage] = sum(c.sent_per_device * (k if c.in_loop else 1) for c in found)
        if stage == "fsdp":
            gathers = [c.in_loop for c in found if c.op == "all-gather"]
            assert sum(k if looped else 1 for looped in gathers) in (k + 1, 2 * k), found
    padded = 440
    f = (N - 1) / N
    assert sent["replicated"] == pytest.approx(ss.formula_sent(padded, N, "replicated"), abs=8)   # + the loss
    assert sent["zero1"] == pytest.approx(ss.formula_sent(padded, N, "zero1"))
    assert sent["zero2"] == pytest.approx(f * padded * 4 * (k + 1))            # K reduce-scatters, one all-gather
    assert sent["fsdp"] > sent["zero2"]


def test_every_step_donates_its_state_and_runs_under_the_vma_checker(devices):
    data = batches(1)
    opt = optax.adam(0.05)
    for stage in ss.STAGES:
        state = ss.init_state(mlp(), opt, stage=stage)
        step = ss.make_train_step(loss_fn, opt, stage=stage)
        memory = ss.compiled_memory(step, state, data[0])
        assert memory["aliased"] >= sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(state)) - 8
        assert memory["peak"] == (memory["arguments"] + memory["outputs"] - memory["aliased"]
                                  + memory["temporaries"])
        jaxpr = step.trace(state, data[0]).jaxpr
        maps = [e for e in jaxpr.eqns if e.primitive.name == "shard_map"]
        assert maps and all(e.params["check_vma"] for e in maps), stage
        new, _ = step(state, data[0])
        assert state.params.is_deleted(), f"{stage}: the old state's buffers were not donated"
        assert not new.params.is_deleted()


def test_collectives_report_every_operand_of_a_tuple_all_reduce(devices):
    state, _, step = train("replicated", data=batches(1))
    found = [c for c in ss.collectives(step.compile(state, batches(1)[0]).as_text()) if c.op == "all-reduce"]
    assert len(found) == 1 and sorted(found[0].operands) == [("f32", ()), ("f32", (440,))], found
    assert "f32[440]" in found[0].described and "f32[]" in found[0].described


@pytest.mark.parametrize("stage", ss.STAGES)
def test_a_step_for_another_optimizer_is_refused_before_it_runs(devices, stage):
    state = ss.init_state(mlp(), optax.adam(0.1), stage=stage)
    step = ss.make_train_step(loss_fn, optax.sgd(0.1), stage=stage)
    with pytest.raises(ValueError, match=r"ScaleByAdamState.*EmptyState.*another optimizer.*same optimizer"):
        step(state, batches(1)[0])
    assert not state.params.is_deleted() and int(state.step) == 0
    step = ss.make_train_step(loss_fn, optax.adam(0.5), stage=stage)     # same optimizer, other rate: fine
    new, _ = step(state, batches(1)[0])
    assert int(new.step) == 1


def test_an_empty_batch_is_refused_and_the_step_does_not_advance(devices):
    opt = optax.adam(0.1)
    state = ss.init_state(mlp(), opt, stage="zero2")
    step = ss.make_train_step(loss_fn, opt, stage="zero2")
    empty = {"x": np.zeros((0, 12), np.float32), "y": np.zeros((0,), np.int32)}
    with pytest.raises(ValueError, match=r"batch leaf \['x'\] has shape \(0, 12\): an empty batch"):
        step(state, empty)
    assert int(state.step) == 0 and not state.params.is_deleted()


@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.float64])
def test_a_compute_dtype_the_step_cannot_run_is_refused_up_front(dtype):
    with pytest.raises(ValueError, match=r"compute_dtype must be one of float32, bfloat16, float16, got"):
        ss.make_train_step(loss_fn, optax.adam(0.1), compute_dtype=dtype)


def test_formula_sent_ratios():
    dp = ss.formula_sent(1000, 8, "replicated")
    assert dp == pytest.approx(2 * 7 / 8 * 4000)
    assert ss.formula_sent(1000, 8, "zero1") == ss.formula_sent(1000, 8, "zero2") == pytest.approx(dp)
    assert ss.formula_sent(1000, 8, "fsdp") == pytest.approx(1.5 * dp)


def test_collectives_parse_each_form_of_replica_groups():
    text = "\n".join([
        "  %a = f32[16]{0} all-reduce(%x), replica_groups=[1,8]<=[8], to_apply=%add",
        "  %b = bf16[4]{0} reduce-scatter(%y), replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}",
        "  %c = (f32[8]{0}, f32[]) all-reduce(%p, %q), replica_groups=mesh['data'=8] {'data'}, to_apply=%add",
        "  %d = f32[32]{0} all-gather(%z), replica_groups=mesh['data'=2,'model'=4] {'model'}, dimensions={0}",
    ])
    found = ss.collectives(text)
    assert [(c.op, c.dtype, c.group, c.payload) for c in found] == [
        ("all-reduce", "f32", 8, 64), ("reduce-scatter", "bf16", 4, 32), ("all-reduce", "f32", 8, 36),
        ("all-gather", "f32", 4, 128)]
    assert found[0].sent_per_device == 2 * 7 / 8 * 64


@pytest.mark.parametrize("call, message", [
    (lambda: ss.init_state(mlp(), optax.adam(0.1), stage="zero4"), r"stage must be one of .*got 'zero4'"),
    (lambda: ss.make_train_step(loss_fn, optax.adam(0.1), stage="ZeRO-2"), r"got 'ZeRO-2'"),
    (lambda: ss.make_train_step(loss_fn, optax.adam(0.1), accumulate=0), r"accumulate must be .* got 0"),
    (lambda: ss.make_train_step(loss_fn, optax.adam(0.1), compute_dtype=jnp.int32), r"compute_dtype must be"),
    (lambda: ss.formula_bytes(10, 0, "fsdp"), r"n_devices must be"),
    (lambda: ss.init_state({"n": jnp.arange(3)}, optax.adam(0.1)), r"float arrays"),
])
def test_bad_settings_are_named(devices, call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_batch_that_does_not_divide_is_named_with_the_fix(devices):
    opt = optax.adam(0.1)
    state = ss.init_state(mlp(), opt, stage="zero2")
    step = ss.make_train_step(loss_fn, opt, stage="zero2", accumulate=4)
    with pytest.raises(ValueError, match=r"\['x'\] has shape \(60, 12\).*multiple of 32.*global batch of 32"):
        step(state, batches(1, size=60)[0])


def test_a_state_of_another_stage_is_refused_with_the_fix(devices):
    opt = optax.adam(0.1)
    state = ss.init_state(mlp(), opt, stage="zero1")
    step = ss.make_train_step(loss_fn, opt, stage="fsdp")
    with pytest.raises(ValueError, match=r"made for stage 'zero1' but this step is for 'fsdp'.*stage='fsdp'"):
        step(state, batches(1)[0])
    with pytest.raises(TypeError, match="must be a ShardedState"):
        step({"params": 1}, batches(1)[0])


def test_dataflow_is_drawn_from_the_state_and_the_compiled_step(devices):
    state, _, step = train("zero2", data=batches(1))
    d = ss.dataflow(step, state, batches(1)[0])
    assert [c.op for c in d.collectives] == ["reduce-scatter", "all-gather"]
    assert "params [440]" in d.source and "its own gradients [440]" in d.source and "optimizer [55]" in d.source and "f32[55]" in d.source
    assert "437 parameters, padded to 440 = 8 x 55" in d.source


def test_states_of_the_same_model_and_stage_share_one_compiled_step(devices):
    opt = optax.adam(0.1)
    step = ss.make_train_step(loss_fn, opt, stage="fsdp")
    first, second = (ss.init_state(mlp(), opt, stage="fsdp") for _ in range(2))
    b = batches(1)[0]
    assert step.compile(first, b) is step.compile(second, b)
    assert step.compile(first, b) is not step.compile(first, batches(1, size=128)[0])


def test_bench_variants_keep_at_most_fits_max_ahead_steps_in_flight(devices, monkeypatch):
    """30 steps with fit's bound of 20: it waits for the 10 oldest, as fit would (JAX 0.11 deadlocked on 100 queued
    steps of 8 simulated devices), and trains the same as one step at a time."""
    host = [jax.tree.map(lambda a: a.reshape((N, -1) + a.shape[1:]), b) for b in batches(30, size=64)]
    assert set(ss.bench_variants(mlp(), lambda p, b, key: loss_fn(p, b), optax.adam(0.05), host[:1])) == {
        "fsdp", "accumulate", "replicated"}
    start, run = ss.bench_variants(mlp(), lambda p, b, key: loss_fn(p, b), optax.adam(0.05), host)["fsdp"]
    state = start()
    waited = []
    wait = jax.block_until_ready
    monkeypatch.setattr(jax, "block_until_ready", lambda x: waited.append(x) or wait(x))
    loss = run(state)
    assert len(waited) == 30 - 20
    _, losses, _ = train("fsdp", data=batches(30, size=64))
    assert loss == pytest.approx(losses[-1], rel=RTOL)


# ---- GPU-format programs: the async, combined collectives of XLA's GPU compiler (measured.md section 3) ----------

_MESH8 = "replica_groups=mesh['axis_0'=8] {'axis_0'}"
_SLICES = "(f32[8]{0}, f32[8]{0}, f32[8,192]{1,0}, f32[8,64]{1,0}, f32[32,64]{1,0}, f32[8,256]{1,0})"
_WHOLES = "(f32[64]{0}, f32[64]{0}, f32[64,192]{1,0}, f32[64,64]{1,0}, f32[256,64]{1,0}, f32[64,256]{1,0})"
_LAYER = 64 + 64 + 64 * 192 + 64 * 64 + 256 * 64 + 64 * 256          # 49,280 numbers: one layer's 6 arrays


def _gpu_fsdp_program():
    """An FSDP step as XLA's GPU compiler writes it (the line formats of measured.md section 3): three combined
    all-gathers of a layer's 6 arrays, two combined reduce-scatters, one async all-reduce of 2,497 floats."""
    ag = [f"  %all-gather-start.{i} = ({_SLICES}, {_WHOLES}) all-gather-start(%s0, %s1, %s2, %s3, %s4, %s5), "
          f"channel_id={i}, {_MESH8}, dimensions={{0}}, use_global_device_ids=true\n"
          f"  %all-gather-done.{i} = {_WHOLES} all-gather-done(%all-gather-start.{i})" for i in range(3)]
    rs = [f"  %reduce-scatter-start.{i} = ({_WHOLES}, {_SLICES}) reduce-scatter-start(%g0, %g1, %g2, %g3, %g4, %g5), "
          f"channel_id={10 + i}, {_MESH8}, dimensions={{0}}, to_apply=%add\n"
          f"  %reduce-scatter-done.{i} = {_SLICES} reduce-scatter-done(%reduce-scatter-start.{i})" for i in range(2)]
    ar = ("  %all-reduce-start = ((f32[2497]{0}), f32[2497]{0}) all-reduce-start(%l), channel_id=20, "
          f"{_MESH8}, to_apply=%add\n  %all-reduce-done = f32[2497]{{0}} all-reduce-done(%all-reduce-start)")
    return "\n".join(["HloModule jit_fsdp_step, is_scheduled=true", "",
                      "%add (x: f32[], y: f32[]) -> f32[] {", "  %x = f32[] parameter(0)", "  %y = f32[] parameter(1)",
                      "  ROOT %add.1 = f32[] add(%x, %y)", "}", "", "ENTRY %main (p: f32[8]) -> f32[8] {",
                      *ag, *rs, ar, "  ROOT %r = f32[8]{0} copy(%p)", "}"])


def test_a_combined_async_collective_counts_every_array_of_its_result_half():
    found = ss.collectives(_gpu_fsdp_program(), n_devices=8)
    assert [c.op for c in found] == ["all-gather"] * 3 + ["reduce-scatter"] * 2 + ["all-reduce"]   # -done not again
    gather, scatter, loss = found[0], found[3], found[5]
    assert [s for _, s in gather.operands] == [(64,), (64,), (64, 192), (64, 64), (256, 64), (64, 256)]
    assert gather.payload == 4 * _LAYER == 197_120                          # the results, not the operands too
    assert [s for _, s in scatter.operands] == [(8,), (8,), (8, 192), (8, 64), (32, 64), (8, 256)]
    assert scatter.payload == 8 * 4 * _LAYER // 8 == 197_120                # 8 slices of 24,640 bytes
    assert loss.operands == (("f32", (2497,)),) and loss.payload == 9_988
    assert sum(c.payload for c in found) == 995_588                         # measured.md section 3's step
    comm = ss.communication(_gpu_fsdp_program(), n_devices=8)
    assert {op: e["count"] for op, e in comm.items()} == {"all-gather": 3, "reduce-scatter": 2, "all-reduce": 1}
    assert comm["all-gather"]["sent_per_device"] == pytest.approx(3 * 7 / 8 * 197_120)


@pytest.mark.parametrize("line, op, arrays, payload", [
    # measured.md section 3, exactly: the all-reduce and slice became a reduce-scatter on the GPU
    ("%reduce-scatter-start = ((f32[1024,1024]{1,0}), f32[128,1024]{1,0}) reduce-scatter-start("
     f"%gemm_fusion_dot.2), channel_id=3, {_MESH8}, dimensions={{0}}, to_apply=%add",
     "reduce-scatter", [(128, 1024)], 8 * 4 * 128 * 1024),
    ("%all-reduce-start = ((f32[19211]{0}), f32[19211]{0}) all-reduce-start(%concatenate), channel_id=1, "
     f"{_MESH8}, to_apply=%add", "all-reduce", [(19211,)], 4 * 19211),
    ("%all-reduce-start.3 = ((bf16[4214794]{0}), bf16[4214794]{0}) all-reduce-start(%c), channel_id=2, "
     f"{_MESH8}, to_apply=%add", "all-reduce", [(4214794,)], 2 * 4214794),            # bf16 on the wire
    ("%all-reduce-start.4 = ((f32[256]{0}, f32[64,256]{1,0}), (f32[256]{0}, f32[64,256]{1,0})) all-reduce-start("
     f"%a, %b), {_MESH8}, to_apply=%add", "all-reduce", [(256,), (64, 256)], 4 * (256 + 64 * 256)),
    ("%all-reduce-start.5 = f32[16]{0} all-reduce-start(%a), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add",
     "all-reduce", [(16,)], 64),                                                    # the type is the result
    ("%all-gather-start.1 = (f32[8]{0}, f32[64]{0}) all-gather-start(%a), replica_groups=[1,8]<=[8], "
     "dimensions={0}", "all-gather", [(64,)], 256),                                 # (operand, result)
    ("%collective-permute-start = (f32[16]{0}, f32[16]{0}, u32[], u32[]) collective-permute-start(%a), "
     "source_target_pairs={{0,1},{1,0}}", "collective-permute", [(16,)], 64),       # context scalars left out
])
def test_each_async_start_form_counts_its_result_once(line, op, arrays, payload):
    text = f"HloModule m\n\nENTRY %main {{\n  {line}\n  %done = f32[1]{{0}} {op}-done(%x)\n}}"
    found = ss.collectives(text, n_devices=8)
    assert len(found) == 1 and found[0].op == op
    assert [s for _, s in found[0].operands] == arrays and found[0].payload == payload


def test_an_async_start_wrapping_a_collective_counts_once_and_in_its_loop():
    text = "\n".join([
        "HloModule m, is_scheduled=true", "",
        "%wrapped (p: f32[64]) -> f32[64] {", "  %p = f32[64]{0} parameter(0)",
        "  ROOT %ar = f32[64]{0} all-reduce(%p), replica_groups={}, to_apply=%add", "}", "",
        "%body (c: f32[64]) -> f32[64] {", "  %c = f32[64]{0} parameter(0)",
        f"  %ags = ((f32[8]{{0}}), f32[64]{{0}}) all-gather-start(%c), {_MESH8}, dimensions={{0}}",
        "  %agd = f32[64]{0} all-gather-done(%ags)",
        "  %as = ((f32[64]{0}), f32[64]{0}) async-start(%agd), calls=%wrapped",
        "  ROOT %ad = f32[64]{0} async-done(%as)", "}", "",
        "ENTRY %main (x: f32[64]) -> f32[64] {", "  %x = f32[64]{0} parameter(0)",
        "  ROOT %w = f32[64]{0} while(%x), condition=%cond, body=%body", "}"])
    found = ss.collectives(text, n_devices=8)
    assert [(c.op, c.payload, c.in_loop) for c in found] == [("all-reduce", 256, True), ("all-gather", 256, True)]


def test_the_readers_say_why_they_find_nothing():
    one_device = jax.jit(lambda v: v * 2).lower(jnp.ones(4)).compile().as_text()
    assert ss.collectives(one_device) == [] and ss.communication(one_device) == {}   # documented: no collective
    with pytest.raises(ValueError, match="does not look like an HLO program"):
        ss.collectives("step time 3.2 ms")
    with pytest.raises(ValueError, match="StableHLO"):
        ss.communication(jax.jit(lambda v: v * 2).lower(jnp.ones(4)).as_text())
    with pytest.raises(TypeError, match="hlo_text must be"):
        ss.collectives(jax.jit(lambda v: v * 2).lower(jnp.ones(4)).compile())


_ONE = "HloModule m\n\nENTRY %main (p: f32[8]) -> f32[8] {\n  %p = f32[8]{0} parameter(0)\n  {}\n}\n"


@pytest.mark.parametrize("line, op, payload", [
    ("%x = c64[8]{0} all-reduce(%p), replica_groups={}, to_apply=%add", "all-reduce", 64),
    ("%x = c128[2]{0} all-reduce(%p), replica_groups={}, to_apply=%add", "all-reduce", 32),
    ("%x = s4[8]{0} all-gather(%p), replica_groups={}, dimensions={0}", "all-gather", 4),
    ("%x = u4[3]{0} all-gather(%p), replica_groups={}, dimensions={0}", "all-gather", 2),     # 12 bits: 2 bytes
    ("%x = f8e4m3fn[16]{0} all-gather(%p), replica_groups={}, dimensions={0}", "all-gather", 16),
    ("%x = f8e5m2[16]{0} all-to-all(%p), replica_groups={}, dimensions={0}", "all-to-all", 16),
    ("%x = pred[8]{0} all-reduce(%p), replica_groups={}, to_apply=%or", "all-reduce", 8),
    ("%x = (bf16[4]{0}, s8[4]{0}) all-reduce(%p, %q), replica_groups={}, to_apply=%add", "all-reduce", 12),
    ("%x = f32[<=8]{0} all-reduce(%p), replica_groups={}, to_apply=%add", "all-reduce", 32),  # at its bound
    ("%x = f32[8,128]{1,0:T(8,128)} all-reduce(%p), replica_groups={}, to_apply=%add", "all-reduce", 4096),
    ("%x = f32[8]{0} ragged-all-to-all(%p, %o, %i, %s, %j, %k), replica_groups={}", "ragged-all-to-all", 32),
])
def test_collectives_count_the_bytes_of_every_element_type(line, op, payload):
    found = ss.collectives(_ONE.replace("{}", line, 1), n_devices=8)
    assert [(c.op, c.payload) for c in found] == [(op, payload)]


@pytest.mark.parametrize("line, named", [
    ("%x = garbage all-reduce(%p), replica_groups={}, to_apply=%add", "'garbage'"),
    ("%x = q9[8]{0} all-reduce(%p), replica_groups={}, to_apply=%add", "'q9'"),
    ("%x = f32[?]{0} all-gather(%p), replica_groups={}, dimensions={0}", "f32[?]"),
    ("all-reduce(%p), replica_groups={}", "all-reduce(%p)"),
])
def test_an_unreadable_collective_raises_naming_its_line(line, named):
    with pytest.raises(ValueError, match="cannot read") as e:
        ss.collectives(_ONE.replace("{}", line, 1), n_devices=8)
    assert named in str(e.value) and line[:20] in str(e.value)


def test_a_collective_named_in_metadata_is_not_counted():
    fusion = ('%f = f32[8]{0} fusion(%p), kind=kLoop, calls=%fc, '
              'metadata={op_name="jit(f)/ all-reduce(x)" source_file="a all-gather(b).py"}')
    assert ss.collectives(_ONE.replace("{}", fusion, 1), n_devices=8) == []
    done = "%d = f32[8]{0} all-reduce-done(%all-reduce-start)"
    assert ss.collectives(_ONE.replace("{}", done, 1), n_devices=8) == []
