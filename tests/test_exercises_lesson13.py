"""Lesson 13's checker: the reference passes, wrong predictions get feedback naming the mistake, a machine without
libtpu gets feedback (not an error), and the hints are a ladder that never states the answer."""

import re

import pytest

from course_lib.exercises import check, exercises
from course_lib.exercises import lesson13 as L
from hint_rules import assert_hints_are_a_ladder

needs_libtpu = pytest.mark.skipif(L.tpu_compiler_missing() is not None, reason="libtpu is not installed here")


@needs_libtpu
def test_reference_passes_and_names_what_it_checked():
    feedback = check("13.1", L.solution_predict_state_bytes)
    assert feedback, feedback.message
    assert "4, 8 and 16 TPU v5e chips" in feedback.message


@needs_libtpu
def test_the_measurement_is_the_tpu_compilers_and_deterministic():
    c, topology, fsdp = L.CASES[0]
    key = tuple(sorted(c.items()))
    first = L.measure_state_bytes(key, topology, fsdp)
    L.measure_state_bytes.cache_clear()
    assert L.measure_state_bytes(key, topology, fsdp) == first
    # FSDP on 4 chips holds less than data parallelism would: the layers are split
    assert first < 12 * sum(L._counts(c))


@needs_libtpu
@pytest.mark.parametrize("wrong, named", [
    (lambda c, n, f: L.solution_predict_state_bytes(c, n, f) / 3, "besides the parameters?"),
    (lambda c, n, f: L.solution_predict_state_bytes(c, n, f) * 4 / 3, "free before it returns?"),
    (lambda c, n, f: L.solution_predict_state_bytes(c, n, f) / 2**30, "GiB. Return bytes. (On FSDP on 4 chips "
                                                                      "(D=256, HEADS=4, MLP=1024, LAYERS=2, SEQ=64, "
                                                                      "VOCAB=128), a TPU v5e:2x2, your 0.0053"),
    (lambda c, n, f: L.solution_predict_state_bytes(c, n, f) * 8, "bits"),
    (lambda c, n, f: L.solution_predict_state_bytes(c, n, f) * 1.7, "is too high"),
    (lambda c, n, f: "a lot", "expected one number"),
    (lambda c, n, f: -1, "positive"),
], ids=["params-only", "with-gradients", "gib", "bits", "ratio", "string", "negative"])
def test_mistakes_are_named(wrong, named):
    feedback = check("13.1", wrong)
    assert not feedback and named in feedback.message, feedback.message


def test_the_mistakes_feedback_put_together_does_not_spell_the_count():
    """Each is a question about the mechanism, as 10.5's and 12.3's are: none names a part of the count."""
    told = " ".join(m.feedback for m in L.MISTAKES_13_1)
    for part in ("mu", "nu", "three", "12", "float32", "temporaries", "position", "embeddings?", "layers"):
        assert not re.search(rf"\b{part}\b", told), part


def test_without_libtpu_the_checker_says_why(monkeypatch):
    monkeypatch.setattr(L, "tpu_compiler_missing", lambda: "libtpu is not installed here (test)")
    feedback = check("13.1", L.solution_predict_state_bytes)
    assert not feedback and "needs the TPU compiler" in feedback.message and "(test)" in feedback.message


def test_placeholder_is_not_started():
    def predict_state_bytes(c, n_chips, fsdp):
        ...                                    # the notebook's stub: nothing written yet

    feedback = check("13.1", predict_state_bytes)
    assert not feedback
    assert not feedback.started or L.tpu_compiler_missing() is not None


def test_hints_are_a_ladder_without_the_answer():
    assert_hints_are_a_ladder("13.1")
    for h in exercises()["13.1"].hints:
        assert not re.search(r"\b(12|16|4)\s*bytes", h), h       # the prediction's numbers stay unsaid
