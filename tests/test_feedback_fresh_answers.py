"""Answers from the hidden testers' sets (seventh to sixteenth): each once passed falsely, was refused, or was told a
cause it did not make."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from course_lib.exercises import check
from course_lib.exercises.lesson05 import solution_dp_step
from course_lib.exercises.lesson10 import solution_zero2_sgd


def test_a_lesson04_answer_that_writes_the_axis_name_i_fails_and_is_told_to_use_its_argument():
    def rotate_right(x, axis_name):
        n = jax.lax.axis_size("i")
        return jax.lax.ppermute(x, "i", [(j, (j + 1) % n) for j in range(n)])

    fb = check("04.3", rotate_right)
    assert not fb and "axis_name 'batch'" in fb.message and "Use the axis_name argument" in fb.message


def test_a_traced_value_used_as_a_number_is_not_blamed_on_axis_index_alone():
    fb = check("04.1", lambda x, axis_name: float(x))
    assert not fb and "x, what is computed from it, and jax.lax.axis_index" in fb.message


def test_05_1_an_answer_that_ignores_loss_fn_is_named_and_a_factor_is_the_updates():
    def own_mse(loss_fn, optimizer, params, opt_state, batch):
        mse = lambda p, b: jnp.mean((b["x"] @ p["w"] + p["b"] - b["y"]) ** 2)  # noqa: E731
        return solution_dp_step(mse, optimizer, params, opt_state, batch)

    fb = check("05.1", own_mse)
    assert not fb and "Huber loss" in fb.message and "ignored its loss_fn argument" in fb.message

    fb = check("05.1", lambda lf, *args: solution_dp_step(lambda p, b: 2 * lf(p, b), *args))
    assert not fb and "the update of params" in fb.message and "2x too large" in fb.message    # SGD, 8 devices
    fb = check("05.1", lambda lf, opt, p, s, b: (None,) + solution_dp_step(lf, opt, p, s, b)[1:])
    assert not fb and "new_params is None, where dict" in fb.message


@pytest.mark.parametrize("id, fn", [
    ("01.3", lambda x: jax.pmap(lambda r: jnp.linalg.norm(r), devices=jax.devices()[:x.shape[0]][::-1])(x)),
    ("02.2", lambda xs: jax.pmap(lambda b: jnp.sum(b ** 2), devices=jax.devices()[:xs.shape[0]][::-1])(xs)),
    ("03.3", lambda xs: jax.pmap(lambda r: 2 * r, out_axes=1, devices=jax.devices()[:xs.shape[0]][::-1])(xs)),
])
def test_pmap_on_the_devices_reversed_is_refused_where_block_k_belongs_on_device_k(id, fn):
    fb = check(id, fn)
    assert not fb and "expected block k on the k-th of the devices [0, 1" in fb.message


def test_00_2_ids_in_a_jax_array_pass_and_a_none_among_them_is_shown():
    assert check("00.2", lambda a: jnp.array(sorted(d.id for d in a.devices())))
    fb = check("00.2", lambda a: sorted(d.id for d in a.devices())[:1] + [None])
    assert not fb and "returned [3, None]; expected a list of ints" in fb.message


def test_01_1_columns_split_is_named_without_the_device_count():
    fb = check("01.1", lambda x, ds: [jax.device_put(p, d) for p, d in zip(np.array_split(x, len(ds), axis=1), ds)])
    assert not fb and "split along axis 1" in fb.message and "device count" not in fb.message


@pytest.mark.parametrize("k, name", [(0, "params"), (1, "batch")])
def test_06_1_a_pair_with_one_none_names_it(k, name):
    def place(params, batch, mesh):
        out = [jax.device_put(params, jax.NamedSharding(mesh, jax.P())),
               jax.device_put(batch, jax.NamedSharding(mesh, jax.P("i")))]
        out[k] = None
        return tuple(out)

    fb = check("06.1", place)
    assert not fb and f"{name} is None, where dict" in fb.message


def test_08_2_a_bad_position_is_not_explained_as_a_device_id():
    def by_position(batch, devices, process_index):
        return batch[:, [i for i, d in enumerate(devices) if d.process_index == process_index]]

    fb = check("08.2", by_position)
    assert not fb and "out of bounds for axis 1" in fb.message and "label, not its position" not in fb.message
    fb = check("08.2", lambda batch, devices, p: np.stack([batch[d.id] for d in devices if d.process_index == p]))
    assert not fb and "label, not its position" in fb.message


def test_10_2_a_fixed_lr_is_not_put_down_to_the_device_count():
    fb = check("10.2", lambda params, grads, lr: solution_zero2_sgd(params, grads, 0.1))
    assert not fb and "lr 0.5" in fb.message and "right only on" not in fb.message


def test_check_names_swapped_arguments_and_reads_a_short_id():
    with pytest.raises(KeyError, match="a function: the exercise id comes first"):
        check(lambda x: x, "00.1")
    assert check(" 7.1", None).exercise == "07.1"


def test_08_3_a_process_count_read_from_the_mesh_passes_in_a_one_process_job_on_that_mesh():
    def global_batch(local_rows, mesh):
        processes = mesh.size // jax.local_device_count()      # the mesh spans every device of the job
        sharding = jax.NamedSharding(mesh, jax.P("data"))
        shape = (local_rows.shape[0] * processes, *local_rows.shape[1:])
        return jax.make_array_from_process_local_data(sharding, local_rows, shape)

    assert check("08.3", global_batch)


def test_08_2_rows_as_a_tuple_pass_as_a_list_does():
    assert check("08.2", lambda batch, devices, p: tuple(batch[i] for i, d in enumerate(devices)
                                                         if d.process_index == p))


def test_11_3_an_answer_that_lands_on_the_last_step_is_not_told_how_it_chose():
    def after_the_largest_gap(trace):
        ms = sorted(trace.markers, key=lambda m: m.start_us)
        return max((b.start_us - a.start_us - a.dur_us, b.step) for a, b in zip(ms, ms[1:]))[1]

    fb = check("11.3", after_the_largest_gap)
    assert not fb and "whatever the durations" not in fb.message


def test_an_answer_that_never_returns_is_stopped_with_a_verdict(monkeypatch):
    import signal
    import time

    from course_lib import exercises

    def never(*args):
        try:
            while True:
                time.sleep(0.05)
        except Exception:       # a learner's catch-all does not swallow the stop
            return args[0]

    monkeypatch.setattr(exercises, "LIMIT_S", 1)
    paused = signal.setitimer(signal.ITIMER_REAL, 0)     # pytest-timeout's own alarm, if any: a limit is not nested
    try:
        fb = check("09.1", never)
    finally:
        signal.setitimer(signal.ITIMER_REAL, *paused)
    assert not fb and "checking never took over 1 s and was stopped" in fb.message and "never return" in fb.message
    assert fb.message.count("took over") == 1


def test_02_2_sums_computed_before_an_identity_pmap_are_refused():
    fb = check("02.2", lambda xs: jax.pmap(lambda t: t)(jnp.sum(jnp.asarray(xs) ** 2, axis=(1, 2))))
    assert not fb and "no sum of squares runs inside its pmap" in fb.message


def test_05_2_a_loop_over_a_flat_dict_fails_on_the_nested_tree():
    def flat(replicated):
        copies = [[np.asarray(s.data) for s in leaf.addressable_shards] for leaf in replicated.values()]
        return max(float(np.max(np.abs(c - cs[0]))) for cs in copies for c in cs)

    fb = check("05.2", flat)
    assert not fb and "in a nested tree on 2 devices" in fb.message


def test_07_1_two_shard_maps_are_refused():
    def two(x, w, mesh):
        h = jax.shard_map(lambda a, b: jnp.tanh(a @ b), mesh=mesh, in_specs=(jax.P("i"), jax.P()),
                          out_specs=jax.P("i"))(x, w)
        return h, jax.shard_map(lambda a: jax.lax.psum(a.sum(0), "i"), mesh=mesh, in_specs=jax.P("i"),
                                out_specs=jax.P())(h)

    fb = check("07.1", two)
    assert not fb and "runs 2 shard_map(s)" in fb.message


def test_05_1_another_optimizers_update_on_the_given_state_is_explained():
    fb = check("05.1", lambda lf, opt, p, s, b: solution_dp_step(lf, optax.adam(0.1), p, s, b))
    assert not fb and "an update of another optimizer cannot read it" in fb.message


def _all_gather_port(check_vma):
    """07.1's port with the total summed from an all_gather inside the shard_map."""
    def ported(x, w, mesh):
        def per_device(xb, wb):
            h = jnp.tanh(xb @ wb)
            return h, jax.lax.all_gather(h.sum(0), "i").sum(0)
        return jax.shard_map(per_device, mesh=mesh, in_specs=(jax.P("i"), jax.P()),
                             out_specs=(jax.P("i"), jax.P()), check_vma=check_vma)(x, w)
    return ported


