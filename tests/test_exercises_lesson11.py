"""Lesson 11 checkers: the reference passes; typical mistakes get feedback that names them."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec as P

from course_lib import checkpoint, profile
from course_lib.exercises import check, exercises, lesson11
from course_lib.exercises.lesson11 import (solution_collective_fraction, solution_restore_onto,
                                           solution_stalled_step)
from hint_rules import assert_hints_are_a_ladder, code_from_solution, solution_lines


def wrong(id_, answer):
    """The feedback to a wrong answer: not passed, and no line of the solution's code in it."""
    feedback = check(id_, answer)
    assert not feedback, feedback.message
    assert not code_from_solution(id_, feedback.message), feedback.message
    return feedback.message


def test_11_1_restore_onto():
    assert check("11.1", solution_restore_onto)
    both = check("11.1", lambda d, like, devs: checkpoint.restore(d, like, devices=devs))
    assert "return only the state" in both.message
    where_like_lives = check("11.1", lambda d, like, devs: checkpoint.restore(d, like)[0])
    assert "Pass the devices to the restore" in where_like_lives.message
    raising = check("11.1", lambda d, like, devs: 1 / 0)
    assert "raised ZeroDivisionError" in raising.message
    not_restored = check("11.1", lambda d, like, devs: jax.device_put(like, checkpoint.replicated_on(devs)))
    assert "restore the checkpoint, not like=" in not_restored.message
    wrong_structure = check("11.1", lambda d, like, devs: [1, 2])
    assert not wrong_structure and "expected dict{'params'" in wrong_structure.message


def test_11_2_collective_fraction():
    assert check("11.2", solution_collective_fraction)
    compute = check("11.2", lambda t: 1 - solution_collective_fraction(t))
    assert "share of compute" in compute.message
    whole_trace = check("11.2", lambda t: sum(v["collective_us"] for v in profile.summarise(t).values()) / (
        len(t.devices) * (max(o.end_us for o in t.ops) - min(o.start_us for o in t.ops))))
    assert "idle gaps" in whole_trace.message
    a_dict = check("11.2", lambda t: profile.summarise(t))
    assert "expected float, got dict" in a_dict.message
    raising = check("11.2", lambda t: t.nope)
    assert "raised AttributeError" in raising.message


def test_11_3_stalled_step():
    assert check("11.3", solution_stalled_step)
    position = check("11.3", lambda t: max(range(len(t.markers)), key=lambda i: t.markers[i].dur_us))
    assert "position in the list" in position.message
    marker = check("11.3", lambda t: max(t.markers, key=lambda m: m.dur_us))
    assert "(Marker), not a step number" in marker.message
    raising = check("11.3", lambda t: t.markers[99])
    assert "raised IndexError" in raising.message
    first = check("11.3", lambda t: t.markers[0].step)
    assert "got step 100 (marker 1 of 8, which lasted 937 µs). That is the first step" in first.message


def test_every_exercise_has_a_ladder_of_hints_without_the_solution_code():
    assert set(lesson11.HINTS) == {"11.1", "11.2", "11.3", "11.4"}
    for id_ in lesson11.HINTS:
        assert_hints_are_a_ladder(id_)
        assert len(exercises()[id_].hints) >= 3


def test_11_1_restore_then_move_is_not_the_mechanism():
    moved = check("11.1", lambda d, like, devs: jax.device_put(checkpoint.restore(d, like)[0],
                                                               checkpoint.replicated_on(devs)))
    assert not moved and "Pass devices= to checkpoint.restore" in moved.message
    with_sharding = check("11.1", lambda d, like, devs: checkpoint.restore(
        d, like, sharding=checkpoint.replicated_on(devs))[0])
    assert with_sharding, with_sharding.message
    assert checkpoint.restore.__name__ == "restore"          # the checker put the library back


def test_11_2_shortcuts_percentages_and_unweighted_means_are_named():
    shortcut = check("11.2", lambda t: profile.collective_fraction(t))
    assert not shortcut and "calls profile.collective_fraction" in shortcut.message
    assert profile.collective_fraction.__name__ == "collective_fraction"
    percent = check("11.2", lambda t: 100 * solution_collective_fraction(t))
    assert not percent and "is a percentage" in percent.message
    unweighted = check("11.2", lambda t: sum(v["collective_us"] / v["busy_us"] for v in profile.summarise(t).values())
                       / len(profile.summarise(t)))
    assert not unweighted and "averages the devices' own fractions" in unweighted.message


