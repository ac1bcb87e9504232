"""Lesson 05 exercises: the data-parallel step, measuring drift between replicas, a masked loss."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .. import data, sharding
from . import Mismatch, as_array, call, describe_tree, exercise, expect_array, expect_scalar, expect_structure

AXIS = "devices"


def regression_loss(params, batch):
    """Mean squared error of a linear model on one device's shard: ``{"x": (b, d), "y": (b,)}``."""
    pred = batch["x"] @ params["w"] + params["b"]
    return jnp.mean((pred - batch["y"]) ** 2)


# ----------------------------------------------------------------------------------------------
# 05.1 The data-parallel SGD step


def solution_dp_step(loss_fn, params, batch, lr):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    grads = jax.lax.pmean(grads, axis_name="devices")
    loss = jax.lax.pmean(loss, axis_name="devices")
    new_params = jax.tree.map(lambda p, g: p - lr * g, params, grads)
    return new_params, loss


@exercise("05.1", "Write the data-parallel step from the single-device one", solution=solution_dp_step,
          returns="a pair (new_params, loss): new_params a dict like params ({'w': (d,), 'b': ()} on each device), "
                  "loss one float32 number on each device",
          hints=["Start from single_step: the only thing missing is that every device must apply the SAME "
                 "update, the one for the whole global batch.",
                 "Average the gradients (and the loss) over the devices with jax.lax.pmean(tree, "
                 "axis_name='devices') before the update; psum would add n gradients, n times too large."])
def check_dp_step(dp_step):
    for n, d, lr in [(len(jax.devices()), 3, 0.1), (4, 2, 0.05)]:
        devs = jax.devices()[:n]
        x, y, _ = data.regression_data(n=16 * n, d=d, seed=n)
        params = {"w": jnp.asarray(np.linspace(-1, 1, d), jnp.float32), "b": jnp.float32(0.3)}
        batch = sharding.shard({"x": x, "y": y}, n)
        step = jax.pmap(functools.partial(dp_step, regression_loss), axis_name=AXIS, in_axes=(0, 0, None),
                        devices=devs)
        out = call(step, sharding.replicate(params, devs), batch, lr, name="pmap(dp_step)", hints={
            "has no attribute 'tree_map'": "jax.tree_map was removed from JAX: use jax.tree.map.",
            "unbound axis name": f"The axis is named {AXIS!r}: use that name in the collective.",
        })
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise Mismatch(f"dp_step should return a pair (new_params, loss); got {describe_tree(out)}.")
        new_params, loss = out
        if isinstance(loss, dict) and not isinstance(new_params, dict):
            raise Mismatch(f"dp_step returned ({describe_tree(new_params)}, {describe_tree(loss)}): the loss "
                           "first and the parameters second. Return them in the order (new_params, loss).")
        expect_structure(new_params, params, what="new_params, the first thing dp_step returns",
                         hint="Return the updated parameters with the same keys as params.")
        for key, leaf in new_params.items():
            if not isinstance(leaf, jax.Array) or np.shape(leaf) != (n,) + np.shape(params[key]):
                raise Mismatch(f"new_params[{key!r}] should be, under pmap, one copy per device, shape "
                               f"{(n,) + np.shape(params[key])}; got {describe_tree(leaf)}.")
        if np.shape(loss) != (n,) or as_array(loss, what="the loss").dtype == bool:
            raise Mismatch(f"the loss dp_step returns should be one number per device (shape ({n},) under pmap); "
                           f"got {describe_tree(loss)}.")
        grads = jax.grad(regression_loss)(params, {"x": x, "y": y})
        expected = jax.tree.map(lambda p, g: p - lr * g, params, grads)
        blocks = [np.asarray(s.data[0]) for s in sorted(new_params["w"].addressable_shards, key=lambda s: s.device.id)]
        spread = max(float(np.max(np.abs(b - blocks[0]))) for b in blocks)
        if spread > 0:
            raise Mismatch(f"on {n} devices the copies of w differ by up to {spread:.2e} after one step: each device "
                           "applied its own gradient. Average the gradients over the devices (jax.lax.pmean) "
                           "before the update.")
        got_w = blocks[0]
        step_size = np.asarray(params["w"]) - got_w
        want = np.asarray(params["w"]) - np.asarray(expected["w"])
        if np.allclose(step_size, n * want, rtol=1e-4, atol=1e-6) and n > 1:
            raise Mismatch(f"on {n} devices the update is {n} times too large: psum adds the {n} gradients; the "
                           "mean of per-device mean losses needs pmean.")
        expect_array(got_w, expected["w"], what=f"w after one step on {n} devices", rtol=1e-4, atol=1e-6)
        expect_array(sharding.unreplicate(new_params)["b"], expected["b"], what=f"b after one step on {n} devices",
                     rtol=1e-4, atol=1e-6)
        expect_array(np.asarray(loss)[0], regression_loss(params, {"x": x, "y": y}),
                     what=f"the loss returned on {n} devices (the mean over the whole global batch)", rtol=1e-4)
    return "gradients averaged with pmean, the same update everywhere: the copies stay identical."


# ----------------------------------------------------------------------------------------------
# 05.2 How far apart are the replicas?


