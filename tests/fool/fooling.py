"""The two tests that the fool modules share: every wrong answer fails with feedback that names its mistake, and
every right answer written another way passes.

A module lists its answers and takes both tests with one line::

    verdict, test_a_wrong_answer_fails_and_its_feedback_names_the_mistake, \\
        test_a_right_answer_written_another_way_passes = fool_tests(ID, WRONG, RIGHT)

``WRONG`` holds ``(name, answer, fragment of the expected feedback)``, ``RIGHT`` holds ``(name, answer)``.
"""

import pytest

from course_lib.exercises import exercises


def fool_tests(id_, wrong, right):
    """``(verdict, wrong-answer test, right-answer test)`` for exercise ``id_``."""

    def verdict(answer):
        return exercises()[id_].check(answer)

    @pytest.mark.parametrize("answer, fragment", [w[1:] for w in wrong], ids=[w[0] for w in wrong])
    def test_a_wrong_answer_fails_and_its_feedback_names_the_mistake(answer, fragment):
        fb = verdict(answer)
        assert not fb and fb.started, fb.message
        assert fragment in fb.message, fb.message

    @pytest.mark.parametrize("answer", [r[1] for r in right], ids=[r[0] for r in right])
    def test_a_right_answer_written_another_way_passes(answer):
        fb = verdict(answer)
        assert fb, fb.message

    return verdict, test_a_wrong_answer_fails_and_its_feedback_names_the_mistake, \
        test_a_right_answer_written_another_way_passes


def fresh_test(id_, fresh):
    """The test of a module's ``FRESH`` answers, ``(name, answer, fragment or None)``: a wrong one fails with
    ``fragment`` in its feedback (recorded as started unless it returned None), a right one (``None``) passes."""

    @pytest.mark.parametrize("answer, fragment", [f[1:] for f in fresh], ids=[f[0] for f in fresh])
    def test_a_fresh_answer_gets_what_differs(answer, fragment):
        fb = exercises()[id_].check(answer)
        if fragment is None:
            assert fb, fb.message
        else:
            assert not fb and fb.started == (fragment != "returned None: write") and fragment in fb.message, \
                fb.message

    return test_a_fresh_answer_gets_what_differs