def test_07_1_a_total_summed_from_an_all_gather_inside_the_shard_map_passes():
    ported = _all_gather_port(check_vma=False)

    assert check("07.1", ported)


# ---- lessons 07-09 (tester12: P2, P5, P6, P6b, P10, P11, P11b)

def _sharded_step(variant):
    def make(loss_fn, optimizer, mesh):
        def body(params, opt_state, x, y):
            local = jax.tree.map(lambda p: jax.lax.pcast(p, "i", to="varying"), params)
            loss, g = jax.value_and_grad(loss_fn)(local, x, y)
            g = jax.tree.map(lambda a: a / 8, jax.lax.psum(g, "i")) if variant == "/ 8" else jax.tree.map(
                lambda a: jax.lax.all_gather(a, "i", to="invarying").mean(0), g) if variant == "gather" else (
                jax.lax.pmean(g, "i"))
            u, s = optimizer.update(g, optimizer.init(params) if variant == "init" else opt_state, params)
            new = optax.apply_updates(params, u)
            new = jax.tree.map(lambda a: a.astype(jnp.bfloat16), new) if variant == "bfloat16" else new
            return new, None if variant == "None" else s, jax.lax.pmean(loss, "i")
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(jax.P(), jax.P(), jax.P("i"), jax.P("i")),
                                     out_specs=(jax.P(), jax.P(), jax.P())), donate_argnums=(0, 1))
    return make


