"""Exercise 08.3 (the global batch from this process's rows): wrong answers fail with feedback naming their
mistake; right answers written differently pass. The checker also runs each answer as either process of a
simulated 2-process job."""

import jax
import numpy as np
import pytest
from jax import make_array_from_process_local_data
from jax.sharding import NamedSharding, PartitionSpec as P

from course_lib.exercises import check


def _make(spec=P("data"), shape=None):
    def global_batch(local_rows, mesh):
        rows = local_rows.shape[0] * jax.process_count() if shape is None else shape(local_rows)
        return jax.make_array_from_process_local_data(NamedSharding(mesh, spec), local_rows,
                                                      (rows,) + local_rows.shape[1:])
    return global_batch


_MK_EARLY = jax.make_array_from_process_local_data


def _imported_name(local_rows, mesh):
    shape = (local_rows.shape[0] * jax.process_count(),) + local_rows.shape[1:]
    return make_array_from_process_local_data(NamedSharding(mesh, P("data")), local_rows, shape)


def _list_shape(local_rows, mesh):
    return jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), local_rows,
                                                  [local_rows.shape[0] * jax.process_count(), 3])


WRONG = {
    "the local shape as the global one": (_make(shape=lambda r: r.shape[0]), ["the shape of this process's own rows"]),
    "device_put, no make_array": (lambda r, m: jax.device_put(r, NamedSharding(m, P("data"))),
                                  ["without calling"]),
    "replicated": (_make(spec=P()), ["expected axis 0 split over the mesh axis 'data'"]),
    "an imported name": (_imported_name, ["by a name imported or saved from jax"]),
    "a name saved early": (lambda r, m: _MK_EARLY(NamedSharding(m, P("data")), r, (r.shape[0] * 2, *r.shape[1:])),
                           ["local_data (as _MK_EARLY) by a name"]),
    "rows times the local devices": (_make(shape=lambda r: r.shape[0] * jax.local_device_count()),
                                     ["the number of processes, then every other axis"]),
    "two processes hard-coded": (_make(shape=lambda r: r.shape[0] * 2), ["no number written in"]),
    "the shape as a list": (_list_shape, ["a tuple of ints"]),
    "a cast to float16": (lambda r, m: _make()(r.astype(np.float16), m), ["dtype float16 where float32"]),
    "the stacked pmap layout": (lambda r, m: jax.make_array_from_process_local_data(
        NamedSharding(m, P("data")), r.reshape(m.size, -1, r.shape[1]),
        (m.size, r.shape[0] * jax.process_count() // m.size, r.shape[1])), ["stacked (n, B // n, ...) layout"]),
}


@pytest.mark.parametrize("name", WRONG)
def test_wrong_answer_is_named(name):
    answer, fragments = WRONG[name]
    fb = check("08.3", answer)
    assert not fb, name
    for fragment in fragments:
        assert fragment in fb.message, (name, fb.message)


def _inferred_shape(local_rows, mesh):
    return jax.make_array_from_process_local_data(jax.NamedSharding(mesh, jax.P("data", None)), local_rows)


def _from_device_counts(local_rows, mesh):
    processes = jax.device_count() // jax.local_device_count()
    shape = (local_rows.shape[0] * processes, *local_rows.shape[1:])
    return jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), local_rows, shape)


@pytest.mark.parametrize("answer", [_inferred_shape, _from_device_counts])
def test_right_answer_passes(answer):
    fb = check("08.3", answer)
    assert fb, fb.message


def test_rows_of_any_rank():
    """An answer that writes in two axes (rows, width) fails on the checker's 3-D rows, naming their shape."""
    fb = check("08.3", lambda r, m: jax.make_array_from_process_local_data(
        NamedSharding(m, P("data")), r, (r.shape[0] * jax.process_count(), r.shape[1])))
    assert not fb and "shape (8, 2, 3)" in fb.message and "however many there are" in fb.message


# ---- Fresh answers (issue 44), written as learners would: each wrong one fails with what differs (or its mistake,
# where the numbers confirm it); each right one in another form passes.

FRESH = [
    ("rows times jax.device_count()", _make(shape=lambda r: r.shape[0] * jax.device_count()),
     "times 8, the number of devices: a process feeds all of its devices"),
    ("rows times a written-in 2", _make(shape=lambda r: r.shape[0] * 2), "the number of processes, then every other"),
    ("split over the second axis", _make(spec=P(None, "data")), "Split the batch's rows (axis 0)"),
    ("returns None", lambda r, m: None, "returned None: did it forget"),
    ("P('data', None) written out", _make(spec=P("data", None)), None),
]


from fooling import fresh_test as _fresh_test  # noqa: E402

test_a_fresh_answer_gets_what_differs = _fresh_test('08.3', FRESH)