def solution_max_divergence(replicated):
    worst = 0.0
    for leaf in jax.tree.leaves(replicated):
        copies = [np.asarray(shard.data) for shard in leaf.addressable_shards]
        for copy in copies[1:]:
            worst = max(worst, float(np.max(np.abs(copy - copies[0]))))
    return worst


def _stack_on_devices(copies, devs):
    """Copy i on device i, as one (n, ...) array: replicas that may differ."""
    mesh_sharding = jax.sharding.NamedSharding(sharding.device_mesh(devs), jax.sharding.PartitionSpec("devices"))
    return jax.make_array_from_single_device_arrays(
        (len(devs),) + np.shape(copies[0]), mesh_sharding,
        [jax.device_put(jnp.asarray(c)[None], d) for c, d in zip(copies, devs)])


@exercise("05.2", "Measure how far the replicas have drifted apart", solution=solution_max_divergence,
          returns="one number (a float): the largest absolute difference between any device's copy of any leaf "
                  "and the first device's copy",
          hints=["Each leaf is one array with a copy on every device; compare each copy with the first, leaf by "
                 "leaf, and keep the worst difference over all of them.",
                 "jax.tree.leaves(tree) gives the leaves; leaf.addressable_shards[k].data is device k's copy. "
                 "Take np.max(np.abs(copy - first)) and the max over everything, as a float."])
def check_max_divergence(max_divergence):
    devs = jax.devices()
    base = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.float32(1.0)}
    same = sharding.replicate(base)
    one_number = "return one number for the whole tree, the worst difference over every leaf and device"
    got = expect_scalar(call(max_divergence, same, name="max_divergence"), what="max_divergence(replicated)",
                        per=one_number)
    if got != 0.0:
        raise Mismatch(f"for identical copies max_divergence returned {float(got)}; expected 0.0.")
    for device, leaf, delta in [(len(devs) - 1, "w", 0.25), (1, "b", -2.0)]:
        copies = [{k: base[k] + (delta if (i == device and k == leaf) else 0.0) for k in base}
                  for i in range(len(devs))]
        drifted = jax.tree.map(lambda *xs: _stack_on_devices(xs, devs), *copies)
        got = expect_scalar(call(max_divergence, drifted, name="max_divergence"),
                            what="max_divergence(replicated)", per=one_number)
        if np.isclose(got, 0.0):
            raise Mismatch(f"device {device}'s copy of {leaf!r} differs by {abs(delta)}, but max_divergence "
                           "returned 0.0: compare every device's copy (and every leaf), not only the first two.")
        if not np.isclose(got, abs(delta)):
            raise Mismatch(f"device {device}'s copy of {leaf!r} differs by {abs(delta)}; max_divergence returned "
                           f"{got}. Return the largest absolute difference from the first device's copy.")
    return "it finds the largest difference between any device's copy and the first one."


# ----------------------------------------------------------------------------------------------
# 05.3 A loss that ignores padding


def solution_masked_mse(pred, y, mask):
    mask = mask.astype(pred.dtype)
    return jnp.sum(mask * (pred - y) ** 2) / jnp.maximum(jnp.sum(mask), 1.0)


@exercise("05.3", "A mean squared error that ignores padding", solution=solution_masked_mse,
          returns="one number (a 0-d array): the mean of (pred - y) ** 2 over the rows where mask is True, "
                  "0.0 when there are none",
          hints=["Padding rows must count for nothing in the sum AND in the count you divide by; and a device "
                 "may get only padding.",
                 "mask = mask.astype(pred.dtype); return jnp.sum(mask * (pred - y) ** 2) / "
                 "jnp.maximum(jnp.sum(mask), 1.0)."])
def check_masked_mse(masked_mse):
    rng = np.random.default_rng(5)
    for b, real in [(8, 5), (16, 16), (4, 1)]:
        pred = jnp.asarray(rng.normal(size=b), jnp.float32)
        y = jnp.asarray(rng.normal(size=b), jnp.float32).at[real:].set(0.0)
        mask = jnp.arange(b) < real
        what = f"masked_mse with {real} real rows of {b}"
        got = expect_scalar(call(masked_mse, pred, y, mask, name="masked_mse"), what=what,
                            per="one squared error per row is not yet a loss: reduce it to their mean over the "
                                "real rows")
        expected = float(np.mean((np.asarray(pred)[:real] - np.asarray(y)[:real]) ** 2))
        if real < b and np.isclose(float(got), float(np.mean((np.asarray(pred) - np.asarray(y)) ** 2)), rtol=1e-5):
            raise Mismatch(f"{what} counts the padding rows too: weight each squared error by the mask.")
        if real < b and np.isclose(float(got), expected * real / b, rtol=1e-5):
            raise Mismatch(f"{what} divides by all {b} rows; divide by the number of real rows, {real} "
                           "(the sum of the mask).")
        expect_array(got, expected, what=what, rtol=1e-5)
    got = expect_scalar(call(masked_mse, jnp.ones(4), jnp.zeros(4), jnp.zeros(4, bool), name="masked_mse"),
                        what="masked_mse with no real rows")
    if not np.isfinite(got):
        raise Mismatch(f"with no real rows at all (a device that got only padding) masked_mse returned {float(got)}; "
                       "it must stay finite (0.0), or the NaN spreads to every device through the gradient average. "
                       "Divide by max(number of real rows, 1).")
    return "padding rows count for nothing, and a device with only padding gives 0, not NaN."
