"""Exercise 05.2 (how far apart are the copies): the checker's copies differ per device AND per element, so the
usual wrong readings (spread, neighbouring differences, a mean, a signed maximum, the wrong reference copy, some
leaves, devices or elements only, a lower precision, the global array) each give another number and are named."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from course_lib.exercises import check


def copies_of(leaf):
    return np.stack([np.asarray(s.data[0]) for s in leaf.addressable_shards])    # (n, ...), on the host


def over_leaves(per_leaf):
    return lambda tree: max(float(per_leaf(copies_of(leaf))) for leaf in jax.tree.leaves(tree))


WRONG = [
    (over_leaves(lambda c: np.max(np.ptp(c, axis=0))), ["the spread of the copies"]),
    (over_leaves(lambda c: np.max(np.abs(np.diff(c, axis=0)))), ["neighbouring devices"]),
    (over_leaves(lambda c: np.mean(np.abs(c - c[0]))), ["where the largest difference is asked"]),
    (over_leaves(lambda c: np.max(c - c[0])), ["the largest signed difference"]),
    (over_leaves(lambda c: np.max(np.abs(c - c[0]) / (np.abs(c[0]) + 1e-12))), ["a relative difference"]),
    (over_leaves(lambda c: np.max(np.abs(c - c[-1]))), ["the LAST device's copy"]),
    (over_leaves(lambda c: np.max(np.abs(c[1] - c[0]))), ["only the second device's copy"]),
    (over_leaves(lambda c: np.max(np.abs(c.reshape(len(c), -1)[:, 0] - c.reshape(len(c), -1)[0, 0]))),
     ["only the first element of each leaf"]),
    (lambda tree: float(np.max(np.abs(copies_of(jax.tree.leaves(tree)[0]) - copies_of(jax.tree.leaves(tree)[0])[0]))),
     ["only the first leaf"]),
    (lambda tree: max(float(jnp.max(jnp.abs(leaf - leaf[0]))) for leaf in jax.tree.leaves(tree)),
     ["the value is right, but it was computed from the global view"]),
    (over_leaves(lambda c: np.max(np.abs(c.astype(np.float16) - c[0].astype(np.float16)))),
     ["or to float16 precision"]),
    (lambda tree: max(float(np.max(np.abs(np.asarray(v) - np.asarray(v)[0]))) for v in jax.tree.leaves(tree)),
     ["the value is right, but it read a whole leaf", "on the host"]),                  # a host gather
    (lambda tree: max(float(np.max(np.abs(c - c[0]))) for c in jax.tree.leaves(jax.device_get(tree))),
     ["the value is right, but it read a whole leaf", "on the host"]),
    (lambda tree: max(float(np.max(np.abs(c - c[0]))) for c in (
        np.asarray(jax.pmap(lambda x: jax.lax.all_gather(x, "i"), axis_name="i",
                            devices=sorted(v.devices(), key=lambda d: d.id))(v).addressable_shards[0].data[0])
        for v in jax.tree.leaves(tree))), ["the value is right, but it ran a collective (all_gather)"]),
    (lambda tree: np.float16(max(float(np.max(np.abs(c - c[0]))) for c in map(copies_of, jax.tree.leaves(tree)))),
     ["dtype float16 where a Python float was expected"]),
]


@pytest.mark.parametrize("answer, named", WRONG, ids=[f"wrong{i}" for i in range(len(WRONG))])
def test_wrong_answer_fails_and_the_feedback_names_the_mistake(answer, named):
    fb = check("05.2", answer)
    assert not fb, fb.message
    for words in named:
        assert words in fb.message, fb.message
    assert "addressable_shards" not in fb.message, "the fix is left to hint()"


def device_get_each(tree):              # jax.device_get of each shard, one leaf at a time
    worst = 0.0
    for leaf in jax.tree.leaves(tree):
        shards = sorted(leaf.addressable_shards, key=lambda s: s.index[0].start or 0)
        first = jax.device_get(shards[0].data)
        for s in shards[1:]:
            worst = max(worst, float(np.abs(jax.device_get(s.data) - first).max()))
    return worst


def flattened(tree):                    # every leaf as (n, -1), one big comparison
    blocks = [copies_of(leaf).reshape(len(leaf.addressable_shards), -1) for leaf in jax.tree.leaves(tree)]
    return float(max(np.abs(b - b[0]).max() for b in blocks))


@pytest.mark.parametrize("answer", [device_get_each, flattened])
def test_right_answers_written_differently_pass(answer):
    fb = check("05.2", answer)
    assert fb, fb.message