def test_11_1_the_devices_given_in_another_order_are_refused():
    rotated = wrong("11.1", lambda d, like, devs: checkpoint.restore(d, like, devices=devs[1:] + devs[:1])[0])
    assert "got whole on devices [2, 6, 1, 5]" in rotated
    last = wrong("11.1", lambda d, like, devs: checkpoint.restore(d, like, devices=jax.devices()[-len(devs):])[0])
    assert "got whole on devices [4, 5, 6, 7]" in last     # the devices given are neither the first nor the last ones


def test_11_1_a_split_restore_is_told_the_exercise_asks_for_whole_leaves():
    split = wrong("11.1", lambda d, like, devs: checkpoint.restore(
        d, like, sharding=NamedSharding(jax.sharding.Mesh(np.array(devs), ("d",)), P("d")))[0])
    assert "every leaf whole on each of the devices given, scalars too" in split


def test_11_1_names_a_dtype_change():
    message = wrong("11.1", lambda d, like, devs: checkpoint.restore(
        d, jax.tree.map(lambda x: x.astype(jnp.float16) if x.dtype == jnp.float32 else x, like), devices=devs)[0])
    assert "float16" in message


def test_11_2_feedback_does_not_give_the_formula_and_names_types():
    assert "share of compute" in wrong("11.2", lambda t: 1 - solution_collective_fraction(t))
    unweighted = wrong("11.2", lambda t: sum(v["collective_us"] / v["busy_us"] for v in profile.summarise(t).values())
                       / len(profile.summarise(t)))
    assert "averages the devices' own fractions" in unweighted and "busy_us" not in unweighted
    assert "got str" in wrong("11.2", lambda t: f"{solution_collective_fraction(t):.4f}")
    assert "float16" in wrong("11.2", lambda t: np.float16(solution_collective_fraction(t)))
    assert "bfloat16" in wrong("11.2", lambda t: jnp.bfloat16(solution_collective_fraction(t)))
    off = wrong("11.2", lambda t: solution_collective_fraction(t) * 0.9)
    assert "1.11x too small" in off and "sum over devices" not in off


def _restore(directory, target):
    with ocp.CheckpointManager(directory) as manager:
        return manager.restore(manager.latest_step(), args=ocp.args.StandardRestore(target))


def _on(mesh, like, spec=None, dtype=None):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, dtype if dtype and x.dtype == jnp.float32 else x.dtype,
                                                       sharding=NamedSharding(mesh, x.sharding.spec if spec is None
                                                                              else spec)), like)


def test_11_4_restore_resharded_right_answers():
    assert check("11.4", lesson11.solution_restore_resharded)
    # the lower-level checkpointer works too: the mechanism is the target, not the class
    def with_checkpointer(directory, like, mesh):
        newest = max(int(p.name) for p in directory.iterdir() if p.name.isdigit())
        return ocp.StandardCheckpointer().restore(directory / str(newest) / "default", _on(mesh, like))
    feedback = check("11.4", with_checkpointer)
    assert feedback, feedback.message


def test_11_4_wrong_answers_are_named():
    assert "over devices [0, 1, 2, 3, 4, 5, 6, 7]" in wrong("11.4", lambda d, like, mesh: _restore(d, like))
    assert "Keep each leaf's PartitionSpec" in wrong("11.4", lambda d, like, mesh: _restore(d, _on(mesh, like, P())))
    first = lambda d, like, mesh: _restore(d, _on(jax.make_mesh(mesh.devices.shape, ("data",),
                                                                devices=jax.devices()[:mesh.size]), like))
    assert "expected split as P('data',) over devices [5, 2, 6, 1]" in wrong("11.4", first)   # fine on 8, wrong on 4
    assert "bfloat16" in wrong("11.4", lambda d, like, mesh: _restore(d, _on(mesh, like, dtype=jnp.bfloat16)))
    assert "got tuple" in wrong("11.4", lambda d, like, mesh: (_restore(d, _on(mesh, like)), 7))
    fresh = lambda d, like, mesh: {k: jax.device_put(jnp.zeros(x.shape, x.dtype), NamedSharding(mesh, x.sharding.spec))
                                   for k, x in like.items()}
    assert "got values that no saved step holds" in wrong("11.4", fresh)
    assert "raised ZeroDivisionError" in wrong("11.4", lambda d, like, mesh: 1 / 0)


