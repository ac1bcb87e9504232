"""Exercise 11.2 (the collectives' share of the devices' busy time): wrong answers fail naming the mistake; right
answers written differently pass."""

import numpy as np
import pytest

from course_lib import profile
from course_lib.exercises import check
from course_lib.exercises.lesson11 import solution_collective_fraction


def _totals(t):
    s = profile.summarise(t)
    return sum(v["collective_us"] for v in s.values()), sum(v["busy_us"] for v in s.values())


def _sort_in_place(t):
    t.ops.sort(key=lambda o: o.dur_us)
    return solution_collective_fraction(t)


WRONG = {
    "share of compute": (lambda t: 1 - solution_collective_fraction(t), "share of compute"),
    "whole trace, gaps included": (lambda t: _totals(t)[0] / (len(t.devices) * (
        max(o.end_us for o in t.ops) - min(o.start_us for o in t.ops))), "idle gaps"),
    "a percentage": (lambda t: 100 * solution_collective_fraction(t), "is a percentage"),
    "over compute time": (lambda t: _totals(t)[0] / sum(v["compute_us"] for v in profile.summarise(t).values()),
                          "divides the collectives' time by the compute time"),
    "device 0 alone": (lambda t: profile.summarise(t)[0]["collective_us"] / profile.summarise(t)[0]["busy_us"],
                       "share of device 0 alone"),
    "mean of the devices' shares": (lambda t: np.mean([v["collective_us"] / v["busy_us"]
                                                       for v in profile.summarise(t).values()]),
                                    "averages the devices' own fractions"),
    "counts ops, not time": (lambda t: sum(o.collective for o in t.ops) / len(t.ops), "counted"),
    "calls the library": (lambda t: profile.collective_fraction(t), "calls profile.collective_fraction"),
    "a formatted string": (lambda t: f"{solution_collective_fraction(t):.1%}", "got str '32.2%'"),
    "sorts the trace in place": (_sort_in_place, "changed the trace it was given in place (ops)"),
    "half precision": (lambda t: np.float16(solution_collective_fraction(t)), "float16"),
    "adds up op durations": (lambda t: sum(o.dur_us for o in t.ops if o.collective) / sum(o.dur_us for o in t.ops),
                             "adds up op durations"),
    "each device's first-to-last span": (lambda t: _totals(t)[0] / sum(
        runs[-1].end_us - runs[0].start_us for runs in t.dispatches.values()), "idle gaps"),
    "busy plus the median gap per dispatch": (lambda t: _totals(t)[0] / sum(
        v["busy_us"] + v["gap_us"] * v["dispatches"] for v in profile.summarise(t).values()), "idle gaps"),
}


@pytest.mark.parametrize("mistake", list(WRONG))
def test_wrong_answer_fails_and_names_the_mistake(mistake):
    answer, named = WRONG[mistake]
    feedback = check("11.2", answer)
    assert not feedback, mistake
    assert named in feedback.message, (mistake, feedback.message)


def _from_dispatches(trace):
    runs = [r for per_device in trace.dispatches.values() for r in per_device]
    return sum(r.collective_us for r in runs) / sum(r.dur_us for r in runs)


def _one_minus_compute(trace):
    per_device = profile.summarise(trace).values()
    return 1.0 - sum(v["compute_us"] for v in per_device) / sum(v["busy_us"] for v in per_device)


def _collective_ops_over_dispatch_spans(trace):     # collectives do not nest inside one another
    durations = np.array([o.dur_us for o in trace.ops])
    collective = np.array([o.collective for o in trace.ops])
    spans = sum(r.end_us - r.start_us for runs in trace.dispatches.values() for r in runs)
    return float(durations[collective].sum() / spans)


@pytest.mark.parametrize("answer", [_from_dispatches, _one_minus_compute, _collective_ops_over_dispatch_spans])
def test_right_answers_written_otherwise_pass(answer):
    feedback = check("11.2", answer)
    assert feedback, feedback.message


# ---- Fresh answers (issue 44), written as learners would: each wrong one fails with what differs (or its mistake,
# where the numbers confirm it); each right one in another form passes.

import numpy as _np  # noqa: E402

FRESH = [
    ("rounded to 2 decimals", lambda t: round(solution_collective_fraction(t), 2), "rounded to 2 decimals"),
    ("returns None", lambda t: None, "returned None: did it forget"),
    ("a NumPy float32", lambda t: _np.float32(solution_collective_fraction(t)), None),
]


from fooling import fresh_test as _fresh_test  # noqa: E402

test_a_fresh_answer_gets_what_differs = _fresh_test('11.2', FRESH)
