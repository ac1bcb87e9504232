"""Exercise 12.2 (gather one layer, FSDP-style in shard_map) against answers that try to fool it.

The checker runs each answer on 8, 4 and 2 devices, with per-element values, inside a checkpointed scan, and reads
the compiled program. Wrong answers must fail with feedback that names their mistake; right answers written another
way must pass.
"""

import jax
import jax.numpy as jnp
import pytest

from course_lib.exercises import check


def gather_axis_0(layer):
    return jax.tree.map(lambda w: jax.lax.all_gather(w, "data", axis=0, tiled=True), layer)


def not_tiled(layer):
    return jax.tree.map(lambda w: jax.lax.all_gather(w, "data", axis=w.ndim - 1), layer)


def gradient_stopped(layer):
    return jax.tree.map(lambda w: jax.lax.stop_gradient(jax.lax.all_gather(w, "data", axis=-1, tiled=True)), layer)


def by_psum(layer):                      # the right values, but an all-reduce of the whole leaf
    def whole(w):
        n, i = jax.lax.axis_size("data"), jax.lax.axis_index("data")
        full = jnp.zeros(w.shape[:-1] + (n * w.shape[-1],), w.dtype)
        return jax.lax.psum(jax.lax.dynamic_update_slice_in_dim(full, w, i * w.shape[-1], axis=w.ndim - 1), "data")
    return jax.tree.map(whole, layer)


def eight_written_in(layer):             # right on 8 devices only
    def whole(w):
        slices = jax.lax.all_gather(w, "data")
        return jnp.moveaxis(slices, 0, -2).reshape(w.shape[:-1] + (8 * w.shape[-1],))
    return jax.tree.map(whole, layer)


def reversed_slices(layer):
    return jax.tree.map(lambda w: jnp.concatenate(list(jax.lax.all_gather(w, "data")[::-1]), axis=-1), layer)


def in_bfloat16(layer):
    return jax.tree.map(lambda w: jax.lax.all_gather(w.astype(jnp.bfloat16), "data", axis=-1, tiled=True), layer)


def matrices_only(layer):
    return {k: jax.lax.all_gather(w, "data", axis=1, tiled=True) if w.ndim == 2 else w for k, w in layer.items()}


def gathered_invarying(layer):           # right values; its transpose is an all-reduce
    return jax.tree.map(lambda w: jax.lax.all_gather(w, "data", axis=w.ndim - 1, tiled=True, to="invarying"), layer)


WRONG = [
    (gather_axis_0, "whole leaf"),
    (not_tiled, "stacked along a new axis"),
    (gradient_stopped, "all zeros"),
    (by_psum, "no all-gather"),
    (eight_written_in, "assumes a number of devices"),
    (reversed_slices, "in device order"),
    (in_bfloat16, "bfloat16"),
    (matrices_only, "the shape of this device's slice"),
    (gathered_invarying, 'to="invarying"'),
]


@pytest.mark.parametrize("answer, named", WRONG, ids=[a.__name__ for a, _ in WRONG])
def test_wrong_answer_fails_and_is_named(answer, named):
    feedback = check("12.2", answer)
    assert not feedback, feedback.message
    assert named in feedback.message, feedback.message


def stacked_then_joined(layer):
    def whole(w):
        slices = jax.lax.all_gather(w, "data", axis=w.ndim - 1)        # (..., n, size): a new axis before the last
        return slices.reshape(w.shape[:-1] + (jax.lax.axis_size("data") * w.shape[-1],))
    return jax.tree.map(whole, layer)


def negative_axis(layer):
    return {name: jax.lax.all_gather(w, axis_name="data", axis=-1, tiled=True) for name, w in layer.items()}


@pytest.mark.parametrize("answer", [stacked_then_joined, negative_axis])
def test_right_answers_written_another_way_pass(answer):
    feedback = check("12.2", answer)
    assert feedback, feedback.message


def by_reshard(layer):                   # sharded jit's gather, written inside shard_map: returns the slice
    return jax.tree.map(lambda w: jax.reshard(w, jax.sharding.PartitionSpec()), layer)


def test_reshard_inside_shard_map_is_named():
    feedback = check("12.2", by_reshard)
    assert not feedback, feedback.message
    assert "the shape of this device's slice" in feedback.message and "jax.reshard" in feedback.message
    assert "does not, there" in feedback.message, feedback.message


def test_success_gives_no_counts_away():          # 12.3 asks for these counts
    from course_lib.exercises.lesson12 import solution_gather_layer
    feedback = check("12.2", solution_gather_layer)
    assert feedback, feedback.message
    assert not any(ch.isdigit() for ch in feedback.message), feedback.message


# ---- Fresh answers (issue 44), written as learners would: each wrong one fails with what differs (or its mistake,
# where the numbers confirm it); each right one in another form passes.

FRESH = [
    ("only w_in gathered", lambda l: {**l, "w_in": jax.lax.all_gather(l["w_in"], "data", axis=-1, tiled=True)},
     "the shape of this device's slice"),
    ("axis 1 for every leaf", lambda l: jax.tree.map(lambda w: jax.lax.all_gather(w, "data", axis=1, tiled=True), l),
     "axis 1 is out of bounds"),
    ("returns None", lambda l: None, "returned None: did it forget"),
    ("times 1.0", lambda l: jax.tree.map(lambda w: 1.0 * jax.lax.all_gather(w, "data", axis=-1, tiled=True), l),
     None),
]


from fooling import fresh_test as _fresh_test  # noqa: E402

test_a_fresh_answer_gets_what_differs = _fresh_test('12.2', FRESH)
