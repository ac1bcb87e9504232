"""Data for the training lessons, and an iterator of sharded global batches.

Lesson 05. Two datasets that need no network: a synthetic linear regression, and
scikit-learn's bundled handwritten digits (1,797 8x8 images, shipped inside the
scikit-learn package). ``batches`` cuts a dataset into global batches in a fixed,
seeded order and shards each one for pmap: ``(B, ...) -> (n_devices, B // n_devices, ...)``.
"""

from __future__ import annotations

from typing import Iterator

import jax
import numpy as np

from . import _checks

__all__ = ["regression_data", "digits", "batches", "num_batches"]


def regression_data(n: int = 1024, d: int = 3, noise: float = 0.1, seed: int = 0):
    """A linear regression problem ``y = x @ w + b + noise``.

    Returns:
      ``(x, y, true_params)``: ``x`` float32 ``(n, d)``, ``y`` float32 ``(n,)``, and
      ``true_params = {"w": (d,), "b": ()}``, the weights that generated ``y``.
    """
    n = _checks.whole(n, "n", "regression_data")
    d = _checks.whole(d, "d", "regression_data")
    seed = _checks.whole(seed, "seed", "regression_data", minimum=0)
    if isinstance(noise, bool) or not isinstance(noise, (int, float, np.number)) or not noise >= 0:
        _checks.fail("regression_data", "noise", "a number >= 0", noise, "Pass e.g. noise=0.1.",
                     ValueError if isinstance(noise, (int, float, np.number)) else TypeError)
    rng = np.random.default_rng(seed)
    true_params = {"w": rng.normal(size=d).astype(np.float32), "b": np.float32(rng.normal())}
    x = rng.normal(size=(n, d)).astype(np.float32)
    y = (x @ true_params["w"] + true_params["b"] + noise * rng.normal(size=n)).astype(np.float32)
    return x, y, true_params


def digits(test_fraction: float = 0.2, seed: int = 0):
    """scikit-learn's handwritten digits, loaded from the copy inside the package (no download).

    Returns:
      ``(x_train, y_train, x_test, y_test)``: images flattened to ``(N, 64)`` float32 in
      ``[0, 1]``, labels ``(N,)`` int32 in ``0..9``; a seeded, stratified split.
    """
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (float, np.floating)) \
            or not 0 < test_fraction < 1:
        _checks.fail("digits", "test_fraction", "a fraction strictly between 0 and 1", test_fraction,
                     "Pass e.g. test_fraction=0.2.",
                     ValueError if isinstance(test_fraction, (int, float)) else TypeError)
    seed = _checks.whole(seed, "seed", "digits", minimum=0)
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=test_fraction, random_state=seed,
                                                        stratify=y)
    return x_train, y_train, x_test, y_test


def _check(x, y, batch_size, n_devices, remainder):
    for name, v in (("x", x), ("y", y)):
        if v.dtype == object or v.ndim == 0:
            raise TypeError(f"batches: {name} must be an array of examples, shape (N, ...), got "
                            f"{_checks.shown(v if v.dtype != object or v.ndim else v.item())}. Pass a NumPy "
                            f"array, e.g. the x, y of data.regression_data().")
    if len(x) != len(y):
        raise ValueError(f"batches: x and y have different lengths ({len(x)} and {len(y)}); they must hold one "
                         "label per example. Cut them to the same length.")
    if len(x) == 0:
        raise ValueError("batches: the dataset is empty (0 examples in x and y): there is nothing to make batches "
                         "of. Pass at least one batch of examples.")
    if batch_size % n_devices:
        low = batch_size - batch_size % n_devices
        raise ValueError(f"a global batch of {batch_size} does not divide across {n_devices} devices; use a "
                         f"multiple of {n_devices}, e.g. {low or n_devices} or {low + n_devices}.")
    if remainder == "drop" and len(x) < batch_size:
        raise ValueError(f"the dataset has {len(x)} examples, fewer than one batch of {batch_size}, and "
                         "remainder='drop' would drop them all; use a smaller batch or remainder='pad'.")