def test_11_4_skipping_the_target_is_caught():
    def then_move(d, like, mesh):                 # restore where it was saved, then move
        state = _restore(d, None)
        return jax.tree.map(lambda x, v: jax.device_put(v, NamedSharding(mesh, x.sharding.spec)), like, state)
    assert "onto the sharding stored in the checkpoint, split as P('data',) over devices [0," in wrong("11.4", then_move)

    def whole_then_split(d, like, mesh):          # read whole onto every device of the new mesh, then split
        state = _restore(d, _on(mesh, like, P()))
        return jax.tree.map(lambda x, v: jax.device_put(v, NamedSharding(mesh, x.sharding.spec)), like, state)
    assert "of shape (16,) whole on devices [5, 2, 6, 1] (you return it split as P('data',)" in wrong(
        "11.4", whole_then_split)

    def via_host(d, like, mesh):                  # read as NumPy on the host, then place
        state = _restore(d, jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), like))
        return jax.tree.map(lambda x, v: jax.device_put(v, NamedSharding(mesh, x.sharding.spec)), like, state)
    assert "on the host (NumPy)" in wrong("11.4", via_host)
    assert lesson11._orbax_reads                  # the checker put Orbax's handlers back
    from orbax.checkpoint._src.serialization import jax_array_handlers
    assert jax_array_handlers.ArrayHandler.deserialize.__qualname__.startswith("ArrayHandler")


# ---- beginner review: feedback that names the mistake the learner made


def test_11_1_names_the_first_devices_and_the_saved_ones():
    first = wrong("11.1", lambda d, like, devs: checkpoint.restore(d, like, devices=jax.devices()[:len(devs)])[0])
    assert "the first 4 device(s), not the ones you were given" in first

    def orbax_without_target(d, like, devs):
        with ocp.CheckpointManager(d) as manager:
            return manager.restore(manager.latest_step())["state"]
    assert "the devices it was saved from" in wrong("11.1", orbax_without_target)
    assert "expected whole on devices [5, 2, 6, 1], got on device 5" in wrong(
        "11.1", lambda d, like, devs: checkpoint.restore(d, like, devices=devs[:1])[0])


def test_11_2_one_device_compute_and_in_place_changes_are_named():
    one = wrong("11.2", lambda t: profile.summarise(t)[0]["collective_us"] / profile.summarise(t)[0]["busy_us"])
    assert "share of device 0 alone" in one
    by_compute = wrong("11.2", lambda t: sum(v["collective_us"] for v in profile.summarise(t).values())
                       / sum(v["compute_us"] for v in profile.summarise(t).values()))
    assert "divides the collectives' time by the compute time" in by_compute

    def empties(t):
        value = solution_collective_fraction(t)
        t.ops.clear()
        return value
    assert "changed the trace it was given in place (ops)" in wrong("11.2", empties)
    # computing from the ops and dispatches directly (no summarise) is right too; adding up every op's duration
    # for the busy time is not (a loop op holds its body; a device idles inside a dispatch between its ops)
    assert check("11.2", lambda t: sum(o.dur_us for o in t.ops if o.collective)
                 / sum(r.dur_us for runs in t.dispatches.values() for r in runs))
    assert "adds up op durations" in wrong("11.2", lambda t: sum(o.dur_us for o in t.ops if o.collective)
                                           / sum(o.dur_us for o in t.ops))


def test_11_3_numbers_in_other_forms_pass_and_sorting_in_place_is_named():
    assert check("11.3", lambda t: t.markers[0].step + jnp.argmax(jnp.array([m.dur_us for m in t.markers])))
    assert check("11.3", lambda t: t.markers[0].step + np.argmax([m.dur_us for m in t.markers]))
    assert check("11.3", lambda t: float(solution_stalled_step(t)))             # a step number in other forms
    assert check("11.3", lambda t: jnp.float32(solution_stalled_step(t)))
    assert "True (bool), not a step number" in wrong("11.3", lambda t: t.markers[0].step > 0)    # a bool is not a step

    def sorts(t):
        t.markers.sort(key=lambda m: m.dur_us)
        return t.markers[-1].step
    assert "changed the trace it was given in place (markers)" in wrong("11.3", sorts)
    assert "the shortest step" in wrong("11.3", lambda t: min(t.markers, key=lambda m: m.dur_us).step)


