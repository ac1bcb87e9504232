"""Exercise 11.1 (restore onto the devices you are given): wrong answers fail with feedback naming the mistake;
right answers written differently from the reference pass."""

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from course_lib import checkpoint
from course_lib.exercises import check


def _both(d, like, devs):                       # (state, extra), not the state
    return checkpoint.restore(d, like, devices=devs)


def _where_like_lives(d, like, devs):           # no placement: onto like's devices
    return checkpoint.restore(d, like)[0]


def _first_devices(d, like, devs):              # "the first n" instead of the ones given
    return checkpoint.restore(d, like, devices=jax.devices()[:len(devs)])[0]


def _restore_then_move(d, like, devs):          # a second copy through device memory
    return jax.device_put(checkpoint.restore(d, like)[0], checkpoint.replicated_on(devs))


def _like_moved(d, like, devs):                 # places like, never reads the checkpoint
    return jax.device_put(like, checkpoint.replicated_on(devs))


def _oldest_step(d, like, devs):                # the first step in the directory, not the newest
    return checkpoint.restore(d, like, step=checkpoint.steps(d)[0], devices=devs)[0]


def _half_precision(d, like, devs):             # restores into another dtype
    cast = jax.tree.map(lambda x: x.astype(jnp.float16) if x.dtype == jnp.float32 else x, like)
    return checkpoint.restore(d, cast, devices=devs)[0]


def _params_only(d, like, devs):                # drops part of what the checkpoint held
    return checkpoint.restore(d, like, devices=devs)[0]["params"]


def _orbax_without_target(d, like, devs):       # where it was saved
    with ocp.CheckpointManager(d) as manager:
        return manager.restore(manager.latest_step())["state"]


def _one_device(d, like, devs):                 # only one of the devices given
    return checkpoint.restore(d, like, devices=devs[:1])[0]


def _restore_on_all_then_move(d, like, devs):   # placement asked for, but onto other devices
    return jax.device_put(checkpoint.restore(d, like, devices=jax.devices())[0], checkpoint.replicated_on(devs))


def _orbax_then_move(d, like, devs):            # Orbax's own restore, then moved
    with ocp.CheckpointManager(d) as manager:
        return jax.device_put(manager.restore(manager.latest_step())["state"], checkpoint.replicated_on(devs))


WRONG = {
    "restored onto all devices, then moved": (_restore_on_all_then_move,
                                              "whole on devices [0, 1, 2, 3, 4, 5, 6, 7] (you return it"),
    "Orbax, then moved": (_orbax_then_move, "moved afterwards"),
    "returns (state, extra)": (_both, "return only the state"),
    "no devices: where like lives": (_where_like_lives, "Pass the devices to the restore"),
    "the first n devices": (_first_devices, "the first 4 device(s), not the ones you were given"),
    "restored, then moved": (_restore_then_move, "Pass devices= to checkpoint.restore"),
    "like moved, not restored": (_like_moved, "restore the checkpoint, not like="),
    "an older step": (_oldest_step, "restore the newest step in the directory"),
    "float16 target": (_half_precision, "float16"),
    "only the params": (_params_only, "expected dict{'params'"),
    "Orbax with no target": (_orbax_without_target, "the devices it was saved from"),
    "one device of those given": (_one_device, "whole on devices [5, 2, 6, 1], got on device 5"),
}


@pytest.mark.parametrize("mistake", list(WRONG))
def test_wrong_answer_fails_and_names_the_mistake(mistake):
    answer, named = WRONG[mistake]
    feedback = check("11.1", answer)
    assert not feedback, mistake
    assert named in feedback.message, (mistake, feedback.message)


def _unpacked(directory, like, devices):
    state, _extra = checkpoint.restore(directory, like, devices=list(devices))
    return state


def _by_sharding(directory, like, devices):
    return checkpoint.restore(directory, like, sharding=NamedSharding(
        jax.sharding.Mesh(list(devices), ("d",)), P()))[0]


def _newest_by_number(directory, like, devices):
    return checkpoint.restore(directory, like, step=max(checkpoint.steps(directory)), devices=tuple(devices))[0]


@pytest.mark.parametrize("answer", [_unpacked, _by_sharding, _newest_by_number])
def test_right_answers_written_otherwise_pass(answer):
    feedback = check("11.1", answer)
    assert feedback, feedback.message


# ---- Fresh answers (issue 44), written as learners would: each wrong one fails with what differs (or its mistake,
# where the numbers confirm it); each right one in another form passes.

FRESH = [
    ("onto all devices", lambda d, like, devs: checkpoint.restore(d, like, devices=jax.devices())[0],
     "expected whole on devices [5, 2, 6, 1], got whole on devices [0, 1, 2, 3, 4, 5, 6, 7]."),
    ("the extra dict only", lambda d, like, devs: checkpoint.restore(d, like, devices=devs)[1], "got dict{'position'"),
    ("cast to float32", lambda d, like, devs: jax.tree.map(lambda a: a.astype(jnp.float32), checkpoint.restore(
        d, like, devices=devs)[0]), "dtype float32 where bfloat16 was expected"),
    ("returns None", lambda d, like, devs: None, "returned None: did it forget"),
]


from fooling import fresh_test as _fresh_test  # noqa: E402

test_a_fresh_answer_gets_what_differs = _fresh_test('11.1', FRESH)