@pytest.mark.parametrize("variant, said", [
    ("init", "fresh optimizer.init state"),       # jit drops the donation of the unread opt_state: not the cause
    ("None", "step 1's opt_state is None, where"),
    ("bfloat16", "dtype bfloat16 where float32 was expected"),
    ("/ 8", "4x too small"),        # shown on the momentum case, where Adam does not hide it
])
def test_07_2_values_are_said_before_donation_with_what_they_show(variant, said):
    fb = check("07.2", _sharded_step(variant))
    assert not fb and said in fb.message and "donate" not in fb.message, fb.message


def test_08_3_rows_rounded_or_sorted_fail():
    from course_lib.exercises.lesson08 import solution_global_batch as right
    for change in (lambda r: np.round(r, 2), lambda r: np.sort(r, axis=0)):
        assert not check("08.3", lambda rows, mesh: right(change(rows), mesh))


from jax import make_array_from_process_local_data as _from_rows  # noqa: E402


def test_08_3_a_name_in_a_branch_that_does_not_run_is_said_as_read_not_as_used():
    def global_batch(rows, mesh, fallback=False):
        split, shape = jax.NamedSharding(mesh, jax.P("data")), (rows.shape[0] * jax.process_count(), *rows.shape[1:])
        if fallback:
            return _from_rows(split, rows, shape)
        return jax.make_array_from_process_local_data(split, rows, shape)

    fb = check("08.3", global_batch)
    assert not fb and "refers to make_array_from_process_local_data (as _from_rows)" in fb.message
    assert "not which branch runs" in fb.message


def test_09_2_ks_written_in_fail():
    fb = check("09.2", lambda ks, ms: tuple(np.polyfit(1 / np.array([1, 2, 5, 10, 25.0]), ms, 1)))
    assert not fb and "ks=[3, 1, 8, 4]" in fb.message


