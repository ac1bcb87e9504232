"""Lesson 08 checkers: the reference passes; typical mistakes get feedback that names them."""

from course_lib.exercises import check
from course_lib.exercises.lesson08 import solution_local_part, solution_process_rows


def test_08_1_process_rows():
    assert check("08.1", solution_process_rows)
    interleaved = check("08.1", lambda b, n, p: slice(p, b, n))
    assert "interleaved" in interleaved.message
    off_by_one = check("08.1", lambda b, n, p: slice(p * (b // n), (p + 1) * (b // n) + 1))
    assert "It selects one row too many" in off_by_one.message
    not_a_slice = check("08.1", lambda b, n, p: list(range(p * (b // n), (p + 1) * (b // n))))
    assert "should return a slice" in not_a_slice.message


def test_08_2_local_part():
    assert check("08.2", solution_local_part)
    contiguous = check("08.2", lambda batch, devices, p: batch[p * 4:(p + 1) * 4] if len(
        {d.process_index for d in devices}) == 2 else solution_local_part(batch, devices, p))
    # not a mistake on every case: what differs, and where (the values shown first would agree)
    assert "devices interleaved): " in contiguous.message and "values differ; first at index" in contiguous.message
    assert "process_index" not in contiguous.message
    everything = check("08.2", lambda batch, devices, p: batch)
    assert "returns the whole batch" in everything.message


def test_08_1_raises_or_wrong_structure():
    fb = check("08.1", lambda b, n, p: slice(p * b / n, (p + 1) * b / n))
    assert not fb and "which cannot select rows" in fb.message and "must be ints" in fb.message
    fb = check("08.1", lambda b, n, p: (p * (b // n), (p + 1) * (b // n)))
    assert not fb and "should return a slice, like slice(start, stop); got tuple(int, int)" in fb.message
    fb = check("08.1", lambda b, n, p: slice(0, b // n * [1][p]))
    assert not fb and "process_rows(64, 2, 1) raised IndexError" in fb.message


def test_08_2_expected_answer_is_private():
    # Fails on the checker before issue 14: it built its expected answer from the batch the learner zeroed.
    def zero_and_return_zeros(batch, devices, p):
        rows = [i for i, d in enumerate(devices) if d.process_index == p]
        batch[...] = 0
        return batch[rows]

    fb = check("08.2", zero_and_return_zeros)
    assert not fb and "changed its input batch in place: its values changed" in fb.message

    def sorts_devices(batch, devices, p):
        devices.sort(key=lambda d: (d.process_index, d.id))
        return solution_local_part(batch, devices, p)

    fb = check("08.2", sorts_devices)
    assert not fb and "changed its input devices in place" in fb.message


def test_08_2_raises_or_wrong_structure():
    fb = check("08.2", lambda batch, devices, p: batch[[i for i, d in enumerate(devices) if d.process_id == p]])
    assert not fb and "raised AttributeError" in fb.message and "process_id" in fb.message
    fb = check("08.2", lambda batch, devices, p: [batch[i] for i, d in enumerate(devices) if d.process_index == p])
    assert fb, "a list of the rows stands for the array of them"


def test_08_hints_are_a_ladder_without_solution_code():
    from hint_rules import assert_hints_are_a_ladder
    for id_ in ("08.1", "08.2", "08.3"):
        assert_hints_are_a_ladder(id_)


# ---- 08.3: the global batch from this process's rows -----------------------------------------------------

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from course_lib.exercises.lesson08 import solution_global_batch  # noqa: E402


def _local_data(spec=("data",), global_shape="right", reshape=False):
    def global_batch(local_rows, mesh):
        rows = local_rows.reshape(mesh.size, -1, *local_rows.shape[1:]) if reshape else local_rows
        shape = {"right": (local_rows.shape[0] * jax.process_count(),) + local_rows.shape[1:],
                 "local": local_rows.shape, "none": None, "fixed": (16, 3),
                 "stacked": (mesh.size, local_rows.shape[0] * jax.process_count() // mesh.size, 3)}[global_shape]
        return jax.make_array_from_process_local_data(NamedSharding(mesh, P(*spec)), rows, shape)
    return global_batch


def test_08_3_right_answers_pass():
    assert check("08.3", solution_global_batch)
    assert check("08.3", _local_data(global_shape="none"))       # JAX infers the global shape from the sharding
    # The device counts give the same answer when the mesh spans the job.
    assert check("08.3", lambda rows, mesh: jax.make_array_from_process_local_data(
        NamedSharding(mesh, P("data")), rows,
        (rows.shape[0] * jax.device_count() // jax.local_device_count(), *rows.shape[1:])))


def test_08_3_local_shape_is_caught_only_by_the_simulated_job():
    # With one process the local shape is the global one: the real API accepts it. As process 0 of 2, it is wrong.
    fb = check("08.3", _local_data(global_shape="local"))
    assert not fb and "as process 0 of a 2-process job" in fb.message and "the shape of this process's own rows" in fb.message


def test_08_3_skipping_the_mechanism_or_the_layout():
    fb = check("08.3", lambda rows, mesh: jax.device_put(rows, NamedSharding(mesh, P("data"))))
    assert not fb and "without calling jax.make_array_from_process_local_data" in fb.message
    fb = check("08.3", _local_data(global_shape="stacked", reshape=True))
    assert not fb and "stacked (n, B // n, ...) layout is pmap's" in fb.message
    fb = check("08.3", _local_data(spec=(), global_shape="local"))
    assert not fb and "[5, 2, 6, 1, 3, 4, 0, 7], got whole on devices [5, 2, 6, 1, 3, 4, 0, 7]" in fb.message


def test_08_3_another_order_of_the_mesh_devices_is_refused():
    def rotated(rows, mesh):
        devs = list(mesh.devices.flat)
        return solution_global_batch(rows, jax.sharding.Mesh(np.array(devs[1:] + devs[:1]), mesh.axis_names))
    fb = check("08.3", rotated)
    assert not fb and "over devices [5, 2, 6, 1, 3, 4, 0, 7], got split as P('data',) over devices [2, 6," in fb.message


def test_08_3_a_mesh_of_its_own_is_refused_and_told_to_use_the_given_one():
    def own(size):
        return lambda rows, mesh: jax.make_array_from_process_local_data(NamedSharding(jax.make_mesh(
            (size(mesh),), ("data",)), P("data")), rows, (rows.shape[0] * jax.process_count(), *rows.shape[1:]))
    fb = check("08.3", own(lambda mesh: mesh.size))        # the first devices, as many as the mesh's
    assert not fb and "[5, 2, 6, 1, 3, 4, 0, 7], got split as P('data',) over devices [0, 1, 2, 3, 4," in fb.message
    fb = check("08.3", own(lambda mesh: jax.device_count()))      # a one-process job's devices are the mesh's
    assert not fb and "[5, 2, 6, 1, 3, 4, 0, 7], got split as P('data',) over devices [0, 1, 2, 3, 4," in fb.message
    fb = check("08.3", own(lambda mesh: 8))            # on 2 devices, 4 rows over a mesh of 8 of its own
    assert not fb and "not the mesh you were given: use that one" in fb.message and "nothing else" not in fb.message


def test_08_3_fixed_numbers_dtype_and_in_place():
    fb = check("08.3", _local_data(global_shape="fixed"))       # right on 8 devices, wrong on 4
    assert not fb and "no number written in" in fb.message
    fb = check("08.3", lambda rows, mesh: solution_global_batch(rows.astype(jnp.bfloat16), mesh))
    assert not fb and "bfloat16" in fb.message

    def scales_in_place(rows, mesh):
        rows *= 2
        return solution_global_batch(rows, mesh)

    fb = check("08.3", scales_in_place)
    assert not fb and "changed its input rows in place" in fb.message
    # The checker leaves jax as it found it.
    assert jax.process_count() == 1 and jax.make_array_from_process_local_data.__module__.startswith("jax")
    assert np.asarray(jax.devices()).size == len(jax.devices())


def test_08_2_dtype_and_strings_for_numbers():
    fb = check("08.2", lambda batch, devices, p: solution_local_part(batch, devices, p).astype(np.float32))
    assert not fb and "dtype float32 where int64 was expected" in fb.message
    fb = check("08.1", lambda b, n, p: slice(str(p * (b // n)), str((p + 1) * (b // n))))
    assert not fb and "must be ints" in fb.message


def test_08_2_device_ids_used_as_positions_are_named():
    # Lesson 08: ids are labels (process 1's CPU devices start at 2048), not positions. The fake devices say so too.
    fb = check("08.2", lambda batch, devices, p: batch[[d.id for d in devices if d.process_index == p]])
    assert not fb and "index 2048 is out of bounds" in fb.message and "id is a label, not its position" in fb.message


def test_08_3_global_shape_not_a_tuple_or_a_bare_spec():
    fb = check("08.3", lambda rows, mesh: jax.make_array_from_process_local_data(
        NamedSharding(mesh, P("data")), rows, rows.shape[0] * jax.process_count()))
    assert not fb and "is not a tuple: it is a tuple of ints" in fb.message
    fb = check("08.3", lambda rows, mesh: jax.make_array_from_process_local_data(
        NamedSharding(mesh, P("data")), rows, [rows.shape[0] * jax.process_count(), rows.shape[1]]))
    assert not fb and "[16, 3] is not a tuple" in fb.message
    fb = check("08.3", lambda rows, mesh: jax.make_array_from_process_local_data(
        P("data"), rows, (rows.shape[0] * jax.process_count(),) + rows.shape[1:]))
    assert not fb and "pair it with the mesh you were given" in fb.message
    # Devices, not processes: the feedback names the difference.
    fb = check("08.3", lambda rows, mesh: jax.make_array_from_process_local_data(
        NamedSharding(mesh, P("data")), rows, (rows.shape[0] * jax.device_count(),) + rows.shape[1:]))
    assert not fb and "the number of processes, then every other axis" in fb.message
    # After a non-tuple shape, the next check starts clean.
    assert check("08.3", solution_global_batch)


def test_08_3_names_imported_from_jax_are_named_not_called_missing():
    # The simulated job replaces jax.make_array_from_process_local_data and jax.process_count in the jax module;
    # a name imported before cannot be reached. The feedback says so instead of "without calling".
    from jax import make_array_from_process_local_data, process_count

    def imported(rows, mesh):
        return make_array_from_process_local_data(NamedSharding(mesh, P("data")), rows,
                                                  (rows.shape[0] * process_count(),) + rows.shape[1:])
    fb = check("08.3", imported)
    assert not fb and "make_array_from_process_local_data and process_count by a name imported or saved" in fb.message

    def count_imported(rows, mesh):
        return jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), rows,
                                                      (rows.shape[0] * process_count(),) + rows.shape[1:])
    fb = check("08.3", count_imported)
    assert not fb and "refers to process_count by a name imported" in fb.message
