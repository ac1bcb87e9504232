"""Lesson 04 checkers: the reference passes; typical mistakes get feedback that names them."""

import jax
import jax.numpy as jnp

from course_lib.exercises import check
import pytest

from course_lib.exercises import exercises
from course_lib.exercises.lesson04 import (solution_gather_all, solution_global_mean_var, solution_ring_allreduce,
                                           solution_ring_allreduce_chunked, solution_rotate_right)


def ring(axis_name, shift=1):
    n = jax.lax.psum(1, axis_name)
    return [(i, (i + shift) % n) for i in range(n)]


def test_04_1_ring_allreduce():
    assert check("04.1", solution_ring_allreduce)
    uses_psum = check("04.1", lambda x, a: jax.lax.psum(x, a))
    assert "the program uses psum: the sum must be built from jax.lax.ppermute alone" in uses_psum.message

    def n_hops(x, a):
        total, passing = x, x
        for _ in range(jax.lax.psum(1, a)):
            passing = jax.lax.ppermute(passing, a, ring(a))
            total = total + passing
        return total

    fb = check("04.1", n_hops)
    assert "the sum plus its own value once more" in fb.message and "one hop too many" in fb.message
    assert "n - 1" not in fb.message and "7 hops" not in fb.message, "the number of hops is left to hint()"
    one_hop = check("04.1", lambda x, a: x + jax.lax.ppermute(x, a, ring(a)))
    assert "one hop only" in one_hop.message and "n - 1" not in one_hop.message
    wrong_name = check("04.1", lambda x, a: jax.lax.psum(x, "j"))
    assert "unbound axis name" in wrong_name.message and "Use the axis_name argument" in wrong_name.message


def test_04_2_global_mean_var():
    assert check("04.2", solution_global_mean_var)
    local = check("04.2", lambda x, a: (jnp.mean(x), jnp.var(x)))
    assert "The devices disagree" in local.message and "own shard's statistics" in local.message
    mean_of_vars = check("04.2", lambda x, a: (jax.lax.pmean(jnp.mean(x), a), jax.lax.pmean(jnp.var(x), a)))
    assert "per-device variances, each taken about its own shard's mean" in mean_of_vars.message
    not_a_pair = check("04.2", lambda x, a: jax.lax.pmean(jnp.mean(x), a))
    assert "expected a tuple of 2" in not_a_pair.message


def test_04_3_rotate_right():
    assert check("04.3", solution_rotate_right)
    left = check("04.3", lambda x, a: jax.lax.ppermute(x, a, ring(a, -1)))
    assert "rotates left" in left.message
    open_ring = check("04.3", lambda x, a: jax.lax.ppermute(x, a, [(i, i + 1) for i in range(jax.lax.psum(1, a) - 1)]))
    assert "Device 0 received nothing" in open_ring.message and "the ring is not closed" in open_ring.message
    assert "the last device's value went nowhere" in open_ring.message
    not_a_perm = check("04.3", lambda x, a: jax.lax.ppermute(x, a, [(0, 1), (1, 1)]))
    assert "must be unique" in not_a_perm.message

    def by_pmax(x, a):                  # right values through another collective: that collective is named
        n, me = jax.lax.axis_size(a), jax.lax.axis_index(a)
        return jax.lax.pmax(jnp.full((n,) + x.shape, -jnp.inf, x.dtype).at[(me + 1) % n].set(x), a)[me]

    maxed = check("04.3", by_pmax)
    assert "the program uses pmax: the rotation must be built from jax.lax.ppermute" in maxed.message, maxed.message


