"""Lesson 13 exercise: predict the memory per TPU chip of a training state, then let the TPU compiler answer.

The checker compiles lesson 13's training step (its transformer, Adam, donation, sharded ``jit``) for compile-only
TPU v5e topologies from the ``libtpu`` wheel, for configurations the lesson does not show, and compares the
learner's prediction with ``memory_analysis().argument_size_in_bytes`` less the batch's bytes. Where libtpu is
missing it says so, as feedback. The compiling is ``course_lib.tpu_pod``'s; its results are kept per configuration,
so a second answer is checked without compiling again.
"""

import numpy as np

from ..tpu_pod import install_hint, measure_state_bytes, tpu_compiler_missing
from . import Case, Mismatch, Mistake, call, diagnose, exercise
from ._diagnose import _numbers, _values

HINTS = {
    "13.1": ["Before the step runs, a chip holds only what the step receives as arguments. Which of the training "
             "state's parts are arguments, and which are made inside the step and freed again?",
             "Lesson 10 counts the bytes per parameter that Adam's training state needs; section 1 of this lesson "
             "(abstract_state) shows which arrays FSDP splits over the chips and which stay whole on every chip.",
             "Section 1's abstract_state: the step's arguments, each a ShapeDtypeStruct with its sharding. A "
             "compiled step's memory_analysis().argument_size_in_bytes is the number the checker compares with."],
}

# The checker's configurations: none is one the lesson shows. Shapes are multiples of the TPU's tiles (8 x 128)
# after sharding, so that the layout pads (almost) nothing and the prediction can be close.
CASES = [
    (dict(D=256, HEADS=4, MLP=1024, LAYERS=2, SEQ=64, VOCAB=128), "v5e:2x2", True),
    (dict(D=128, HEADS=2, MLP=512, LAYERS=3, SEQ=32, VOCAB=128), "v5e:2x4", False),
    (dict(D=256, HEADS=4, MLP=512, LAYERS=4, SEQ=32, VOCAB=256), "v5e:4x4", True),
]


def _counts(c):
    """(parameters in the stacked layers, parameters elsewhere)."""
    D, MLP, L, V = c["D"], c["MLP"], c["LAYERS"], c["VOCAB"]
    in_layers = L * (3 * D * D + D * D + 2 * D * MLP + 2 * D)      # wqkv, wo, w1, w2, norm1, norm2
    elsewhere = V * D + c["SEQ"] * D + D + D * V                     # embed, pos, norm, unembed
    return in_layers, elsewhere


def solution_predict_state_bytes(c, n_chips, fsdp):
    in_layers, elsewhere = _counts(c)
    per_chip = in_layers / n_chips if fsdp else in_layers            # FSDP splits the stacked layers only
    return 12 * (per_chip + elsewhere) + 4                           # float32 params, mu, nu; the int32 count


def _state(per_param, layers_over=lambda n, fsdp: n if fsdp else 1, rest_over=lambda n, fsdp: 1, rest_less=0):
    """A prediction: ``per_param`` bytes for each parameter, the layers split over ``layers_over(n, fsdp)`` chips
    and the other arrays over ``rest_over(n, fsdp)``."""
    def predict(c, n, fsdp):
        layers, rest = _counts(c)
        return per_param * (layers / layers_over(n, fsdp)
                            + (rest - rest_less * c["SEQ"] * c["D"]) / rest_over(n, fsdp))
    return predict


# Questions about the mechanism, each naming no part of the count: put together, they must not spell it out.
_LEFT_OUT = "Which arrays does the step receive as arguments besides the parameters? abstract_state lists them all."
_DTYPE = "In which dtype does this step keep each array of its state? Each leaf of section 1's abstract_state says."
_SPLITS = "Which arrays does data parallelism split over the chips, and which does FSDP? Each leaf's sharding says."
_LEAVES = "Is every parameter of the model in your count? Compare with the leaves of section 1's abstract_state."
MISTAKES_13_1 = [
    Mistake("parameters only", _LEFT_OUT, _state(4)),
    Mistake("two of three", "Which arrays does the step receive as arguments, and in which dtype? abstract_state "
            "lists them all.", _state(8)),
    Mistake("gradients counted", "Which arrays does the step receive as arguments, and which does it compute "
            "inside itself and free before it returns?", _state(16)),
    Mistake("bfloat16", _DTYPE, _state(6)),
    Mistake("bfloat16 parameters", _DTYPE, _state(10)),
    Mistake("everything divided", _SPLITS, _state(12, lambda n, fsdp: n, rest_over=lambda n, fsdp: n)),
    Mistake("replicated leaves split under FSDP", _SPLITS, _state(12, rest_over=lambda n, fsdp: n if fsdp else 1)),
    Mistake("DP split like FSDP", _SPLITS, _state(12, lambda n, fsdp: n)),
    Mistake("FSDP not split", _SPLITS, _state(12, lambda n, fsdp: 1)),
    Mistake("FSDP over 8 chips", "Your FSDP count divides by a fixed number of chips: how many does this call's "
            "mesh have?", _state(12, lambda n, fsdp: 8 if fsdp else 1)),
    Mistake("only the layers", _LEAVES, lambda c, n, fsdp: 12 * _counts(c)[0] / (n if fsdp else 1)),
    Mistake("pos left out", _LEAVES, _state(12, rest_less=1)),
    Mistake("bits", "That looks like bits (8 times the bytes). Return bytes.", _state(96)),
    *[Mistake(unit, f"That looks like {unit}. Return bytes.", _state(12 / size))
      for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("GB", 1e9), ("MB", 1e6))],
]


