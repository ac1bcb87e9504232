"""Exercise 11.3 (the step that stalled): wrong answers fail naming the mistake; right answers written differently
pass."""

import jax.numpy as jnp
import numpy as np
import pytest

from course_lib.exercises import check


def _sorts_in_place(t):
    t.markers.sort(key=lambda m: m.dur_us)
    return t.markers[-1].step


def _gap_to_next_start(t):
    marks = t.markers
    return max(zip(marks, marks[1:]), key=lambda pair: pair[1].start_us - pair[0].start_us)[0].step


def _longest_dispatch_on_device_0(t):          # reads the devices, not the host's step marks
    runs = t.dispatches[0]
    return t.markers[0].step + int(np.argmax([r.dur_us for r in runs]))


def _longest_dispatch_over_devices(t):
    total = np.sum([[r.dur_us for r in runs] for runs in t.dispatches.values()], axis=0)
    return t.markers[int(np.argmax(total))].step


WRONG = {
    "longest dispatch on device 0": (_longest_dispatch_on_device_0, "the stall is on the host"),
    "longest dispatch over the devices": (_longest_dispatch_over_devices, "the stall is on the host"),
    "position in the list": (lambda t: max(range(len(t.markers)), key=lambda i: t.markers[i].dur_us),
                             "position in the list"),
    "the marker itself": (lambda t: max(t.markers, key=lambda m: m.dur_us), "(Marker), not a step number"),
    "the shortest step": (lambda t: min(t.markers, key=lambda m: m.dur_us).step, "the shortest step"),
    "the first step": (lambda t: t.markers[0].step, "the first step's number"),
    "sorted in place": (_sorts_in_place, "changed the trace it was given in place (markers)"),
    "gap to the next start": (_gap_to_next_start, "the last step has no next one"),
    "a bool": (lambda t: t.markers[0].step > 0, "True (bool), not a step number"),
    "one after": (lambda t: max(t.markers, key=lambda m: m.dur_us).step + 1, "the step after the stalled one"),
    "one before": (lambda t: max(t.markers, key=lambda m: m.dur_us).step - 1, "the step before the stalled one"),
}


@pytest.mark.parametrize("mistake", list(WRONG))
def test_wrong_answer_fails_and_names_the_mistake(mistake):
    answer, named = WRONG[mistake]
    feedback = check("11.3", answer)
    assert not feedback, mistake
    assert named in feedback.message, (mistake, feedback.message)


def _argmax(trace):
    durations = np.array([m.dur_us for m in trace.markers])
    return trace.markers[int(np.argmax(durations))].step


def _sorted_copy(trace):
    return sorted(trace.markers, key=lambda m: m.dur_us)[-1].step


def _loop(trace):
    best = None
    for marker in trace.markers:
        if best is None or marker.dur_us > best.dur_us:
            best = marker
    return best.step


@pytest.mark.parametrize("answer", [_argmax, _sorted_copy, _loop])
def test_right_answers_written_otherwise_pass(answer):
    feedback = check("11.3", answer)
    assert feedback, feedback.message


# ---- Fresh answers (issue 44), written as learners would: each wrong one fails with what differs (or its mistake,
# where the numbers confirm it); each right one in another form passes.

import numpy as _np  # noqa: E402
from course_lib.exercises.lesson11 import solution_stalled_step as _stalled  # noqa: E402

FRESH = [
    ("the longest duration, not its step", lambda t: max(m.dur_us for m in t.markers), "step 5000 (which no marker"),
    ("the step as text", lambda t: str(_stalled(t)), "got '103' (str)"),
    ("the latest start", lambda t: max(t.markers, key=lambda m: m.start_us).step, "That is the last step's number"),
    ("the third marker", lambda t: t.markers[2].step, "marker 3 of 8, which lasted"),
    ("returns None", lambda t: None, "returned None: did it forget"),
    ("a NumPy integer", lambda t: _np.int64(_stalled(t)), None),
]


from fooling import fresh_test as _fresh_test  # noqa: E402

test_a_fresh_answer_gets_what_differs = _fresh_test('11.3', FRESH)