def test_04_4_gather_all():
    assert check("04.4", solution_gather_all)
    builtin = check("04.4", lambda x, a: jax.lax.all_gather(x, a))
    assert "the program uses all_gather" in builtin.message
    summed = check("04.4", lambda x, a: jax.lax.psum(                 # the collective it has is named, not another
        jnp.zeros((jax.lax.axis_size(a),) + x.shape, x.dtype).at[jax.lax.axis_index(a)].set(x), a))
    assert "the program uses psum:" in summed.message, summed.message

    def own_first(x, a):
        out, passing = [x], x
        for _ in range(jax.lax.psum(1, a) - 1):
            passing = jax.lax.ppermute(passing, a, ring(a, -1))
            out.append(passing)
        return jnp.stack(out)

    assert "starting with its own" in check("04.4", own_first).message
    only_self = check("04.4", lambda x, a: jnp.stack([x] * jax.lax.psum(1, a)))
    assert "nothing arrived from the other devices" in only_self.message


def test_04_raises_or_wrong_structure():
    fb = check("04.1", lambda x, a: jax.lax.ppermute(x, a, ring(a))[0, 0])
    assert not fb and "pmap(ring_allreduce)(Array float32[8]) raised" in fb.message
    fb = check("04.1", lambda x, a: (x, jax.lax.ppermute(x, a, ring(a))))
    assert not fb and "expected Array float32[8], got tuple(Array float32[8], Array float32[8])" in fb.message
    fb = check("04.2", lambda x, a: jax.lax.pmean(jnp.mean(x), "devices"))
    assert not fb and "unbound axis name" in fb.message
    fb = check("04.2", lambda x, a: {"mean": jax.lax.pmean(jnp.mean(x), a), "var": jnp.var(x)})
    assert not fb and "expected a tuple of 2" in fb.message and "got dict{'mean': Array float32[8]" in fb.message
    fb = check("04.2", lambda x, a: (jax.lax.pmean(x, a), jnp.var(x)))
    assert not fb and "the mean (output [0]): shape (8, 6) where (8,) was expected" in fb.message
    fb = check("04.3", lambda x, a: jax.lax.ppermute(x, a, [(i, i + 1) for i in range(8)]))
    assert not fb and "pmap(rotate_right)" in fb.message and "raised" in fb.message
    fb = check("04.3", lambda x, a: [x, x])
    assert not fb and "got list[Array float32[8, 2], Array float32[8, 2]]" in fb.message
    fb = check("04.4", lambda x, a: jnp.stack([x] * 8)[a])
    assert not fb and "pmap(gather_all)(Array float32[8]) raised" in fb.message
    fb = check("04.4", lambda x, a: (x,) * jax.lax.psum(1, a))
    assert not fb and "expected Array float32[8, 8], got tuple(" in fb.message


def test_04_1_says_what_its_ring_sends_and_points_to_the_bandwidth_optimal_one():
    fb = check("04.1", solution_ring_allreduce)
    assert fb and "each device sent 112 bytes for a 16-byte x: (N - 1) x V" in fb.message
    assert "2 (N - 1) / N x V = 28 bytes" in fb.message and "04.5" in fb.message


def test_04_1_added_what_it_sent_not_what_arrived():
    def added_own(x, a):
        n, total = jax.lax.axis_size(a), x
        for _ in range(n - 1):
            jax.lax.ppermute(x, a, ring(a))
            total = total + x
        return total

    assert "it added what it sent, not what arrived" in check("04.1", added_own).message


def fixed_eight(x, a):
    total, passing = x, x
    for _ in range(7):
        passing = jax.lax.ppermute(passing, a, [(i, (i + 1) % 8) for i in range(8)])
        total = total + passing
    return total


def test_answers_written_for_8_devices_fail_on_4_with_the_reason():
    fb = check("04.1", fixed_eight)
    assert not fb and "On 4 devices the device indices are 0 to 3, but the permutation names device 7" in fb.message
    assert "written for a fixed device count" in fb.message and "at most once as a source" not in fb.message
    assert "jax.lax.axis_size" not in fb.message, "the fix is left to hint()"
    fb = check("04.3", lambda x, a: jax.lax.ppermute(x, a, [(i, (i + 1) % 8) for i in range(8)]))
    assert not fb and "written for a fixed device count" in fb.message


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_a_result_in_another_float_type_is_named(dtype):
    fb = check("04.1", lambda x, a: solution_ring_allreduce(x, a).astype(dtype))
    name = jnp.dtype(dtype).name
    assert not fb and f"dtype {name} where float32 was expected" in fb.message
    fb = check("04.3", lambda x, a: solution_rotate_right(x.astype(dtype), a))
    assert not fb and f"dtype {name} where float32 was expected" in fb.message
    fb = check("04.4", lambda x, a: solution_gather_all(x, a).astype(dtype))
    assert not fb and f"dtype {name} where float32 was expected" in fb.message