def test_11_4_one_rule_for_every_leaf_fails():
    every_leaf_split = lambda d, like, mesh: _restore(d, jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=NamedSharding(mesh, P("data") if x.ndim else P())), like))
    assert "expected whole on devices [5, 2, 6, 1], got split as P('data',)" in wrong("11.4", every_leaf_split)

    def notebook_rule(d, like, mesh):          # lesson 11's fsdp_shardings: split where the first axis divides
        size = mesh.shape["data"]
        return _restore(d, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(
            mesh, P("data") if x.ndim and x.shape[0] % size == 0 else P())), like))
    assert "expected whole on devices [5, 2, 6, 1], got split as P('data',)" in wrong("11.4", notebook_rule)


def test_11_4_the_newest_step_not_a_number_read_in_the_text():
    def step_seven(d, like, mesh):
        with ocp.CheckpointManager(d) as manager:
            return manager.restore(7, args=ocp.args.StandardRestore(_on(mesh, like)))
    message = wrong("11.4", step_seven)
    assert "expected the values of step 11, got the values of step 7" in message
    assert "compared as text" not in message

    def newest_by_none(d, like, mesh):         # restore(None) is Orbax's "newest" too
        with ocp.CheckpointManager(d) as manager:
            return manager.restore(None, args=ocp.args.StandardRestore(_on(mesh, like)))
    assert check("11.4", newest_by_none)


def test_11_4_course_lib_other_layouts_and_device_order_are_named():
    through = wrong("11.4", lambda d, like, mesh: checkpoint.restore(d, like, devices=list(mesh.devices.flat))[0])
    assert "called course_lib's checkpoint.restore" in through and "Orbax itself" in through
    assert checkpoint.restore.__name__ == "restore"          # the checker put course_lib back
    step_dir = wrong("11.4", lambda d, like, mesh: ocp.StandardCheckpointer().restore(d / "7", _on(mesh, like)))
    assert "named 'default'" in step_dir

    def composite(d, like, mesh):              # section 1's layout, state and extra, copied here
        with ocp.CheckpointManager(d) as manager:
            return manager.restore(manager.latest_step(), args=ocp.args.Composite(
                state=ocp.args.StandardRestore(_on(mesh, like))))["state"]
    assert "no Composite" in wrong("11.4", composite)

    reversed_mesh = lambda d, like, mesh: _restore(d, _on(jax.make_mesh(
        (mesh.size,), mesh.axis_names, devices=list(mesh.devices.flat)[::-1]), like))
    assert "over devices [5, 2, 6, 1], got split as P('data',) over devices [1, 6, 2, 5]" in wrong(
        "11.4", reversed_mesh)

    def mutates(d, like, mesh):
        for k in like:
            like[k] = _on(mesh, {k: like[k]})[k]
        return _restore(d, like)
    assert "changed its input like in place" in wrong("11.4", mutates)
    renamed = lambda d, like, mesh: _restore(d, jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=NamedSharding(jax.sharding.Mesh(mesh.devices, ("x",)),
                                                 P(*["x" if a == mesh.axis_names[0] else a for a in x.sharding.spec]))), like))
    assert check("11.4", renamed)                               # the same placement under another axis name


def test_the_cell_hint_2_of_11_4_points_to_does_not_hold_the_solution():
    import json
    import pathlib
    notebook = pathlib.Path(__file__).resolve().parent.parent / "notebooks" / "11_checkpoints_and_profiles.ipynb"
    cells = ["".join(c["source"]) for c in json.loads(notebook.read_text())["cells"]]
    section = [c for c in cells if "def fsdp_shardings(" in c]
    assert len(section) == 1 and "A sharded state onto another mesh" in exercises()["11.4"].hints[1]
    # the solution's statements (not a bare opening like "target = jax.tree.map("), whitespace ignored
    statements = [line.removeprefix("return") for line in solution_lines("11.4")
                  if len(line) >= 30 and "import" not in line]
    assert len(statements) >= 2
    for cell in cells:                          # that cell, and every other cell of the lesson
        flat = re.sub(r"\s+", "", cell)
        assert not [line for line in statements if line in flat], cell[:80]
