"""Exercise 10.3 (choose K from the compiled step's peak): answers that try to fool the checker."""

import jax

from course_lib import sharded_state
from fooling import fool_tests

ID = "10.3"


def parts(make_step, state, batch, k):
    m = make_step(k).compile(state, batch).memory_analysis()
    return {"arguments": m.argument_size_in_bytes, "outputs": m.output_size_in_bytes,
            "aliased": m.alias_size_in_bytes, "temporaries": m.temp_size_in_bytes,
            "xla": m.peak_memory_in_bytes}


def peak(p):
    return p["arguments"] + p["outputs"] - p["aliased"] + p["temporaries"]


def per_device(batch, n):
    return jax.tree.leaves(batch)[0].shape[0] // n


def search(measure=peak, order=None, fits=lambda need, budget: need <= budget, candidates=None):
    def choose_k(make_step, state, batch, n, budget):
        b = per_device(batch, n)
        ks = candidates(batch, n) if candidates else [k for k in range(1, b + 1) if b % k == 0]
        for k in (order(ks) if order else ks):
            if fits(measure(parts(make_step, state, batch, k)), budget):
                return k
        return None
    return choose_k


WRONG = [
    ("temporaries only", search(lambda p: p["temporaries"]), "counted only the temporaries"),
    ("XLA's peak field", search(lambda p: p["xla"]), "peak_memory_in_bytes"),
    ("outputs counted twice", search(lambda p: p["arguments"] + p["outputs"] + p["temporaries"]),
     "subtract the aliased bytes"),
    ("strictly below the budget", search(fits=lambda need, budget: need < budget), "needs exactly the budget"),
    ("the largest K that fits", search(order=lambda ks: ks[::-1]), "take the smallest K that fits"),
    ("powers of two only", search(candidates=lambda batch, n: [k for k in (1, 2, 4, 8, 16)
                                                               if per_device(batch, n) % k == 0]),
     "(a divisor of the 6 examples per device) fits"),
    ("K from the global batch", search(candidates=lambda batch, n: [k for k in range(1, 2 * n + 1)
                                                                    if jax.tree.leaves(batch)[0].shape[0] % k == 0]),
     "must divide each device's examples"),
    ("a guess, no compile", lambda make_step, state, batch, n, budget: 1, "without building a single step"),
    ("a float", lambda make_step, state, batch, n, budget: float(search()(make_step, state, batch, n, budget) or 0),
     "expected None, got 0"),
]


def via_compiled_memory(make_step, state, batch, n, budget):
    b = per_device(batch, n)
    fitting = [k for k in range(1, b + 1) if b % k == 0
               and sharded_state.compiled_memory(make_step(k), state, batch)["peak"] <= budget]
    return min(fitting) if fitting else None


def falls_with_k(make_step, state, batch, n, budget):      # assumes the peak falls as K grows
    b = per_device(batch, n)
    fit = None
    for k in [k for k in range(1, b + 1) if b % k == 0][::-1]:
        if peak(parts(make_step, state, batch, k)) > budget:
            break
        fit = k
    return fit


WRONG.append(("assumes the peak falls as K grows", falls_with_k, "assumes the peak falls steadily"))
RIGHT = [("compiled_memory, min of the fitting", via_compiled_memory),
         ("memory_analysis, a while loop", search())]


verdict, test_a_wrong_answer_fails_and_its_feedback_names_the_mistake, \
    test_a_right_answer_written_another_way_passes = fool_tests(ID, WRONG, RIGHT)


# ---- Fresh answers (issue 44), written as learners would: each wrong one fails with what differs (or its mistake,
# where the numbers confirm it); each right one in another form passes.

from course_lib.exercises.lesson10 import solution_choose_k as _k  # noqa: E402

FRESH = [
    ("the budget back", lambda m, s, b, n, budget: budget, "without building a single step"),
    ("one K less", lambda *a: None if _k(*a) is None else max(_k(*a) - 1, 1), "expected 3, got 2"),
    ("K as a float", lambda *a: None if _k(*a) is None else float(_k(*a)), None),
]


from fooling import fresh_test as _fresh_test  # noqa: E402

test_a_fresh_answer_gets_what_differs = _fresh_test('10.3', FRESH)