def test_04_2_standard_deviation_instead_of_variance():
    fb = check("04.2", lambda x, a: (solution_global_mean_var(x, a)[0], jnp.sqrt(solution_global_mean_var(x, a)[1])))
    assert not fb and "the standard deviation of all the data" in fb.message


def test_04_4_reversed_direction_is_detected_and_the_input_shown():
    def reversed_ring(x, a):
        n, me = jax.lax.axis_size(a), jax.lax.axis_index(a)
        gathered, passing, owner = jnp.zeros((n,) + x.shape, x.dtype).at[me].set(x), x, me
        for _ in range(n - 1):
            passing = jax.lax.ppermute(passing, a, ring(a, -1))     # sends left ...
            owner = (owner - 1) % n                                 # ... but files it as if it came from the left
            gathered = gathered.at[owner].set(passing)
        return gathered

    fb = check("04.4", reversed_ring)
    assert not fb and "in the wrong rows" in fb.message and "direction" in fb.message
    assert "values differ" not in fb.message


def test_04_4_other_wrong_values_show_the_case_expected_and_got():
    fb = check("04.4", lambda x, a: jnp.stack([x] * jax.lax.axis_size(a)) * 2)
    assert not fb and fb.message.startswith("on 8 devices, per-device shape (): expected shape (8, 8) [")
    assert "got shape (8, 8) [" in fb.message and "values differ" in fb.message


def test_04_5_bandwidth_optimal_ring():
    fb = check("04.5", solution_ring_allreduce_chunked)
    assert fb and "each device sent 168 bytes for a 96-byte x: 2 (N - 1) / N x V" in fb.message
    whole = check("04.5", solution_ring_allreduce)
    assert not whole and "ran 7 ppermutes and each device sent 672 bytes for a 96-byte x: (N - 1) x V" in whole.message
    assert "the bandwidth-optimal ring sends 2 (N - 1) / N x V = 168 bytes in 14 hops of one piece" in whole.message
    builtin = check("04.5", lambda x, a: jax.lax.all_gather(jax.lax.psum_scatter(x, a, tiled=True), a, tiled=True))
    assert not builtin and "uses psum" in builtin.message or "uses reduce_scatter" in builtin.message
    assert "psum" in check("04.5", lambda x, a: jax.lax.psum(x, a)).message
    assert "returned None" in check("04.5", lambda x, a: None).message or not check("04.5", lambda x, a: None).started


def test_no_hint_or_wrong_answer_feedback_of_lesson_04_holds_solution_code():
    import inspect
    import re
    wrong = {"04.1": [fixed_eight, lambda x, a: x + jax.lax.ppermute(x, a, ring(a))],
             "04.3": [lambda x, a: jax.lax.ppermute(x, a, ring(a, -1)),
                      lambda x, a: jax.lax.ppermute(x, a, [(i, i + 1) for i in range(jax.lax.axis_size(a) - 1)])],
             "04.4": [lambda x, a: jnp.stack([x] * jax.lax.axis_size(a))]}
    for id_ in ("04.1", "04.2", "04.3", "04.4", "04.5"):
        ex = exercises()[id_]
        body = inspect.getsource(ex.solution).splitlines()[1:]
        lines = {re.sub(r"\s+", "", ln.split("#")[0]) for ln in body}
        lines = {ln for ln in lines if len(ln) >= 12}
        texts = list(ex.hints) + [check(id_, w).message for w in wrong.get(id_, [])]
        for text in texts:
            squashed = re.sub(r"\s+", "", text)
            assert not [ln for ln in lines if ln in squashed], (id_, text)
            for snippet in re.findall(r"`([^`]*)`", text):
                assert "(" not in snippet or re.fullmatch(r"[\w.]+\(\)", snippet), (id_, snippet)
        assert len(ex.hints) >= 2, f"{id_}: a ladder: a nudge, then the API or the section to read"


