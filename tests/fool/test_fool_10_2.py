"""Exercise 10.2 (the ZeRO update of a matrix split by columns): answers that try to fool the checker."""

import jax
import jax.numpy as jnp

from fooling import fool_tests

ID = "10.2"
A = "data"


def zero(params, grads, lr, *, scatter=1, gather=1, tiled=True, start_at=None, mean=True, dtype=None):
    n = jax.lax.axis_size(A)
    cols = params.shape[1] // n
    if dtype is not None:
        params, grads = params.astype(dtype), grads.astype(dtype)
    mine = jax.lax.psum_scatter(grads, A, scatter_dimension=scatter, tiled=True) / (n if mean else 1)
    start = jax.lax.axis_index(A) * cols if start_at is None else start_at
    my = jax.lax.dynamic_slice_in_dim(params, start, cols, axis=1)
    return jax.lax.all_gather(my - lr * mine, A, axis=gather, tiled=tiled)


def flattened(params, grads, lr):              # the lesson's flat-vector ZeRO: each device owns rows' numbers
    n = jax.lax.axis_size(A)
    flat = params.reshape(-1)
    size = flat.shape[0] // n
    mine = jax.lax.psum_scatter(grads.reshape(-1), A, tiled=True) / n
    my = jax.lax.dynamic_slice_in_dim(flat, jax.lax.axis_index(A) * size, size)
    return jax.lax.all_gather(my - lr * mine, A, tiled=True).reshape(params.shape)


def pmean_then_slice(params, grads, lr):
    n = jax.lax.axis_size(A)
    cols = params.shape[1] // n
    g = jax.lax.dynamic_slice_in_dim(jax.lax.pmean(grads, A), jax.lax.axis_index(A) * cols, cols, axis=1)
    my = jax.lax.dynamic_slice_in_dim(params, jax.lax.axis_index(A) * cols, cols, axis=1)
    return jax.lax.all_gather(my - lr * g, A, axis=1, tiled=True)


def transposed(params, grads, lr):             # right: scatter the rows of the transpose, i.e. the columns
    n = jax.lax.axis_size(A)
    mine = jax.lax.psum_scatter(grads.T, A, tiled=True) / n                  # (C // n, R)
    cols = params.shape[1] // n
    my = jax.lax.dynamic_slice_in_dim(params.T, jax.lax.axis_index(A) * cols, cols)
    return jax.lax.all_gather(my - lr * mine, A, tiled=True, to="invarying").T


def with_dynamic_slice(params, grads, lr):      # right: lax.dynamic_slice with both start indices
    n = jax.lax.axis_size(A)
    rows, cols = params.shape[0], params.shape[1] // n
    mean = jax.lax.psum_scatter(grads, A, scatter_dimension=1, tiled=True) * (1.0 / n)
    my = jax.lax.dynamic_slice(params, (0, jax.lax.axis_index(A) * cols), (rows, cols))
    return (jax.lax.all_gather(my, A, axis=1, tiled=True, to="invarying")
            - lr * jax.lax.all_gather(mean, A, axis=1, tiled=True, to="invarying"))


WRONG = [
    ("rows scattered (the default axis)", lambda p, g, lr: zero(p, g, lr, scatter=0, gather=0),
     "scatter_dimension"),
    ("flattened, the lesson's way", flattened, "gradient-sized collectives are"),
    ("pmean, then a block", pmean_then_slice, "gradient-sized collectives are"),
    ("summed, not averaged", lambda p, g, lr: zero(p, g, lr, mean=False), "times too large"),
    ("own gradient only", lambda p, g, lr: p - lr * g, "applied only its own gradient"),
    ("gather not tiled", lambda p, g, lr: zero(p, g, lr, tiled=False), "stacked on a new axis"),
    ("every device the first block", lambda p, g, lr: zero(p, g, lr, start_at=0), "Only the first block is right"),
    ("gathered along the rows", lambda p, g, lr: zero(p, g, lr, gather=0), "joined along the rows"),
    ("no gather", lambda p, g, lr: jax.lax.psum_scatter(g, A, scatter_dimension=1, tiled=True),
     "returned only its block"),
    ("bfloat16", lambda p, g, lr: zero(p, g, lr, dtype=jnp.bfloat16), "bfloat16"),
    ("gathered matrix typed varying (no to=)", lambda p, g, lr: zero(p, g, lr),
     "JAX types the gathered matrix as varying"),
]
RIGHT = [("scatter the transpose", transposed), ("dynamic_slice, two gathers", with_dynamic_slice)]


verdict, test_a_wrong_answer_fails_and_its_feedback_names_the_mistake, \
    test_a_right_answer_written_another_way_passes = fool_tests(ID, WRONG, RIGHT)


def test_a_written_in_device_count_is_measured():
    """psum_scatter divided by a fixed 8: right on 8 devices, and the feedback names the factor on the others."""
    import jax
    message = verdict(_fixed_eight).message
    assert "zero2_sgd on 4 devices" in message and "a factor" in message, message


def _fixed_eight(p, g, lr):
    import jax
    n = jax.lax.axis_size(A)
    cols = p.shape[1] // n
    mine = jax.lax.psum_scatter(g, A, scatter_dimension=1, tiled=True) / 8
    start = jax.lax.axis_index(A) * cols
    return jax.lax.all_gather(jax.lax.dynamic_slice_in_dim(p, start, cols, axis=1) - lr * mine, A, axis=1,
                              tiled=True)


# ---- Fresh answers (issue 44), written as learners would: each wrong one fails with what differs (or its mistake,
# where the numbers confirm it); each right one in another form passes.

import jax as _jax  # noqa: E402


def _zero(by):
    def zero2_sgd(params, grads, lr):
        n = _jax.lax.axis_size("data")
        cols = params.shape[1] // n
        mine = _jax.lax.psum_scatter(grads, "data", scatter_dimension=1, tiled=True) / by(n)
        my = _jax.lax.dynamic_slice_in_dim(params, _jax.lax.axis_index("data") * cols, cols, axis=1)
        return _jax.lax.all_gather(my - lr * mine, "data", axis=1, tiled=True)
    return zero2_sgd


FRESH = [
    ("divided by jax.device_count()", _zero(lambda n: _jax.device_count()), "2x too small, a factor 4/8"),
    ("divided by n - 1", _zero(lambda n: n - 1), "a factor 8/7"),
    ("returns None", lambda p, g, lr: None, "returned None: did it forget"),
]


from fooling import fresh_test as _fresh_test  # noqa: E402

test_a_fresh_answer_gets_what_differs = _fresh_test('10.2', FRESH)
