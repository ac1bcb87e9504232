"""course_lib.data: the datasets, and the sharded batch iterator with its errors."""

import numpy as np
import pytest

from course_lib import data


def test_regression_data_is_seeded_and_linear():
    x, y, true = data.regression_data(n=256, d=4, noise=0.0, seed=3)
    assert x.shape == (256, 4) and y.shape == (256,) and true["w"].shape == (4,)
    np.testing.assert_allclose(y, x @ true["w"] + true["b"], rtol=1e-5, atol=1e-5)
    again = data.regression_data(n=256, d=4, noise=0.0, seed=3)
    np.testing.assert_array_equal(again[0], x)


def test_digits_load_locally_split_and_scaled():
    x_train, y_train, x_test, y_test = data.digits()
    assert x_train.shape[1] == 64 and x_train.dtype == np.float32 and y_train.dtype == np.int32
    assert len(x_train) + len(x_test) == 1797 and len(x_test) == 360
    assert 0.0 <= x_train.min() and x_train.max() <= 1.0
    assert set(np.unique(y_test)) == set(range(10)), "stratified: every class in the test set"


def test_batches_are_sharded_seeded_and_cover_the_data():
    x = np.arange(100, dtype=np.float32).reshape(50, 2)
    y = np.arange(50)
    got = list(data.batches(x, y, 16, n_devices=8, seed=1))
    assert len(got) == 3 == data.num_batches(50, 16)
    for b in got:
        assert b["x"].shape == (8, 2, 2) and b["y"].shape == (8, 2) and b["mask"].all()
        np.testing.assert_array_equal(b["x"][..., 0] / 2, b["y"])  # rows stay with their labels
    seen = np.concatenate([b["y"].reshape(-1) for b in got])
    assert len(set(seen)) == 48, "the remainder of 2 was dropped, nothing repeated"
    again = [b["y"] for b in data.batches(x, y, 16, n_devices=8, seed=1)]
    np.testing.assert_array_equal(np.stack(again), np.stack([b["y"] for b in got]))
    other = [b["y"] for b in data.batches(x, y, 16, n_devices=8, seed=2)]
    assert not np.array_equal(np.stack(other), np.stack(again))


def test_batches_pad_and_mask_the_last_batch():
    x, y = np.ones((50, 2), np.float32), np.arange(1, 51)
    got = list(data.batches(x, y, 16, n_devices=8, remainder="pad", shuffle=False))
    assert len(got) == 4 == data.num_batches(50, 16, "pad")
    last = got[-1]
    assert last["mask"].sum() == 2 and last["mask"].reshape(-1)[:2].all()
    assert (last["y"].reshape(-1)[2:] == 0).all() and (last["x"].reshape(-1, 2)[2:] == 0).all()
    np.testing.assert_array_equal(last["y"].reshape(-1)[:2], [49, 50])


def test_batches_repeat_for_several_epochs_or_forever():
    x, y = np.zeros((32, 1)), np.zeros(32)
    assert len(list(data.batches(x, y, 16, n_devices=8, epochs=3))) == 6
    forever = data.batches(x, y, 16, n_devices=8, epochs=None)
    assert len([next(forever) for _ in range(100)]) == 100


@pytest.mark.parametrize("args, kwargs, message", [
    ((np.zeros((10, 2)), np.zeros(9), 8), {}, r"different lengths \(10 and 9\)"),
    ((np.zeros((0, 2)), np.zeros(0), 8), {}, "the dataset is empty"),
    ((np.zeros((64, 2)), np.zeros(64), 12), {"n_devices": 8}, "a global batch of 12 does not divide across 8 "
                                                               "devices; use a multiple of 8, e.g. 8 or 16"),
    ((np.zeros((64, 2)), np.zeros(64), 0), {}, "batch_size must be a whole number >= 1"),
    ((np.zeros((64, 2)), np.zeros(64), 8), {"remainder": "keep"}, "remainder must be one of 'drop', 'pad'"),
    ((np.zeros((6, 2)), np.zeros(6), 8), {"n_devices": 8}, "fewer than one batch of 8"),
])
def test_batches_reject_bad_input_at_once(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        data.batches(*args, **kwargs)  # raises here, before the first batch is asked for