def test_04_1_names_the_collective_it_found():
    gathered = check("04.1", lambda x, a: jax.lax.all_gather(x, a).sum(0))
    assert not gathered and "the program uses all_gather" in gathered.message and "psum" not in gathered.message
    scattered = check("04.1", lambda x, a: jax.lax.psum(x, a) * 1.0)
    assert not scattered and "the program uses psum" in scattered.message


def test_04_1_reports_the_bytes_the_ring_actually_sent():
    def both_ways(x, a):                              # 7 hops right and 7 left: twice the traffic, still right
        n = jax.lax.psum(1, a)
        total, right, left = x, x, x
        for _ in range(n - 1):
            right = jax.lax.ppermute(right, a, ring(a))
            left = jax.lax.ppermute(left, a, ring(a, -1))
            total = total + right
        return total + 0 * left

    fb = check("04.1", both_ways)
    assert fb and "224 bytes for a 16-byte x: 14 x V" in fb.message
    assert "(N - 1) x V" in check("04.1", solution_ring_allreduce).message


def test_04_2_psum_instead_of_pmean_is_named():
    def summed(x, a):
        mean = jax.lax.psum(jnp.mean(x), a)
        return mean, jax.lax.psum(jnp.mean((x - mean) ** 2), a)

    fb = check("04.2", summed)
    assert not fb and "8 times the mean of all the data" in fb.message and "what adding the 8 shard means gives" in fb.message


def test_04_5_summed_pieces_in_the_wrong_places():
    def misfiled(x, a):                                # right reduce-scatter, result filed one piece off
        n, me = jax.lax.psum(1, a), jax.lax.axis_index(a)
        chunks = x.reshape(n, -1)
        passing = chunks[me]
        for step in range(1, n):
            passing = jax.lax.ppermute(passing, a, ring(a)) + chunks[(me - step) % n]
        total = jnp.zeros_like(chunks).at[me].set(passing)
        for step in range(1, n):
            passing = jax.lax.ppermute(passing, a, ring(a))
            total = total.at[(me - step) % n].set(passing)
        return total.reshape(x.shape)

    fb = check("04.5", misfiled)
    assert not fb and "each one is stored one piece-row off from its place" in fb.message
    wrong_sums = check("04.5", lambda x, a: x * 2)
    assert not wrong_sums and "in another order" not in wrong_sums.message


def test_a_string_returned_from_pmap_is_explained():
    fb = check("04.1", lambda x, a: "3")
    assert not fb and "not a valid JAX type" in fb.message and "returns arrays" in fb.message


def test_04_2_a_device_count_written_in_is_measured():
    def eight(x, a):
        mean = jax.lax.psum(jnp.mean(x), a) / 8
        return mean, jax.lax.psum(jnp.mean((x - mean) ** 2), a) / 8

    fb = check("04.2", eight)
    assert not fb and fb.message.startswith("on 4 devices, per-device shape (6,): expected (")
    assert "the mean (output [0]): 2x too small, a factor 4/8 (this case's 4 devices against all 8)" in fb.message
    assert "Its values are right in the other 2 cases" in fb.message


def test_04_5_sending_bfloat16_fails_and_the_gap_is_measured():
    def half_wire(x, a):
        return solution_ring_allreduce_chunked(x.astype(jnp.bfloat16), a).astype(x.dtype)

    fb = check("04.5", half_wire)
    assert not fb and "within a few roundings to bfloat16" in fb.message


