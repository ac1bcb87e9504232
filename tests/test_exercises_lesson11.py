"""Lesson 11 checkers: the reference passes; typical mistakes get feedback that names them."""

import jax

from course_lib import checkpoint, profile
from course_lib.exercises import check, lesson11
from course_lib.exercises.lesson11 import (solution_collective_fraction, solution_restore_onto,
                                           solution_stalled_step)


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
    assert not wrong_structure and "saved structure" in wrong_structure.message


def test_11_2_collective_fraction():
    assert check("11.2", solution_collective_fraction)
    compute = check("11.2", lambda t: 1 - solution_collective_fraction(t))
    assert "share of compute" in compute.message
    whole_trace = check("11.2", lambda t: sum(v["collective_us"] for v in profile.summarise(t).values()) / (
        len(t.devices) * (max(o.end_us for o in t.ops) - min(o.start_us for o in t.ops))))
    assert "idle gaps" in whole_trace.message
    a_dict = check("11.2", lambda t: profile.summarise(t))
    assert "one number between 0 and 1" in a_dict.message
    raising = check("11.2", lambda t: t.nope)
    assert "raised AttributeError" in raising.message


def test_11_3_stalled_step():
    assert check("11.3", solution_stalled_step)
    position = check("11.3", lambda t: max(range(len(t.markers)), key=lambda i: t.markers[i].dur_us))
    assert "position in the list" in position.message
    marker = check("11.3", lambda t: max(t.markers, key=lambda m: m.dur_us))
    assert "should return a step number" in marker.message
    raising = check("11.3", lambda t: t.markers[99])
    assert "raised IndexError" in raising.message
    first = check("11.3", lambda t: t.markers[0].step)
    assert "the longest step is step" in first.message


def test_every_exercise_has_at_least_two_hints():
    assert set(lesson11.HINTS) == {"11.1", "11.2", "11.3"}
    assert all(len(h) >= 2 and all(isinstance(s, str) and s for s in h) for h in lesson11.HINTS.values())


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