# ---- lessons 00-06 (tester11, fixL): the devices or mesh given are used; JAX's errors explained; what differs said


def test_01_1_jax_devices_used_when_eight_are_given_fails():
    fb = check("01.1", lambda x, ds: [jax.device_put(p, d) for p, d in zip(
        np.split(np.asarray(x), len(ds)), jax.devices() if len(ds) == 8 else ds)])
    assert not fb and "devices with ids [5, 2, 6, 1, 3, 4, 0, 7]" in fb.message


def test_03_4_an_own_mesh_when_the_batch_divides_by_8_fails():
    def own(x, w, mesh):
        m = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Explicit,)) if x.shape[0] % 8 == 0 else mesh
        with jax.set_mesh(m):
            return jax.smap(lambda b: b @ w, in_axes=0, out_axes=0, axis_name="i")(jax.device_put(x, jax.P("i")))

    assert not check("03.4", own)


def test_06_1_an_own_mesh_or_another_axis_name_fails_and_says_how_the_mesh_differs():
    def own(params, batch, mesh):
        m = jax.sharding.Mesh(np.array(jax.devices()), ("i",)) if mesh.size == 8 else mesh
        return jax.device_put(params, jax.NamedSharding(m, jax.P())), jax.device_put(batch, jax.NamedSharding(
            m, jax.P("i")))

    assert not check("06.1", own)
    fb = check("06.1", lambda p, b, m: (jax.device_put(p, jax.NamedSharding(jax.sharding.Mesh(m.devices, ("j",)),
                                                                             jax.P())), b))
    assert not fb and "on a mesh of its own (axes ('j',)" in fb.message and "the mesh given: ('i',)" in fb.message


def test_raw_jax_errors_of_lessons_00_03_06_get_a_course_sentence():
    fb = check("00.1", lambda x: jnp.asarray(x, device=jax.devices()[3]))      # x on device 7: JAX refuses
    assert not fb and "incompatible devices" in fb.message and "is what jax.device_put does" in fb.message
    fb = check("06.2", lambda: (jax.P("i"), jax.P("i", "i")))
    assert not fb and "names each mesh axis at most once" in fb.message
    fb = check("03.4", lambda x, w, mesh: _smap_out_axes_none(x, w, mesh))
    assert not fb and "out_axes names the axis along which smap joins the blocks" in fb.message \
        and "_rem_singleton" not in fb.message


def _smap_out_axes_none(x, w, mesh):
    with jax.set_mesh(mesh):
        return jax.smap(lambda b: b @ w, in_axes=0, out_axes=None, axis_name="i")(jax.device_put(x, jax.P("i")))


def test_04_wrong_rings_say_the_case_and_what_differs():
    def written_in_8(x, a):
        n = jax.lax.axis_size(a)
        return jax.lax.ppermute(x, a, [(i, (i + 1) % 8) for i in range(n) if (i + 1) % 8 < n])

    fb = check("04.3", written_in_8)
    assert not fb and "on 4 devices" in fb.message and "values differ" in fb.message

    def reduce_scatter_only(x, a):
        n, i = jax.lax.axis_size(a), jax.lax.axis_index(a)
        c = x.reshape(n, -1)
        for s in range(n - 1):
            c = c.at[(i - s - 1) % n].add(jax.lax.ppermute(c[(i - s) % n], a, [(j, (j + 1) % n) for j in range(n)]))
        return c.reshape(x.shape)

    fb = check("04.5", reduce_scatter_only)
    assert not fb and "values differ" in fb.message


# ---- lessons 10-13 (tester12, round 3)

def test_10_1_bytes_rounded_to_whole_numbers_fail_and_an_extra_key_is_named():
    from course_lib.exercises.lesson10 import solution_zero_bytes
    floor = check("10.1", lambda p, n, s: {k: float(int(v)) for k, v in solution_zero_bytes(p, n, s).items()})
    assert not floor and "1500.5" in floor.message
    total = check("10.1", lambda p, n, s: {**solution_zero_bytes(p, n, s), "total": 0.0})
    assert not total and "extra: ['total']; missing: none" in total.message