def test_04_5_the_missing_all_gather_is_named():
    def reduce_scatter_only(x, a):
        n, me = jax.lax.axis_size(a), jax.lax.axis_index(a)
        chunks = x.reshape(n, -1)
        passing = chunks[me]
        for step in range(1, n):
            passing = jax.lax.ppermute(passing, a, ring(a)) + chunks[(me - step) % n]
        return jnp.zeros_like(chunks).at[(me + 1) % n].set(passing).reshape(x.shape)

    fb = check("04.5", reduce_scatter_only)
    assert not fb and "the all-gather phase" in fb.message

    def one_hop_short(x, a):       # n - 2 reduce-scatter hops, the gather's indices shifted to match
        n, me = jax.lax.axis_size(a), jax.lax.axis_index(a)
        chunks = x.reshape(n, -1)
        passing = chunks[me]
        for step in range(1, n - 1):
            passing = jax.lax.ppermute(passing, a, ring(a)) + chunks[(me - step) % n]
        out = jnp.zeros_like(chunks).at[(me + 2) % n].set(passing)
        for step in range(n - 1):
            passing = jax.lax.ppermute(passing, a, ring(a))
            out = out.at[(me + 1 - step) % n].set(passing)
        return out.reshape(x.shape)

    fb = check("04.5", one_hop_short)
    assert not fb and "values differ" in fb.message


def test_04_4_int_of_the_axis_index_is_explained():
    fb = check("04.4", lambda x, a: jnp.stack([x] * jax.lax.axis_size(a))[int(jax.lax.axis_index(a))])
    assert not fb and "no Python number yet" in fb.message


def test_04_findings_of_the_learner_runs():
    """A stacked pair passes; three ppermutes are counted; a traced perm and a line without wrap-around are named."""
    def stacked(x, a):
        mean = jax.lax.pmean(jnp.mean(x), a)
        return jnp.stack([mean, jax.lax.pmean(jnp.mean((x - mean) ** 2), a)])

    assert check("04.2", stacked)

    def three_hops(x, a):
        y = jax.lax.ppermute(jax.lax.ppermute(x, a, ring(a)), a, ring(a))
        return jax.lax.ppermute(y, a, ring(a, -1))

    assert "expected 1 ppermute, got 3" in check("04.3", three_hops).message

    def traced_perm(x, a):
        i, n = jax.lax.axis_index(a), jax.lax.axis_size(a)
        return jax.lax.ppermute(x, a, [(i, (i + 1) % n)])

    fb = check("04.3", traced_perm)
    assert "one static Python list of every (source, destination) pair" in fb.message and fb.started

    def line_of_seven(x, a):
        total, passing = x, x
        for _ in range(7):
            passing = jax.lax.ppermute(passing, a, [(i, i + 1) for i in range(7)])
            total = total + passing
        return total

    fb = check("04.1", line_of_seven)
    assert "the ring is not closed" in fb.message and "names device 7" in fb.message


def test_04_4_a_gather_that_runs_a_written_in_seven_hops_is_told_its_traffic():
    def seven_hops(x, a):            # right values on every count (extra hops resend), 7 x V on 4 devices
        n, me = jax.lax.axis_size(a), jax.lax.axis_index(a)
        out, passing, owner = jnp.zeros((n,) + x.shape, x.dtype).at[me].set(x), x, me
        for _ in range(7):
            passing = jax.lax.ppermute(passing, a, [(i, (i + 1) % n) for i in range(n)])
            owner = (owner - 1) % n
            out = out.at[owner].set(passing)
        return out

    fb = check("04.4", seven_hops)
    assert not fb and "on 4 devices your ring ran 7 ppermutes" in fb.message and "(N - 1) x V" in fb.message


def test_04_4_a_gather_that_sends_each_value_with_its_source_index_passes():
    def with_index(x, a):            # two ppermutes a hop: the value, and the id of the device it came from
        n, src, buf = jax.lax.axis_size(a), jax.lax.axis_index(a), x
        out = jnp.zeros((n,) + x.shape, x.dtype).at[src].set(x)
        for _ in range(n - 1):
            left = [(j, (j - 1) % n) for j in range(n)]
            buf, src = jax.lax.ppermute(buf, a, left), jax.lax.ppermute(src, a, left)
            out = out.at[src].set(buf)
        return out

    fb = check("04.4", with_index)
    assert fb, fb.message
