"""Exercise 12.1 (FSDP specs for a 2-D mesh) against answers that try to fool it.

Wrong answers come from the mistakes lesson 12 warns about (splitting over the wrong mesh axis, an axis the size does
not divide, a size written in, arrays left whole) and from answers that agree with the right one on one mesh only.
Each must fail with feedback that names its mistake; right answers written another way must pass.
"""

import jax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from course_lib.exercises import check


def _first_divisible(size_of):
    def fsdp_specs(params, mesh):
        size = size_of(mesh)
        def spec(a):
            for i, n in enumerate(a.shape):
                if n % size == 0:
                    return P(*[None] * i, "fsdp")
            return P()
        return jax.tree.map(spec, params)
    return fsdp_specs


def always_axis_0(params, mesh):
    return jax.tree.map(lambda a: P("fsdp"), params)


def nothing_split(params, mesh):
    return jax.tree.map(lambda a: P(), params)


def over_data(params, mesh):                # the mesh axis the lesson's 1-D FSDP used, on a 2-D mesh
    def spec(a):
        axis = next((i for i, n in enumerate(a.shape) if n % mesh.shape["data"] == 0), None)
        return P() if axis is None else P(*[None] * axis, "data")
    return jax.tree.map(spec, params)


def over_both_axes(params, mesh):           # plain FSDP over all devices where it fits, not hybrid sharding
    both, fsdp = mesh.shape["data"] * mesh.shape["fsdp"], mesh.shape["fsdp"]
    def spec(a):
        for size, names in ((both, ("data", "fsdp")), (fsdp, "fsdp")):
            axis = next((i for i, n in enumerate(a.shape) if n % size == 0), None)
            if axis is not None:
                return P(*[None] * axis, names)
        return P()
    return jax.tree.map(spec, params)


def matrices_only(params, mesh):
    full = _first_divisible(lambda m: m.shape["fsdp"])(params, mesh)
    return jax.tree.map(lambda a, s: s if a.ndim >= 2 else P(), params, full,
                        is_leaf=lambda x: isinstance(x, P))


def last_axis_always(params, mesh):
    return jax.tree.map(lambda a: P(*[None] * (a.ndim - 1), "fsdp"), params)


def named_shardings(params, mesh):
    return jax.tree.map(lambda s: NamedSharding(mesh, s),
                        _first_divisible(lambda m: m.shape["fsdp"])(params, mesh),
                        is_leaf=lambda x: isinstance(x, P))


def flat_list(params, mesh):
    return jax.tree.leaves(_first_divisible(lambda m: m.shape["fsdp"])(params, mesh),
                           is_leaf=lambda x: isinstance(x, P))


def axis_names_as_strings(params, mesh):
    return jax.tree.map(lambda a: "fsdp", params)


def flat_items(params, mesh):
    return {k: P(*[None] * (v.ndim - 1), "fsdp") for k, v in params.items()}


WRONG = [
    (always_axis_0, "do not divide"),                          # a conv kernel's axis 0 is 3
    (nothing_split, "stays whole on every device"),
    (over_data, "split over 'data'"),
    (over_both_axes, "plain FSDP over all the devices"),
    (_first_divisible(lambda mesh: 4), "fsdp"),                  # a size written in: right on the 2 x 4 mesh only
    (matrices_only, "stays whole on every device"),              # biases left whole
    (last_axis_always, "do not divide"),
    (named_shardings, "NamedSharding"),
    (flat_list, "shaped like params"),
    (axis_names_as_strings, "not a PartitionSpec"),
    (flat_items, "nested pytree"),                             # a learner's loop over a flat dict
]


@pytest.mark.parametrize("answer, named", WRONG, ids=[a.__name__ if hasattr(a, "__name__") else str(i)
                                                       for i, (a, _) in enumerate(WRONG)])
def test_wrong_answer_fails_and_is_named(answer, named):
    feedback = check("12.1", answer)
    assert not feedback, feedback.message
    assert named in feedback.message, feedback.message
    assert "Traceback" not in feedback.message


def test_a_size_written_in_is_caught_on_the_mesh_it_does_not_fit():
    feedback = check("12.1", _first_divisible(lambda mesh: 4))
    assert not feedback
    assert ("4 x 2 mesh" in feedback.message and "stays whole" in feedback.message) or \
           ("1 x 8 mesh" in feedback.message and "do not divide" in feedback.message), feedback.message


def _largest_divisible_axis(params, mesh):
    k = dict(zip(mesh.axis_names, mesh.axis_sizes))["fsdp"]
    out = {}
    for layer, arrays in params.items():
        out[layer] = {}
        for name, array in arrays.items():
            fits = [i for i in range(array.ndim) if array.shape[i] % k == 0]
            if not fits:
                out[layer][name] = P()
                continue
            axis = max(fits, key=lambda i: array.shape[i])
            entries = [None] * array.ndim
            entries[axis] = "fsdp"
            out[layer][name] = P(*entries)
    return out


def _last_divisible_axis(params, mesh):
    def spec(a):
        fits = [i for i, n in enumerate(a.shape) if n % mesh.shape["fsdp"] == 0]
        return P(*[("fsdp" if i == fits[-1] else None) for i in range(a.ndim)]) if fits else P()
    return jax.tree.map(spec, params)


@pytest.mark.parametrize("answer", [_largest_divisible_axis, _last_divisible_axis])
def test_right_answers_written_another_way_pass(answer):
    feedback = check("12.1", answer)
    assert feedback, feedback.message


def over_both_axes_where_all_divide(params, mesh):     # a learner's: P(("data", "fsdp")) where the 8 devices divide
    def spec(a):
        axis = next((i for i, n in enumerate(a.shape) if n % mesh.size == 0), None)
        return P() if axis is None else P(*[None] * axis, ("data", "fsdp"))
    return jax.tree.map(spec, params)


def test_the_main_mistake_is_named_before_a_leaf_left_whole():
    """A bias this answer leaves whole comes first in the tree, but splitting over 'data' is the main error."""
    feedback = check("12.1", over_both_axes_where_all_divide)
    assert not feedback
    assert "split over 'data'" in feedback.message and "stays whole" not in feedback.message, feedback.message


# ---- Fresh answers (issue 44), written as learners would: each wrong one fails with what differs (or its mistake,
# where the numbers confirm it); each right one in another form passes.

FRESH = [
    ("the size from jax.device_count()", _first_divisible(lambda mesh: jax.device_count()),
     "stays whole on every device, although its axis 0 (length 6)"),
    ("size 2 written in", _first_divisible(lambda mesh: 2), "which the 8 devices of 'fsdp' do not divide"),
    ("returns None", lambda p, m: None, "returned None: did it forget"),
]


from fooling import fresh_test as _fresh_test  # noqa: E402

test_a_fresh_answer_gets_what_differs = _fresh_test('12.1', FRESH)