def test_10_4_a_gather_along_the_wrong_axis_is_named_from_the_shapes_loss_fn_receives():
    def make(loss_fn, optimizer):
        def step(my_params, opt_state, batch):
            def loss(p):
                return loss_fn(jax.tree.map(lambda a: jax.lax.all_gather(a, "data", axis=-1, tiled=True), p), batch)
            value, grads = jax.value_and_grad(loss)(my_params)
            n = jax.lax.axis_size("data")
            updates, opt_state = optimizer.update(jax.tree.map(lambda g: g / n, grads), opt_state, my_params)
            return optax.apply_updates(my_params, updates), opt_state, jax.lax.pmean(value, "data")
        return step

    fb = check("10.4", make)
    assert not fb and "join the slices along the first axis" in fb.message
    assert "inside the function you differentiate" not in fb.message


def test_12_1_fsdp_named_twice_is_named_and_a_length_equal_to_the_fsdp_size_must_split():
    def every_axis(params, mesh):
        size = mesh.shape["fsdp"]
        return jax.tree.map(lambda a: jax.P(*["fsdp" if d % size == 0 else None for d in a.shape]), params)

    def longer_only(params, mesh):
        size = mesh.shape["fsdp"]

        def spec(a):
            axis = next((i for i, d in enumerate(a.shape) if d % size == 0 and d > size), None)
            return jax.P() if axis is None else jax.P(*[None] * axis, "fsdp")
        return jax.tree.map(spec, params)

    twice, longer = check("12.1", every_axis), check("12.1", longer_only)
    assert not twice and "a mesh axis can split only one axis" in twice.message
    assert not longer and "although its axis 0 (length 4) splits" in longer.message


# ---- round 4 (tester13, tester14)


def test_00_2_one_id_against_another_has_no_factor():
    fb = check("00.2", lambda a: [3])
    assert not fb and "expected [7], got [3]: off by -4" in fb.message and "too small" not in fb.message


def test_07_2_a_learning_rate_written_in_is_not_blamed_on_the_device_count():
    def make(loss_fn, optimizer, mesh):             # the optimizer's updates thrown away: its own SGD at lr 0.1
        def body(params, opt_state, x, y):
            local = jax.tree.map(lambda p: jax.lax.pcast(p, "i", to="varying"), params)
            loss, g = jax.value_and_grad(loss_fn)(local, x, y)
            g, loss = jax.lax.pmean((g, loss), "i")
            _, s = optimizer.update(g, opt_state, params)
            return jax.tree.map(lambda p, d: p - 0.1 * d, params, g), s, loss
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(jax.P(), jax.P(), jax.P("i"), jax.P("i")),
                                     out_specs=(jax.P(), jax.P(), jax.P())), donate_argnums=(0, 1))

    fb = check("07.2", make)
    assert not fb and "device count" not in fb.message and "2x too large" in fb.message, fb.message


def test_05_2_a_zero_result_is_not_blamed_on_one_device():
    fb = check("05.2", lambda replicas: int(max(
        float(np.abs(np.asarray(s.data) - np.asarray(leaf.addressable_shards[0].data)).max())
        for leaf in jax.tree.leaves(replicas) for s in leaf.addressable_shards)))
    assert not fb and "no difference between them reached the result" in fb.message
    assert "same device" not in fb.message


def test_10_1_bytes_rounded_up_are_said_rounded_not_half_precision():
    def rounded_up(n_params, n_devices, stage):
        split = {"replicated": (1, 1, 1), "zero1": (1, 1, n_devices), "zero2": (1, n_devices, n_devices),
                 "fsdp": (n_devices,) * 3}[stage]
        return {k: math.ceil(b * n_params / s) for k, b, s in zip(("params", "grads", "opt_state"), (4, 4, 8), split)}

    fb = check("10.1", rounded_up)
    assert not fb and "rounded to whole numbers" in fb.message and "float16" not in fb.message


def test_11_1_devices_given_in_reverse_are_named():
    from course_lib import checkpoint

    fb = check("11.1", lambda directory, like, devices: checkpoint.restore(
        directory, like, devices=list(devices)[::-1])[0])
    assert not fb and "in reverse order" in fb.message


