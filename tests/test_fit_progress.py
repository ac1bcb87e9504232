"""training.fit's progress bar and what an interrupted fit says (issue 28): text that reads the same everywhere."""

import re

import jax
import jax.numpy as jnp
import optax
import pytest

from course_lib import data, training


def mse(params, batch, key):
    pred = batch["x"] @ params["w"] + params["b"]
    return training.masked_mean((pred - batch["y"]) ** 2, batch.get("mask"))


ZERO = {"w": jnp.zeros(3), "b": jnp.float32(0.0)}
X, Y, _ = data.regression_data(n=512, seed=0)


def setup(donate=True):
    opt = optax.sgd(0.1)
    return training.make_train_step(mse, opt, donate=donate), training.init_state(ZERO, opt, jax.random.key(0))


class FakeHandle:
    """Stands for IPython's display handle: records every update, as a notebook would store the last one."""

    def __init__(self, shown):
        self.shown = [shown]

    def update(self, obj):
        self.shown.append(obj)


@pytest.fixture
def notebook(monkeypatch):
    """Run fit as in a Jupyter kernel: the bar goes through a display handle."""
    import IPython.display
    handles = []

    def display(obj, display_id=False):
        assert display_id is True, "the bar is updated in place, so it needs a display id"
        handles.append(FakeHandle(obj))
        return handles[-1]

    monkeypatch.setattr(training, "_in_notebook", lambda: True)
    monkeypatch.setattr(IPython.display, "display", display)
    return handles


def test_in_a_notebook_the_bar_is_plain_text_ending_at_its_final_state(notebook):
    step, state = setup()
    training.fit(step, state, data.batches(X, Y, 64, n_devices=8, epochs=None), num_steps=30)
    (handle,) = notebook
    bundle = handle.shown[-1]._repr_mimebundle_() if hasattr(handle.shown[-1], "_repr_mimebundle_") else None
    text = handle.shown[-1].data
    assert bundle is None or set(bundle) <= {"text/plain"}
    assert re.match(r"training: 100%\|██████████\| 30/30 \[.*loss=\d\.\d{4}\]$", text), text
    assert "widget" not in type(handle.shown[-1]).__name__.lower()
    assert handle.shown[0].data.startswith("training:   0%|"), "shown at 0 before the first step is read"


def test_in_a_terminal_the_bar_is_tqdms_text_on_stderr(capsys):
    step, state = setup()
    training.fit(step, state, data.batches(X, Y, 64, n_devices=8, epochs=None), num_steps=20)
    err = capsys.readouterr().err
    assert "20/20" in err and "100%" in err and "loss=" in err


def test_progress_false_shows_nothing(capsys, notebook):
    step, state = setup()
    training.fit(step, state, data.batches(X, Y, 64, n_devices=8, epochs=None), num_steps=20, progress=False)
    assert notebook == [] and capsys.readouterr().err == ""


def interrupted_batches(after):
    for k, batch in enumerate(data.batches(X, Y, 64, n_devices=8, epochs=None)):
        if k == after:
            raise KeyboardInterrupt
        yield batch


def test_an_interrupted_fit_says_where_it_stopped_and_what_became_of_the_state(capsys, notebook):
    step, state = setup(donate=True)
    with pytest.raises(KeyboardInterrupt):
        training.fit(step, state, interrupted_batches(after=35), num_steps=100)
    err = capsys.readouterr().err
    read = re.search(r"fit was interrupted at step 35 of 100; the losses of steps 1 to (\d+) had been read back.", err)
    assert read and int(read.group(1)) in (10, 20, 30), err
    assert "still hold what they held before" in err
    assert "donated to the first step" in err and "training.init_state" in err
    assert jax.tree.leaves(state.params)[0].is_deleted(), "the message is right: the state passed in is gone"
    final = notebook[0].shown[-1].data
    assert f"{read.group(1)}/100" in final and final.endswith("[interrupted at step 35]"), final


def test_an_interrupted_fit_without_donation_does_not_claim_the_state_is_gone(capsys, notebook):
    step, state = setup(donate=False)
    with pytest.raises(KeyboardInterrupt):
        training.fit(step, state, interrupted_batches(after=12), num_steps=50, steps_per_call=1)
    err = capsys.readouterr().err
    assert "interrupted at step 12 of 50" in err and "donated" not in err
    assert not jax.tree.leaves(state.params)[0].is_deleted()


def test_an_interrupt_before_any_step_ran_says_so(capsys, notebook):
    step, state = setup(donate=True)
    with pytest.raises(KeyboardInterrupt):
        training.fit(step, state, interrupted_batches(after=3), num_steps=50)     # the first group holds 10
    err = capsys.readouterr().err
    assert "interrupted at step 3 of 50; no step had finished yet." in err
    assert "donated" not in err and not jax.tree.leaves(state.params)[0].is_deleted()