@exercise("13.1", "Predict the training state's bytes per TPU chip, then let the TPU compiler answer",
          solution=solution_predict_state_bytes,
          returns="a number: bytes per chip (an int or a float)")
def check_predict_state_bytes(predict_state_bytes):
    missing = tpu_compiler_missing()
    if missing:
        raise Mismatch(f"this checker compiles for TPU chips and needs the TPU compiler: {missing}. The lesson's "
                       f"other cells say the same. {install_hint()}")
    cases, off = [], []
    for c, topology, fsdp in CASES:
        n = int(np.prod([int(k) for k in topology.split(":")[1].split("x")]))
        sizes = ", ".join(f"{k}={v}" for k, v in c.items())
        # n=None: these chips are TPU chips of a compiled topology, not this machine's devices
        case = Case((dict(c), n, fsdp), f"{'FSDP' if fsdp else 'data parallelism'} on {n} chips ({sizes})")
        got = call(predict_state_bytes, *case.args, name="predict_state_bytes")
        if (value := _positive(got)) is None:
            raise Mismatch(f"{case.label}: predict_state_bytes returned {got!r:.80}; expected one number: the "
                           "bytes per chip, positive (an int or a float).")
        measured = measure_state_bytes(tuple(sorted(c.items())), topology, fsdp)
        cases.append(case)
        if abs(value - measured) > 0.03 * measured:         # the 3% the feedback names
            off.append(f"(On {case.label}, a TPU {topology}, your {_values(value)} bytes per chip is more than 3% "
                       f"{'above' if value > measured else 'below'} what the TPU compiler's step holds per chip: its "
                       "parameters and Adam state. Within 3% passes.)")
    if not off:
        return ("right within 3% for every configuration, data parallelism and FSDP on 4, 8 and 16 TPU v5e chips: "
                "the compiler's arguments are the float32 parameters and Adam's two moments (plus its step "
                "counter), the gradients are temporaries, and FSDP splits only the stacked layers.")
    try:   # which mistake, if every case confirms it; the right count is not shown (the compiler gives it)
        diagnose(predict_state_bytes, cases, solution=solution_predict_state_bytes, mistakes=MISTAKES_13_1,
                 name="predict_state_bytes", rtol=1e-4, atol=0, reveal=False, names="your count")
    except Mismatch as e:
        raise Mismatch(f"{e}{_ignores_chips(predict_state_bytes, cases)} {off[0]}") from None
    raise Mismatch(f"Your prediction matches the parameter count times the bytes per parameter, but not the "
                   f"compiler's figure. {off[0]}")


def _ignores_chips(predict, cases) -> str:
    """" It returns the same for 4 and 8 chips under FSDP ..." when the answer, asked again with twice the chips,
    answers the same on every FSDP case (where a right prediction falls); else ""."""
    fsdp = [case for case in cases if case.args[2]]
    try:
        if not fsdp or any(_positive(predict(dict(c), 2 * n, True)) != _positive(predict(dict(c), n, True))
                           for c, n, _ in (case.args for case in fsdp)):
            return ""
    except Exception:  # noqa: BLE001: the learner's function, already run on these cases
        return ""
    n = fsdp[0].args[1]
    return (f" Under FSDP it returns the same number for {n} and {2 * n} chips: it does not follow n_chips, "
            "and FSDP's split share shrinks as the chips grow.")


def _positive(got):
    """``got`` as a positive finite float when it is one real number (any Python, NumPy or JAX form), else None."""
    a = _numbers(got)
    ok = a is not None and a.ndim == 0 and a.dtype != bool and np.isrealobj(a) and np.isfinite(a) and a > 0
    return float(a) if ok else None
