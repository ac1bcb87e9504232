"""Lesson 09 exercises: the cost of a dispatch spread over fused steps, predicted and fitted.

Neither checker times anything: they check the formula and the fit on numbers they make up,
so they give the same verdict on any machine, however noisy its timings.
"""

import numpy as np

from . import Case, Mistake, call, diagnose, exercise


_AT_K1 = {"division by zero": "At k = 1 your formula divides by zero; there one dispatch runs one step, which "
                              "carries the whole dispatch cost: k steps share one dispatch."}


def _rounded(fn):
    """Three mistakes: the right result of ``fn``, each number rounded to 0, 1 or 2 decimals."""
    def rounded(r, p):
        return tuple(np.round(r, p).tolist()) if isinstance(r, tuple) else round(r, p)
    return [Mistake(f"rounded to {p}", f"That is the right result rounded to {p} decimal place{'s' * (p != 1)}: "
                    "return it unrounded (round only what you print).", lambda *a, p=p: rounded(fn(*a), p))
            for p in (0, 1, 2)]

# ----------------------------------------------------------------------------------------------
# 09.1 Predict the time per step from the steps per dispatch


def solution_ms_per_step(dispatch_ms, step_ms, k):
    return dispatch_ms / k + step_ms


_GROWS = ("that grows with k. One dispatch now carries k steps, so each step carries a smaller share of the "
          "dispatch's cost as k grows.")