def _wrapped_step(change):
    from course_lib.exercises.lesson07 import solution_make_sharded_step

    def make(loss_fn, optimizer, mesh):
        step = solution_make_sharded_step(loss_fn, optimizer, mesh)
        return lambda *args: change(*step(*args))
    return make


def test_07_2_host_state_and_the_state_first_are_named():
    fb = check("07.2", _wrapped_step(lambda p, s, loss: (jax.device_get(p), s, loss)))
    assert not fb and "has a leaf on the host" in fb.message
    fb = check("07.2", _wrapped_step(lambda p, s, loss: (s, p, loss)))
    assert not fb and "the optimizer state as output [0]" in fb.message


def test_07_1_an_all_gather_declared_replicated_gets_the_course_s_sentence():
    fb = check("07.1", _all_gather_port(check_vma=True))
    assert not fb and "to='invarying'" in fb.message and "_rem_singleton" not in fb.message


# ---- round 4, lesson 10


def test_10_2_gathering_the_gradient_and_updating_the_whole_matrix_fails():
    def whole(params, grads, lr):
        g = jax.lax.psum_scatter(grads, "data", scatter_dimension=1, tiled=True) / jax.lax.axis_size("data")
        return params - lr * jax.lax.all_gather(g, "data", axis=1, tiled=True, to="invarying")

    fb = check("10.2", whole)
    assert not fb and "no all-gather carries parameters" in fb.message


def test_10_3_trying_only_k_1_is_not_called_powers_of_two():
    def only_one(make_step, state, batch, n_devices, budget):
        m = make_step(1).compile(state, batch).memory_analysis()
        need = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
        return 1 if need <= budget else None

    fb = check("10.3", only_one)
    assert not fb and "K = 3 (a divisor of the 6 examples per device) fits" in fb.message
    assert "powers of two" not in fb.message


def test_10_4_a_state_restarted_every_step_and_the_old_state_are_told_apart():
    def make(fresh):
        def make_fsdp_step(loss_fn, optimizer):
            def step(my_params, opt_state, batch):
                n = jax.lax.axis_size("data")
                loss, g = jax.value_and_grad(lambda m: loss_fn(jax.tree.map(
                    lambda s: jax.lax.all_gather(s, "data", tiled=True), m), batch))(my_params)
                old = optimizer.init(my_params) if fresh else opt_state
                updates, new = optimizer.update(jax.tree.map(lambda x: x / n, g), old, my_params)
                return optax.apply_updates(my_params, updates), new if fresh else old, jax.lax.pmean(loss, "data")
            return step
        return make_fsdp_step

    restarted, old = check("10.4", make(True)), check("10.4", make(False))
    assert not restarted and "the opt_state passed in is never read" in restarted.message
    assert not old and "The optimizer state returned is always a fresh one" in old.message

# ---- round 5 (the fifth set of hidden testers and two readings)


def test_exit_and_errors_without_a_message_are_reported_as_the_answers():
    def leaves(x):
        raise SystemExit("done")

    def unfinished(x):
        raise NotImplementedError

    exits, bare = check("00.1", leaves), check("00.1", unfinished)
    assert not exits and "raised SystemExit: done" in exits.message
    assert not bare and "raised NotImplementedError: (no message)" in bare.message


def test_05_2_an_answer_reading_only_the_first_leaves_fails():
    def first_two(replicated):
        return max(float(np.max(np.abs(np.asarray(s.data) - np.asarray(leaf.addressable_shards[0].data))))
                   for leaf in jax.tree.leaves(replicated)[:2] for s in leaf.addressable_shards)

    fb = check("05.2", first_two)
    assert not fb and "3 leaves in a nested tree on 2 devices" in fb.message


def test_05_1_a_pmean_times_n_is_told_what_its_numbers_are_not_that_it_used_psum():
    def scaled(loss_fn, optimizer, params, opt_state, batch):
        n = jax.lax.axis_size("devices")
        return solution_dp_step(lambda p, b: n * loss_fn(p, b), optimizer, params, opt_state, batch)

    fb = check("05.1", scaled)
    assert not fb and "were added (psum)" not in fb.message


