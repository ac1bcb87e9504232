"""Exercise 11.4 (a sharded state onto a mesh of another size, with Orbax): wrong answers fail naming the mistake;
right answers written differently pass. The checker saves steps past 9, other structures, axis names and meshes."""

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from course_lib import checkpoint
from course_lib.exercises import check


def _restore(directory, target, step=None):
    with ocp.CheckpointManager(directory) as manager:
        return manager.restore(manager.latest_step() if step is None else step,
                               args=ocp.args.StandardRestore(target))


def _on(mesh, like, spec=None, dtype=None):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        x.shape, dtype if dtype and x.dtype == jnp.float32 else x.dtype,
        sharding=NamedSharding(mesh, x.sharding.spec if spec is None else spec)), like)


def _no_target(d, like, mesh):
    return _restore(d, like)


def _all_whole(d, like, mesh):
    return _restore(d, _on(mesh, like, P()))


def _first_devices(d, like, mesh):
    own = jax.make_mesh(mesh.devices.shape, mesh.axis_names, devices=jax.devices()[:mesh.size])
    return _restore(d, _on(own, like))


def _bfloat16(d, like, mesh):
    return _restore(d, _on(mesh, like, dtype=jnp.bfloat16))


def _step_seven(d, like, mesh):
    return _restore(d, _on(mesh, like), step=7)


def _oldest_step(d, like, mesh):
    with ocp.CheckpointManager(d) as manager:
        oldest = manager.all_steps()[0]
    return _restore(d, _on(mesh, like), step=oldest)


def _newest_by_text(d, like, mesh):
    return _restore(d, _on(mesh, like), step=int(max(p.name for p in d.iterdir() if p.name.isdigit())))


def _then_move(d, like, mesh):
    state = _restore(d, None)
    return jax.tree.map(lambda x, a: jax.device_put(a, NamedSharding(mesh, x.sharding.spec)), like, state)


def _via_host(d, like, mesh):
    state = _restore(d, jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), like))
    return jax.tree.map(lambda x, a: jax.device_put(a, NamedSharding(mesh, x.sharding.spec)), like, state)


def _course_lib(d, like, mesh):
    return checkpoint.restore(d, like, devices=list(mesh.devices.flat))[0]


def _lesson_rule(d, like, mesh):               # lesson 11's fsdp_shardings: split where the first axis divides
    axis = mesh.axis_names[0]
    return _restore(d, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(
        mesh, P(axis) if x.ndim and x.shape[0] % mesh.size == 0 else P())), like))


def _axis_data(d, like, mesh):                 # the lesson's axis name written in
    return _restore(d, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(
        mesh, P(*["data" if a is not None else None for a in x.sharding.spec]))), like))


def _arrays_only(d, like, mesh):               # drops the scalar leaves
    state = _restore(d, _on(mesh, like))
    return {k: v for k, v in state.items() if getattr(v, "ndim", 1)}


WRONG = {
    "no target": (_no_target, "devices it was saved from"),
    "every leaf whole": (_all_whole, "Keep each leaf's PartitionSpec"),
    "the first devices": (_first_devices, "over devices [5, 2, 6, 1], got split as"),
    "bfloat16 target": (_bfloat16, "bfloat16"),
    "step 7 written in": (_step_seven, "expected the values of step 11, got the values of step 7"),
    "newest step by its name as text": (_newest_by_text, "compared as text"),
    "the oldest step": (_oldest_step, "You restored the oldest step"),
    "restored where saved, then moved": (_then_move, "onto the sharding stored in the checkpoint"),
    "read on the host, then placed": (_via_host, "on the host (NumPy)"),
    "course_lib instead of Orbax": (_course_lib, "called course_lib's checkpoint.restore"),
    "the lesson's rule for every leaf": (_lesson_rule, "Keep each leaf's PartitionSpec"),
    "axis name 'data' written in": (_axis_data, "names its axis differently"),
    "only the arrays": (_arrays_only, "expected dict{"),
}


@pytest.mark.parametrize("mistake", list(WRONG))
def test_wrong_answer_fails_and_names_the_mistake(mistake):
    answer, named = WRONG[mistake]
    feedback = check("11.4", answer)
    assert not feedback, mistake
    assert named in feedback.message, (mistake, feedback.message)


def _checkpointer_newest_by_number(directory, like, mesh):
    newest = max(int(p.name) for p in directory.iterdir() if p.name.isdigit())
    return ocp.StandardCheckpointer().restore(directory / str(newest) / "default", _on(mesh, like))


def _restore_none_and_specs_from_like(directory, like, mesh):
    target = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(
        leaf.shape, leaf.dtype, sharding=jax.sharding.NamedSharding(mesh, leaf.sharding.spec)), like)
    with ocp.CheckpointManager(directory) as manager:
        return manager.restore(None, args=ocp.args.StandardRestore(target))


@pytest.mark.parametrize("answer", [_checkpointer_newest_by_number, _restore_none_and_specs_from_like])
def test_right_answers_written_otherwise_pass(answer):
    feedback = check("11.4", answer)
    assert feedback, feedback.message


# ---- Fresh answers (issue 44), written as learners would: each wrong one fails with what differs (or its mistake,
# where the numbers confirm it); each right one in another form passes.
from course_lib.exercises import check as _check  # noqa: E402

def _second_newest(d, like, mesh):
    with ocp.CheckpointManager(d) as manager:
        steps = sorted(manager.all_steps())
    return _restore(d, _on(mesh, like), step=steps[-2] if len(steps) > 1 else steps[-1])


FRESH = [
    ("the second newest step", _second_newest, "expected the values of step 11, got the values of step 10."),
    ("like's own shardings", lambda d, like, mesh: _restore(d, like), "devices it was saved from"),
    ("a target with no sharding", lambda d, like, mesh: _restore(d, jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), like)), "unless the restore's target names another"),
    ("returns None", lambda d, like, mesh: None, "returned None: did it forget"),
]


from fooling import fresh_test as _fresh_test  # noqa: E402

test_a_fresh_answer_gets_what_differs = _fresh_test('11.4', FRESH)