MISTAKES_09_1 = [
    Mistake("work shared too", "The step's own work was divided by k too. Fusing removes dispatches, not work: "
            "only the dispatch cost is shared by the k steps.", lambda d, s, k: (d + s) / k),
    Mistake("dispatch only", "Only the dispatch is counted. Each step still does its own work, whatever k is: "
            "where is it in your formula?", lambda d, s, k: d / k),
    Mistake("dispatch times k", "The dispatch is multiplied by k: " + _GROWS, lambda d, s, k: d * k + s),
    Mistake("work times k", "The step's work is multiplied by k: " + _GROWS, lambda d, s, k: d + k * s),
    Mistake("costs swapped", "The two costs are swapped. Your formula shares the step's own work among the k "
            "steps and charges every step the whole dispatch.", lambda d, s, k: d + s / k),
    Mistake("work times k, dispatch shared", "The step's own work is multiplied by k, so the time per step grows "
            "with k. That is the time of the whole dispatch's work, not of one step.", lambda d, s, k: d / k + s * k),
    Mistake("floor division", "Floor division (//) dropped the fraction of the dispatch's share: a share of a "
            "millisecond is a fraction, so divide with /.", lambda d, s, k: d // k + s),
    Mistake("shared by k - 1", "The dispatch is shared by k - 1 steps (at least 1); one dispatch runs k steps, "
            "so each step carries 1/k of it.", lambda d, s, k: d / max(k - 1, 1) + s),
    Mistake("k ignored", "k has no effect. The fixed cost is paid once per dispatch, and one dispatch now runs "
            "k steps.", lambda d, s, k: d + s),
    *_rounded(solution_ms_per_step),
]


@exercise("09.1", "Predict the time per step when K steps share one dispatch", solution=solution_ms_per_step,
          returns="one number: the predicted milliseconds per step, with the dispatch cost shared by k steps",
          hints=["Count what one dispatch of k fused steps costs in total, then share that total among the k steps. "
                 "Which part is paid once, and which part k times?",
                 "Lesson 09, section 2: the fixed cost per dispatch is spread over the k steps of one lax.scan; "
                 "each step's own work is not.",
                 "Check your formula against the mechanism, section 2's sweep: at k = 1 it must give the time of "
                 "one unfused step, and as k grows it must flatten towards a floor. Which of the two costs is that "
                 "floor, and which one fades?"])
def check_ms_per_step(ms_per_step):
    # results that are no whole number of hundredths or thousandths, so that a rounded answer shows
    cases = [Case((d, s, k), f"ms_per_step(dispatch_ms={d}, step_ms={s}, k={k})")
             for d, s, k in [(0.5, 0.1, 1), (0.7, 0.13, 3), (2.0, 0.031, 7), (1.3, 0.4172, 6), (0.0, 0.2, 7),
                             (0.9, 0.05, 11)]]
    diagnose(ms_per_step, cases, solution=solution_ms_per_step, mistakes=MISTAKES_09_1, rtol=1e-6, atol=1e-9,
             run=lambda fn, case: call(fn, *case.args, name="ms_per_step", hints=_AT_K1 if case.args[2] == 1 else None))
    return "the dispatch cost fades as 1/k; what is left is the step's own work, which fusing cannot remove."


# ----------------------------------------------------------------------------------------------
# 09.2 Fit the dispatch cost and the step cost to measured times


def solution_fit_dispatch_and_step(ks, ms):
    ks, ms = np.asarray(ks, float), np.asarray(ms, float)
    dispatch_ms, step_ms = np.polyfit(1.0 / ks, ms, 1)   # ms = dispatch_ms * (1 / k) + step_ms
    return float(dispatch_ms), float(step_ms)


MISTAKES_09_2 = [
    Mistake("swapped", "Swapped. The slope against 1/k is the dispatch cost, the intercept the step cost: return "
            "(dispatch_ms, step_ms).", lambda ks, ms: solution_fit_dispatch_and_step(ks, ms)[::-1]),
    *[Mistake(name + swapped, feedback + (" The pair is swapped too." if swapped else ""),
              lambda ks, ms, fit=fit, swapped=swapped: tuple(fit(np.asarray(ks, float), np.asarray(ms, float)))[
                  ::-1 if swapped else 1])
      for name, feedback, fit in [
          ("line in k", "That is a straight line fitted in k itself; the model of 09.1 is not linear in k. Look "
           "again at how k enters that formula.", lambda ks, ms: np.polyfit(ks, ms, 1)),
          ("time per dispatch against k", "That is a least-squares fit of the time per dispatch (k times ms) "
           "against k. That fits other errors: the point at the largest k weighs far more than the point at "
           "k = 1. Fit the times per step, ms, as measured.", lambda ks, ms: np.polyfit(ks, ks * ms, 1)[::-1]),
          ("smallest and largest k", "That line runs through two points, at the smallest and the largest k; a "
           "least-squares fit uses every point, so the noise of each one weighs less.",
           lambda ks, ms: (lambda e: np.polyfit(1 / ks[e], ms[e], 1))([ks.argmin(), ks.argmax()]))]
      for swapped in ("", ", swapped")],
    *_rounded(solution_fit_dispatch_and_step),
]


@exercise("09.2", "Fit the dispatch cost and the step cost to measured times", solution=solution_fit_dispatch_and_step,
          returns="a pair of floats (dispatch_ms, step_ms), the least-squares fit of ms = dispatch_ms / k + step_ms",
          hints=["The model is not a straight line in k. Is there a quantity derived from k in which it is one?",
                 "A least-squares straight-line fit: np.polyfit with degree 1 (or np.linalg.lstsq). Exercise 09.1's "
                 "formula says what to put on the horizontal axis.",
                 "Plot section 2's measured times against your chosen variable: the model says the points lie on "
                 "a straight line. Which feature of that line is the cost of a dispatch, and which the cost of a "
                 "step? Check the fit against every point, not two."])
def check_fit_dispatch_and_step(fit_dispatch_and_step):
    cases = []           # timings made up from the model, with noise; ks of other values, lengths, orders, repeats
    for ks, dispatch, step, noise, seed in [([1, 2, 5, 10, 25], 0.6, 0.12, 0.0, 0), ([3, 1, 8, 4], 1.5, 0.05, 0.03, 1),
                                            ([2, 16, 6, 2, 40, 12, 2, 1], 0.3, 0.9, 0.05, 2)]:
        ms = (dispatch / np.asarray(ks, float) + step) * (1 + noise * np.random.default_rng(seed).normal(size=len(ks)))
        cases.append(Case((list(ks), ms), f"fit_dispatch_and_step(ks={ks}, ms=[{', '.join(f'{m:.3f}' for m in ms)}])"))
    diagnose(fit_dispatch_and_step, cases, solution=solution_fit_dispatch_and_step, mistakes=MISTAKES_09_2,
             name="fit_dispatch_and_step", rtol=1e-3, atol=1e-6)
    return "a straight line in 1 / k: the slope is the cost of a dispatch, the intercept the cost of a step."