def test_07_1_a_shape_error_in_the_answers_own_matmul_is_not_called_w_split():
    def ported(x, w, mesh):
        def body(xb, wb):
            h = jnp.tanh(wb @ xb)
            return h, jax.lax.psum(h.sum(axis=0), "i")
        return jax.shard_map(body, mesh=mesh, in_specs=(jax.P("i"), jax.P()), out_specs=(jax.P("i"), jax.P()))(x, w)

    fb = check("07.1", ported)
    assert not fb and "contracting dimensions" in fb.message and "w is split" not in fb.message


def test_09_2_a_fit_of_the_means_per_k_fails_where_ks_repeat():
    def means_first(ks, ms):
        ks, ms = np.asarray(ks), np.asarray(ms)
        u = np.unique(ks)
        return tuple(np.polyfit(1 / u, [ms[ks == k].mean() for k in u], 1))

    fb = check("09.2", means_first)
    assert not fb and "ks=[2, 16, 6, 2, 40, 12, 2, 1]" in fb.message


def test_10_1_a_padded_count_with_one_mistake_lists_only_the_cases_that_differ():
    def padded(p, n, stage):
        split = {"replicated": 0, "zero1": 1, "zero2": 2, "fsdp": 3}[stage]
        per = lambda b, k: b * (math.ceil(p / n) if split >= k else p)  # noqa: E731
        return {"params": per(4, 3), "grads": 4 * p if stage == "fsdp" else per(4, 2), "opt_state": per(8, 1)}

    fb = check("10.1", padded)
    assert not fb and "'zero1'" not in fb.message and "'zero2'" not in fb.message
    assert "wrong also in: zero_bytes(19_210, 4, 'fsdp'), zero_bytes(3_001, 8, 'fsdp')" in fb.message


def test_11_3_the_first_step_above_the_mean_and_the_second_marker_are_not_the_stalled_step():
    above = check("11.3", lambda t: next(m.step for m in t.markers
                                         if m.dur_us > np.mean([k.dur_us for k in t.markers])))
    second = check("11.3", lambda t: t.markers[1].step)
    assert not above and "which lasted 1,300 µs" in above.message
    assert not second and "shortest" not in second.message


@pytest.mark.parametrize("how", ["psum", "all_to_all"])
def test_12_2_matrices_combined_another_way_than_an_all_gather_fail(how):
    def gather_layer(layer):
        def one(w):
            if w.ndim == 1:
                return jax.lax.all_gather(w, "data", axis=0, tiled=True)
            n, c = jax.lax.axis_size("data"), w.shape[-1]
            if how == "all_to_all":
                return jax.lax.all_to_all(jnp.concatenate([w] * n, axis=-1), "data", w.ndim - 1, w.ndim - 1,
                                          tiled=True)
            full = jnp.zeros(w.shape[:-1] + (n * c,), w.dtype)
            full = jax.lax.dynamic_update_slice_in_dim(full, w, jax.lax.axis_index("data") * c, axis=-1)
            return jax.lax.psum(full, "data")
        return jax.tree.map(one, layer)

    fb = check("12.2", gather_layer)
    said = "all-reduces of more than one number" if how == "psum" else "with all-to-all"
    assert not fb and said in fb.message and "another way than by an all-gather" in fb.message


def test_02_3_arithmetic_and_a_copy_on_device_i_are_judged_alike():
    times_one = check("02.3", lambda y, i: y.addressable_shards[i].data[0] * 1)
    copied = check("02.3", lambda y, i: jnp.copy(y.addressable_shards[i].data[0]))
    assert times_one and copied, (times_one.message, copied.message)


def test_10_5_a_zero_for_a_collective_the_program_lacks_is_right():
    from course_lib.exercises.lesson10 import solution_predict_collectives
    fb = check("10.5", lambda stage, k: {**solution_predict_collectives(stage, k), "all-to-all": 0})
    assert fb, fb.message
    fb = check("10.5", lambda stage, k: {**solution_predict_collectives(stage, k), "all-to-all": 1})
    assert not fb and "the prediction counts 'all-to-all'" in fb.message


