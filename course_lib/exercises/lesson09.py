"""Lesson 09 exercises: the cost of a dispatch spread over fused steps, predicted and fitted.

Neither checker times anything: they check the formula and the fit on numbers they make up,
so they give the same verdict on any machine, however noisy its timings.
"""

import numpy as np

from . import Mismatch, call, describe_tree, exercise, expect_scalar


def _narrow_dtype(got, what):
    """Feedback for an answer computed in a low-precision float: name the dtype, not a wrong value."""
    dtype = getattr(got, "dtype", None)
    if dtype is not None and str(dtype) in ("float16", "bfloat16"):
        raise Mismatch(f"{what} came back as {dtype}, which keeps only about 3 significant digits: compute in "
                       "float32 or float64 (or plain Python floats), then compare again.")


# ----------------------------------------------------------------------------------------------
# 09.1 Predict the time per step from the steps per dispatch


def solution_ms_per_step(dispatch_ms, step_ms, k):
    return dispatch_ms / k + step_ms


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
    for dispatch, step, k in [(0.5, 0.1, 1), (0.7, 0.13, 3), (2.0, 0.031, 7), (1.3, 0.4172, 6), (0.0, 0.2, 7),
                              (0.9, 0.05, 11)]:
        what = f"ms_per_step(dispatch_ms={dispatch}, step_ms={step}, k={k})"
        raw = call(ms_per_step, dispatch, step, k, name="ms_per_step")
        _narrow_dtype(raw, what)
        got = expect_scalar(raw, what=what)
        want = dispatch / k + step
        if np.isclose(got, want, rtol=1e-6):
            continue
        if np.isclose(got, (dispatch + step) / k, rtol=1e-6):
            raise Mismatch(f"{what} = {got:.4g}: the step's own work was divided by k too. Fusing removes "
                           "dispatches, not work: only the dispatch cost is shared by the k steps.")
        if np.isclose(got, dispatch / k, rtol=1e-6):
            raise Mismatch(f"{what} = {got:.4g}: only the dispatch is counted. Each step still does its own "
                           "work, whatever k is: where is it in your formula?")
        if np.isclose(got, dispatch * k + step, rtol=1e-6) or np.isclose(got, dispatch + k * step, rtol=1e-6):
            raise Mismatch(f"{what} = {got:.4g}: that grows with k. One dispatch now carries k steps, so each step "
                           "carries a smaller share of the dispatch's cost as k grows.")
        if k > 1 and np.isclose(got, dispatch + step / k, rtol=1e-6):
            raise Mismatch(f"{what} = {got:.4g}: the two costs are swapped. Your formula shares the step's own "
                           "work among the k steps and charges every step the whole dispatch.")
        if k > 1 and np.isclose(got, dispatch / k + step * k, rtol=1e-6):
            raise Mismatch(f"{what} = {got:.4g}: the step's own work is multiplied by k, so the time per step "
                           "grows with k. That is the time of the whole dispatch's work, not of one step.")
        if np.isclose(got, dispatch // k + step, rtol=1e-6) or np.isclose(got, dispatch // k + step // 1, rtol=1e-6):
            raise Mismatch(f"{what} = {got:.4g}; expected {want:.4g}. Floor division (//) dropped the fraction of "
                           "the dispatch's share: a share of a millisecond is a fraction, so divide with /.")
        if np.isclose(got, dispatch + step, rtol=1e-6):
            raise Mismatch(f"{what} = {got:.4g}: k has no effect. The fixed cost is paid once per dispatch, and "
                           "one dispatch now runs k steps.")
        raise Mismatch(f"{what} = {got:.4g}; expected {want:.4g}, which is neither the dispatch shared by k nor "
                       "the step's own work alone. Which of the two costs does fusing k steps change?")
    return "the dispatch cost fades as 1/k; what is left is the step's own work, which fusing cannot remove."


# ----------------------------------------------------------------------------------------------
# 09.2 Fit the dispatch cost and the step cost to measured times


def solution_fit_dispatch_and_step(ks, ms):
    ks, ms = np.asarray(ks, float), np.asarray(ms, float)
    dispatch_ms, step_ms = np.polyfit(1.0 / ks, ms, 1)   # ms = dispatch_ms * (1 / k) + step_ms
    return float(dispatch_ms), float(step_ms)


def _fake_measurements(dispatch, step, ks, noise, seed):
    """Made-up timings from the model, with relative noise: what a real sweep looks like."""
    rng = np.random.default_rng(seed)
    ks = np.asarray(ks, float)
    return (dispatch / ks + step) * (1 + noise * rng.standard_normal(ks.size))


@exercise("09.2", "Fit the dispatch cost and the step cost to measured times", solution=solution_fit_dispatch_and_step,
          returns="a pair of floats (dispatch_ms, step_ms), the least-squares fit of ms = dispatch_ms / k + step_ms",
          hints=["The model is not a straight line in k. Is there a quantity derived from k in which it is one?",
                 "A least-squares straight-line fit: np.polyfit with degree 1 (or np.linalg.lstsq). Exercise 09.1's "
                 "formula says what to put on the horizontal axis.",
                 "Plot section 2's measured times against your chosen variable: the model says the points lie on "
                 "a straight line. Which feature of that line is the cost of a dispatch, and which the cost of a "
                 "step? Check the fit against every point, not two."])
def check_fit_dispatch_and_step(fit_dispatch_and_step):
    ks = [1, 2, 5, 10, 25]
    for dispatch, step, noise, seed in [(0.6, 0.12, 0.0, 0), (1.5, 0.05, 0.03, 1), (0.3, 0.9, 0.05, 2)]:
        ms = _fake_measurements(dispatch, step, ks, noise, seed)
        want = solution_fit_dispatch_and_step(ks, ms)
        what = f"fit_dispatch_and_step(ks={ks}, ms=[{', '.join(f'{m:.3f}' for m in ms)}])"
        got = call(fit_dispatch_and_step, list(ks), ms.copy(), name="fit_dispatch_and_step")
        if getattr(got, "shape", None) == (2,):     # np.polyfit's array of coefficients is a pair too
            got = tuple(got)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise Mismatch(f"{what} should return a pair (dispatch_ms, step_ms); got {describe_tree(got)}.")
        for name, v in zip(("dispatch_ms", "step_ms"), got):
            _narrow_dtype(v, f"{what}: {name}")
        d, s = (expect_scalar(v, what=f"{what}: {k}") for k, v in zip(("dispatch_ms", "step_ms"), got))
        if np.allclose([d, s], want, rtol=1e-3, atol=1e-6):
            continue
        if np.allclose([s, d], want, rtol=1e-3, atol=1e-6):
            raise Mismatch(f"{what} returned ({d:.4g}, {s:.4g}): swapped. The slope against 1/k is the dispatch "
                           "cost, the intercept the step cost: return (dispatch_ms, step_ms).")
        slope_k, intercept_k = np.polyfit(np.asarray(ks, float), ms, 1)
        if np.allclose([d, s], [slope_k, intercept_k], rtol=1e-3) or np.allclose([s, d], [slope_k, intercept_k],
                                                                                  rtol=1e-3):
            raise Mismatch(f"{what} fitted a straight line in k itself; the model of 09.1 is not linear in k. "
                           "Look again at how k enters that formula.")
        per_dispatch = np.polyfit(np.asarray(ks, float), np.asarray(ks, float) * ms, 1)      # k*ms = step*k + dispatch
        if np.allclose([d, s], per_dispatch[::-1], rtol=1e-3, atol=1e-6):
            raise Mismatch(f"{what} returned ({d:.4g}, {s:.4g}), a least-squares fit of the time per dispatch "
                           f"(k times ms) against k. That fits other errors: the point at k={ks[-1]} weighs "
                           f"{ks[-1] ** 2} times the point at k=1. Fit the times per step, ms, as measured: the "
                           f"least-squares answer is ({want[0]:.4g}, {want[1]:.4g}).")
        raise Mismatch(f"{what} returned ({d:.4g}, {s:.4g}); the least-squares fit over all {len(ks)} points "
                       f"is ({want[0]:.4g}, {want[1]:.4g}). Fit every measurement, against 1 / k.")
    return "a straight line in 1 / k: the slope is the cost of a dispatch, the intercept the cost of a step."