def num_batches(n_examples: int, batch_size: int, remainder: str = "drop") -> int:
    """How many batches one epoch of ``batches`` yields."""
    n_examples = _checks.whole(n_examples, "n_examples", "num_batches", minimum=0)
    batch_size = _checks.whole(batch_size, "batch_size", "num_batches")
    _checks.one_of(remainder, "remainder", "num_batches", ("drop", "pad"))
    return n_examples // batch_size if remainder == "drop" else -(-n_examples // batch_size)


def batches(x, y, batch_size: int, *, n_devices: int | None = None, seed: int = 0, shuffle: bool = True,
            remainder: str = "drop", epochs: int | None = 1) -> Iterator[dict]:
    """Yield global batches, sharded for pmap, in a fixed seeded order.

    Each item is a dict of NumPy arrays:

    * ``"x"``: ``(n_devices, batch_size // n_devices, ...)``
    * ``"y"``: ``(n_devices, batch_size // n_devices, ...)``
    * ``"mask"``: ``(n_devices, batch_size // n_devices)`` bool, ``False`` on padding rows.

    When the dataset does not divide into batches, the last one is dropped
    (``remainder="drop"``) or padded with zeros up to ``batch_size`` and masked
    (``remainder="pad"``). The order is reshuffled each epoch from ``seed``.

    Args:
      x, y: examples and labels, the same length ``N``.
      batch_size: the global batch ``B``, a multiple of ``n_devices``.
      n_devices: default ``jax.local_device_count()``.
      epochs: passes over the data; ``None`` repeats forever.

    Raises:
      ValueError: ``x`` and ``y`` differ in length, the dataset is empty, ``B`` does not
        divide across the devices, or ``remainder`` is not ``"drop"``/``"pad"``.
      TypeError: ``x`` or ``y`` is not an array (``None``), or a count is not a whole number.
    """
    n_devices = jax.local_device_count() if n_devices is None else _checks.whole(n_devices, "n_devices", "batches")
    batch_size = _checks.whole(batch_size, "batch_size", "batches",
                               fix=f"Pass a multiple of the device count, e.g. batch_size={8 * n_devices}.")
    epochs = _checks.optional_whole(epochs, "epochs", "batches", fix="Pass epochs=1 or more, or None to repeat "
                                    "forever.")
    seed = _checks.whole(seed, "seed", "batches", minimum=0)
    _checks.one_of(remainder, "remainder", "batches", ("drop", "pad"))
    x, y = np.asarray(x), np.asarray(y)
    _check(x, y, batch_size, n_devices, remainder)  # here, not inside the generator, so bad input fails at once
    return _generate(x, y, batch_size, n_devices, seed, shuffle, remainder, epochs)


def _generate(x, y, batch_size, n_devices, seed, shuffle, remainder, epochs):
    rng = np.random.default_rng(seed)
    per_device = batch_size // n_devices
    epoch = 0
    while epochs is None or epoch < epochs:
        order = rng.permutation(len(x)) if shuffle else np.arange(len(x))
        for start in range(0, len(x), batch_size):
            idx = order[start:start + batch_size]
            if len(idx) < batch_size and remainder == "drop":
                break
            mask = np.zeros(batch_size, bool)
            mask[:len(idx)] = True
            xb = np.zeros((batch_size,) + x.shape[1:], x.dtype)
            yb = np.zeros((batch_size,) + y.shape[1:], y.dtype)
            xb[:len(idx)], yb[:len(idx)] = x[idx], y[idx]
            yield {"x": xb.reshape((n_devices, per_device) + x.shape[1:]),
                   "y": yb.reshape((n_devices, per_device) + y.shape[1:]),
                   "mask": mask.reshape(n_devices, per_device)}
        epoch += 1