def test_07_2_gradients_averaged_from_an_all_gather_are_not_told_they_gathered_the_batch():
    fb = check("07.2", _sharded_step("gather"))
    assert not fb and "gathers values onto every device (the batch, or the devices' gradients)" in fb.message
    assert "own rows" not in fb.message


def test_03_1_a_static_scalar_and_a_numpy_reshape_pass():
    def scale_on_two(x, s):
        f = jax.pmap(lambda b, s: s * b, static_broadcasted_argnums=1, devices=jax.devices()[:2])
        return f(np.asarray(x).reshape(2, -1, x.shape[-1]), s).reshape(x.shape)

    fb = check("03.1", scale_on_two)
    assert fb and "in_axes=None" not in fb.message, fb.message


def _loop_norm(r):
    s = 0.0
    for k in range(r.shape[0]):
        s = s + r[k] * r[k]
    return jnp.sqrt(s)


def test_01_2_and_01_3_a_norm_written_as_a_loop_inside_the_map_passes():
    assert check("01.2", lambda x: jax.vmap(_loop_norm)(x))
    assert check("01.2", lambda x: jax.vmap(lambda r: jnp.sqrt(jnp.cumsum(r * r)[-1]))(x))
    assert check("01.3", lambda x: jax.pmap(_loop_norm)(x))
    outside = check("01.2", lambda x: jnp.sqrt(jnp.sum(jax.vmap(lambda r: r * r)(x), axis=1)))
    assert not outside and "runs inside its vmap" in outside.message


def test_03_2_in_axes_as_a_list_is_explained():
    fb = check("03.2", lambda params, xs: jax.pmap(lambda p, x: x @ p["w"] + p["b"], in_axes=[None, 0])(params, xs))
    assert not fb and "in_axes must match the arguments: a tuple (not a list)" in fb.message


def test_05_1_a_step_that_restarts_the_optimizer_state_fails():
    def restarted(loss_fn, optimizer, params, opt_state, batch):
        return solution_dp_step(loss_fn, optimizer, params, optimizer.init(params), batch)

    fb = check("05.1", restarted)
    assert not fb and "the update of params" in fb.message


def test_05_3_a_loss_whose_gradient_is_cut_fails():
    def cut(pred, y, mask):
        pred = jax.lax.stop_gradient(pred)
        return jnp.sum(jnp.where(mask, (pred - y) ** 2, 0.0)) / jnp.maximum(mask.sum(), 1)

    fb = check("05.3", cut)
    assert not fb and "its gradient with respect to pred differs" in fb.message


def test_a_structure_that_differs_in_a_named_output_is_named():
    def swapped_unpack(loss_fn, optimizer, params, opt_state, batch):
        grads, loss = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(jax.lax.pmean(loss, "devices"), opt_state, params)
        return optax.apply_updates(params, updates), opt_state, jax.lax.pmean(loss, "devices")

    fb = check("05.1", swapped_unpack)
    assert not fb and "with SGD: loss: expected ndarray float32[8], got dict" in fb.message
    pair = check("11.1", lambda d, like, devs: __import__("course_lib").checkpoint.restore(d, like, devices=devs))
    assert not pair and "output [0]" not in pair.message


def test_a_negative_factor_other_than_minus_one_is_not_said_as_negated():
    def device_0(x, axis_name):
        x0 = jax.lax.all_gather(x, axis_name)[0]
        return jnp.mean(x0), jnp.var(x0)

    fb = check("04.2", device_0)
    assert not fb and "negated" not in fb.message and "every value off by" in fb.message


def test_an_addition_inside_pmap_does_not_hide_a_reduction_outside_it():
    outside = check("02.2", lambda xs: jax.pmap(lambda b: b * b + 0.0)(xs).sum(axis=(1, 2)))
    assert not outside and "no sum of squares runs inside its pmap" in outside.message
    norms = check("01.3", lambda x: jnp.sqrt(jax.pmap(lambda r: r * r + 0.0)(x).sum(axis=1)))
    assert not norms and "runs inside its pmap" in norms.message
