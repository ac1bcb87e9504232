"""Exercise 07.1 (port a pmap function with a broadcast argument and a psum output): wrong answers fail with
feedback naming their mistake; right answers written differently pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from course_lib.exercises import check


def _port(out_specs=(P("i"), P()), in_specs=(P("i"), P()), reduce=jax.lax.psum, check_vma=True, mesh=None):
    def per_device(xb, wb):
        h = jnp.tanh(xb @ wb)
        return h, reduce(h.sum(axis=0), "i") if reduce else h.sum(axis=0)

    def ported(x, w, m):
        return jax.shard_map(per_device, mesh=mesh or m, in_specs=in_specs, out_specs=out_specs,
                             check_vma=check_vma)(x, w)
    return ported


def _sum_outside(x, w, m):
    h = jax.shard_map(lambda a, c: jnp.tanh(a @ c), mesh=m, in_specs=(P("i"), P()), out_specs=P("i"))(x, w)
    return h, h.sum(axis=0)


def _pmap_kept(x, w, m):
    n = m.shape["i"]

    def per_device(xb, wb):
        h = jnp.tanh(xb @ wb)
        return h, jax.lax.psum(h.sum(axis=0), "i")
    h, total = jax.pmap(per_device, in_axes=(0, None), out_axes=(0, None), axis_name="i")(
        x.reshape(n, -1, x.shape[-1]), w)
    return h.reshape(x.shape[0], -1), total


def _short_form_in_set_mesh(x, w, m):
    def body(xb, wb):
        h = jnp.tanh(xb @ wb)
        return h, jax.lax.psum(jnp.sum(h, axis=0), "i")
    with jax.set_mesh(m):                                        # lesson 06's short form: mesh and in_specs
        return jax.shard_map(body, out_specs=(P("i"), P()))(x, w)   # come from the context and the arguments


WRONG = {
    "pmap kept, x reshaped to blocks": (_pmap_kept, ["still runs jax.pmap on stacked blocks"]),
    "rows claimed replicated": (_port(out_specs=(P(), P())), ["same on every device", "one device's block"]),
    "total stacked per device": (_port(out_specs=(P("i"), P("i"))), ["once per device", "returned it once"]),
    "sums divided by a written-in 8": (_port(reduce=lambda v, a: jax.lax.psum(v, a) * jax.lax.axis_size(a) / 8),
                                       ["Its values are right in the other case", "a factor"]),
    "no collective, check off": (_port(reduce=None, check_vma=False), ["device 0's sums only"]),
    "rows claimed replicated, check off": (_port(out_specs=(P(), P()), check_vma=False), ["one device's block"]),
    "pmean for psum": (_port(reduce=jax.lax.pmean), ["mean over the", "not their sum"]),
    "w split too": (_port(in_specs=(P("i"), P("i"))), ["w is split over 'i' too"]),
    "no shard_map": (lambda x, w, m: (jnp.tanh(x @ w), jnp.tanh(x @ w).sum(0)), ["does not use jax.shard_map"]),
    "sum outside shard_map": (_sum_outside, ["no shard_map in it combines the devices' sums"]),
    "the lesson's axis name": (_port(in_specs=(P("data"), P()), out_specs=(P("data"), P())),
                               ["its only axis is 'i'"]),
    "only the rows returned": (lambda x, w, m: _port()(x, w, m)[0], ["expected a tuple of 2"]),
    "a cast to bfloat16": (lambda x, w, m: jax.tree.map(lambda v: v.astype(jnp.bfloat16), _port()(x, w, m)),
                           ["bfloat16"]),
}


@pytest.mark.parametrize("name", WRONG)
def test_wrong_answer_is_named(name):
    answer, fragments = WRONG[name]
    fb = check("07.1", answer)
    assert not fb, name
    for fragment in fragments:
        assert fragment in fb.message, (name, fb.message)


def test_hard_coded_eight_device_mesh_fails_on_four():
    eight = jax.make_mesh((len(jax.devices()),), ("i",))
    fb = check("07.1", _port(mesh=eight))
    assert not fb and "on 4 devices" in fb.message, fb.message


def test_the_mesh_given_in_its_order():
    def rotated(x, w, m):          # the mesh's devices rotated by one: every block moves to another device
        devs = list(m.devices.flat)
        r = jax.sharding.Mesh(np.array(devs[1:] + devs[:1]), ("i",))
        return _port(mesh=r)(jax.device_put(x, NamedSharding(r, P("i"))), jax.device_put(w, NamedSharding(r, P())), r)
    fb = check("07.1", rotated)
    assert not fb and "tanh(x @ w) lives on devices [1, 2, 3, 4, 5, 6, 7, 0], in block order; expected block k on " \
        "the k-th of the devices [0, 1" in fb.message


def _psum_rows_then_sum(x, w, m):
    def body(xb, wb):
        h = jnp.tanh(jnp.einsum("bd,dk->bk", xb, wb))
        return h, jax.lax.psum(h, "i").sum(axis=0)                  # sum the blocks, then the rows
    return jax.shard_map(body, mesh=m, in_specs=(P("i", None), P(None, None)), out_specs=(P("i", None), P(None)))(x, w)


RIGHT = {
    "check_vma off, psum kept": _port(check_vma=False),
    "psum of the block, then the rows": _psum_rows_then_sum,
    "short form inside jax.set_mesh": _short_form_in_set_mesh,
    "jitted": lambda x, w, m: jax.jit(_port(), static_argnums=2)(x, w, m),
}


@pytest.mark.parametrize("name", RIGHT)
def test_right_answer_passes(name):
    fb = check("07.1", RIGHT[name])
    assert fb, (name, fb.message)


# ---- Fresh answers (issue 44), written as learners would: each wrong one fails with what differs (or its mistake,
# where the numbers confirm it); each right one in another form passes.
import pytest as _pytest  # noqa: E402
from course_lib.exercises import check as _check  # noqa: E402

import jax as _jax  # noqa: E402
import jax.numpy as _jnp  # noqa: E402
from jax.sharding import PartitionSpec as _P  # noqa: E402
from course_lib.exercises.lesson07 import solution_ported as _ported  # noqa: E402


def _fresh_port(reduce, swap=False):
    def ported(x, w, mesh):
        def per(xb, wb):
            h = _jnp.tanh(xb @ wb)
            return h, reduce(h.sum(axis=0))
        out = _jax.shard_map(per, mesh=mesh, in_specs=(_P("i"), _P()), out_specs=(_P("i"), _P()))(x, w)
        return out[::-1] if swap else out
    return ported


FRESH = [
    ("pmean times jax.device_count()", _fresh_port(lambda t: _jax.lax.pmean(t, "i") * _jax.device_count()),
     "2x too large, a factor 8/4"),
    ("outputs swapped", _fresh_port(lambda t: _jax.lax.psum(t, "i"), swap=True), "The two outputs are swapped"),
    ("returns None", lambda x, w, m: None, "returned None: did it forget"),
    ("a list, not a tuple", lambda x, w, m: list(_ported(x, w, m)), None),
]


from fooling import fresh_test as _fresh_test  # noqa: E402

test_a_fresh_answer_gets_what_differs = _fresh_test('07.1', FRESH)


def _own_mesh_of_eight(x, w, mesh):                                   # builds its own mesh of all 8 devices
    return _ported(x, w, _jax.make_mesh((8,), ("i",)))


def _fresh_specs(in_w=_P(), check=True):
    def ported(x, w, mesh):
        def per(xb, wb):
            h = _jnp.tanh(xb @ wb)
            return h, (_jax.lax.psum(h.sum(axis=0), "i") if check else h.sum(axis=0))
        return _jax.shard_map(per, mesh=mesh, in_specs=(_P("i"), in_w), out_specs=(_P("i"), _P()))(x, w)
    return ported


FRESH_CAUSES = [
    ("own mesh of 8", _own_mesh_of_eight, "its shard_map ran on a mesh of 8 devices, not on the mesh of 4"),
    ("no psum, out_specs P()", _fresh_specs(check=False), "No collective adds the devices' column sums"),
    ("w split over 'i'", _fresh_specs(in_w=_P("i")), "w is split over 'i' too"),
]


@_pytest.mark.parametrize("answer, fragment", [f[1:] for f in FRESH_CAUSES], ids=[f[0] for f in FRESH_CAUSES])
def test_a_fresh_answer_is_told_its_own_cause(answer, fragment):
    fb = _check('07.1', answer)
    assert not fb and fragment in fb.message and "_rem_singleton" not in fb.message, fb.message
    assert "w is split" not in fb.message or fragment == "w is split over 'i' too", fb.message
