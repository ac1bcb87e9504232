"""Lesson 12 checkers: the references pass, each mistake the lesson warns about gets feedback that names it, and the
HLO reader counts what a CPU and a GPU program deliver. More wrong and right answers: tests/fool/test_fool_12_*.py."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from course_lib.exercises import check, exercises
from course_lib.exercises import lesson12 as L
from course_lib import hlo
from hint_rules import assert_hints_are_a_ladder


# ---------------------------------------------------------------------------------------------- 12.1


def test_12_1_reference_passes_on_every_mesh():
    feedback = check("12.1", L.solution_fsdp_specs)
    assert feedback, feedback.message
    for shape in ("2 x 4", "4 x 2", "1 x 8"):
        assert shape in feedback.message
    assert "gathers over ['fsdp']" in feedback.message


def test_12_1_placeholder_is_not_started():
    def fsdp_specs(params, mesh):
        ...                                    # the notebook's stub: nothing written yet

    feedback = check("12.1", fsdp_specs)
    assert not feedback and not feedback.started


def test_12_1_cases_vary_what_a_wrong_answer_could_get_right():
    cases = L._hybrid_cases()
    assert {mesh[1] for mesh, _, _ in cases} == {2, 4, 8}
    # a leaf whose only divisible axis is not the first, one that no fsdp size divides, one 4 divides but not 8
    assert any(s["out"]["w"] == (9, 10) and mesh[1] == 2 for mesh, s, _ in cases)
    assert all(s["out"]["b"] == (10,) for _, s, _ in cases)
    assert any(s["conv"]["b"] == (12,) and mesh[1] == 8 for mesh, s, _ in cases)
    assert len({type(opt).__name__ + repr(opt) for _, _, opt in cases}) == 3


# ---------------------------------------------------------------------------------------------- 12.2


def test_12_2_reference_passes():
    feedback = check("12.2", L.solution_gather_layer)
    assert feedback, feedback.message


def _psum_gather(layer):
    """Right values without an all-gather: place my slice in zeros, then psum (an all-reduce of the whole leaf)."""
    def whole(w):
        n, i = jax.lax.axis_size("data"), jax.lax.axis_index("data")
        size = w.shape[-1]
        full = jnp.zeros(w.shape[:-1] + (n * size,), w.dtype)
        return jax.lax.psum(jax.lax.dynamic_update_slice_in_dim(full, w, i * size, axis=w.ndim - 1), "data")
    return jax.tree.map(whole, layer)


@pytest.mark.parametrize("answer, expected", [
    (lambda layer: layer, "the shape of this device's slice"),
    (lambda layer: jax.tree.map(lambda w: jax.lax.all_gather(w, "data", axis=0, tiled=True), layer), "whole leaf"),
    (lambda layer: jax.tree.map(lambda w: jax.lax.all_gather(w, "data", axis=w.ndim - 1), layer), "whole leaf"),
    (lambda layer: {**layer, "w_in": jax.lax.all_gather(layer["w_in"], "data", axis=1, tiled=True),
                    "w_out": jax.lax.all_gather(layer["w_out"], "data", axis=1, tiled=True)}, "layer['b']"),
    (lambda layer: jax.tree.map(lambda w: jax.lax.stop_gradient(
        jax.lax.all_gather(w, "data", axis=w.ndim - 1, tiled=True)), layer), "all zeros"),
    (_psum_gather, "no all-gather"),
    (lambda layer: list(layer.values()), "should return a dict"),
    (lambda layer: jax.tree.map(lambda w: jax.lax.all_gather(w, "devices", axis=w.ndim - 1, tiled=True), layer),
     "axis is named 'data'"),
    (lambda layer: None, "returned None"),
    (lambda layer: jax.tree.map(lambda w: jax.lax.all_gather(w.astype(jnp.bfloat16), "data", axis=w.ndim - 1,
                                                             tiled=True), layer), "bfloat16"),
], ids=["identity", "axis-0", "not-tiled", "forgot-b", "stop-gradient", "psum-gather", "list", "axis-name", "none",
        "bfloat16"])
def test_12_2_mistakes_are_named(answer, expected):
    feedback = check("12.2", answer)
    assert not feedback
    assert expected in feedback.message, feedback.message


def test_12_2_slices_joined_in_the_wrong_order():
    """The right shape, the wrong values: the values tell."""
    def reversed_order(layer):
        def whole(w):
            slices = jax.lax.all_gather(w, "data", axis=0)           # (n, *w.shape), in device order
            return jnp.concatenate(list(slices[::-1]), axis=-1)
        return jax.tree.map(whole, layer)
    feedback = check("12.2", reversed_order)
    assert not feedback and "in device order" in feedback.message, feedback.message


@pytest.mark.parametrize("answer", [
    lambda layer: jax.tree.map(lambda w: jax.lax.all_gather(w, "data", axis=w.ndim - 1), layer),
    lambda layer: jax.tree.map(lambda w: jax.lax.all_gather(w, "data"), layer),
], ids=["last-axis", "axis-0"])
def test_12_2_untiled_gather_is_named_as_stacked(answer):
    feedback = check("12.2", answer)
    assert not feedback
    assert "stacked along a new axis" in feedback.message and "tiled" in feedback.message, feedback.message


def test_12_2_device_count_written_in_works_on_8_not_on_4():
    def eight(layer):
        def whole(w):
            slices = jax.lax.all_gather(w, "data")                     # (n, *w.shape)
            return jnp.moveaxis(slices, 0, -2).reshape(w.shape[:-1] + (8 * w.shape[-1],))
        return jax.tree.map(whole, layer)
    feedback = check("12.2", eight)
    assert not feedback
    assert "on 4 devices" in feedback.message and "assumes a number of devices" in feedback.message, feedback.message


def test_12_2_a_layer_edited_in_place_is_named_not_misread():
    def in_place(layer):
        for key in layer:
            layer[key] = jax.lax.all_gather(layer[key], "data", axis=-1, tiled=True)
        return layer
    feedback = check("12.2", in_place)
    assert not feedback and "in place" in feedback.message and "still split" not in feedback.message, \
        feedback.message


def test_12_2_leaves_that_are_not_arrays_are_named():
    feedback = check("12.2", lambda layer: {key: 0 for key in layer})
    assert not feedback and "not an array" in feedback.message and "AttributeError" not in feedback.message, \
        feedback.message



# ---------------------------------------------------------------------------------------------- 12.3


def test_12_3_reference_passes_and_matches_the_hlo():
    assert check("12.3", L.solution_predict)
    for case in L._CASES:
        assert L.measured_collectives(*case) == L.solution_predict(*case), case
    # the bias rule, measured: a bias inside the nonlinearity is gathered again under remat, one after it is not
    assert L.measured_collectives(1, 1, 1, 0, True)["all-gather"] == 4
    assert L.measured_collectives(1, 1, 0, 1, True)["all-gather"] == 3
    assert L.measured_collectives(2, 2, 1, 1, False, n_devices=4) == {"all-gather": 8, "reduce-scatter": 8,
                                                                      "all-reduce": 1}


def test_12_3_feedback_asks_rather_than_states_which_arrays_are_gathered_again():
    for mistake in L.MISTAKES_12_3:
        assert not re.search(r"(not )?(gathered|gathers) again|not all-reduced|gathered twice", mistake.feedback), \
            mistake.feedback
    assert "transpose in the backward pass" not in exercises()["12.3"].hints[-1]


def test_12_3_a_left_out_kind_or_a_negative_count_is_named():
    def predict(*case):
        return {k: v for k, v in L.solution_predict(*case).items() if k != "reduce-scatter"}
    feedback = check("12.3", predict)
    assert not feedback and "leaves out 'reduce-scatter'" in feedback.message and "you predicted" not in \
        feedback.message, feedback.message
    feedback = check("12.3", lambda *case: {**L.solution_predict(*case), "all-reduce": -1})
    assert not feedback and "0 or more" in feedback.message, feedback.message


def test_12_3_placeholder_is_not_started():
    def predict(n_layers, matrices, inner_biases, outer_biases, remat):
        ...                                    # the notebook's stub: nothing written yet

    feedback = check("12.3", predict)
    assert not feedback and not feedback.started


def test_12_3_the_old_two_argument_signature_is_named():
    feedback = check("12.3", lambda n_layers, arrays_per_layer: {})
    assert not feedback and "TypeError" in feedback.message and "predict(" in feedback.message, feedback.message


# ---------------------------------------------------------------------------------------------- hints and reading


@pytest.mark.parametrize("id_", ["12.1", "12.2", "12.3"])
def test_hints_are_a_ladder_without_solution_code(id_):
    assert_hints_are_a_ladder(id_)
    assert len(exercises()[id_].hints) >= 3


def test_last_hints_point_to_the_mechanism_not_the_numbers():
    last = exercises()["12.3"].hints[-1]
    assert not re.search(r"\b(twice|once|double|2 x|times the)\b", last), last
    assert "jax.checkpoint" in last and "transpose" in last
    assert "axis=" not in exercises()["12.2"].hints[-1] and "last axis" not in exercises()["12.2"].hints[-1]


def test_compiled_collectives_counts_loop_iterations():
    found = L.compiled_collectives(L._bias_stack_text(4, 1, 0, 0, True, 8))
    assert found["all-gather"][0] == 8 and found["reduce-scatter"][0] == 4
    # bytes: each all-gather returns a whole (16, 16) float32 matrix
    assert found["all-gather"][1] == 8 * 16 * 16 * 4
    assert L.compiled_collectives("") == {}


# The exact line formats of XLA's GPU programs, from shared/hardware/measured.md section 3 (8 H200s, JAX 0.11.2).
GPU_HLO = """ENTRY %main {
  %all-reduce-start = ((f32[19211]{0}), f32[19211]{0}) all-reduce-start(%p), channel_id=1
  %all-reduce-done = f32[19211]{0} all-reduce-done(%all-reduce-start)
  %all-gather-start = ((f32[8]{0}, f32[8]{0}, f32[8,192]{1,0}, f32[8,64]{1,0}, f32[32,64]{1,0}, f32[8,256]{1,0}), \
(f32[64]{0}, f32[64]{0}, f32[64,192]{1,0}, f32[64,64]{1,0}, f32[256,64]{1,0}, f32[64,256]{1,0})) all-gather-start(%q)
  %all-gather-done = (f32[64]{0}, f32[64]{0}) all-gather-done(%all-gather-start)
  %reduce-scatter-start = ((f32[1024,1024]{1,0}), f32[128,1024]{1,0}) reduce-scatter-start(%gemm_fusion_dot.2), \
channel_id=3, replica_groups=mesh['axis_0'=8] {'axis_0'}, dimensions={0}
  %reduce-scatter-done = f32[128,1024]{1,0} reduce-scatter-done(%reduce-scatter-start)
}"""


def test_async_start_ops_count_once_and_only_their_results():
    found = L.compiled_collectives(GPU_HLO)
    assert found["all-reduce"] == (1, 19211 * 4)                       # not 153,688: the operands are not counted
    assert found["all-gather"] == (1, (64 + 64 + 64 * 192 + 64 * 64 + 256 * 64 + 64 * 256) * 4)
    assert found["reduce-scatter"] == (1, 128 * 1024 * 4)


def test_the_lessons_reader_is_the_checkers_reader():
    """The notebook's collectives_per_step and the checkers' compiled_collectives give the same answer."""
    import json
    import pathlib
    notebook = pathlib.Path(__file__).resolve().parent.parent / "notebooks" / "12_capstone_transformer.ipynb"
    nb = json.loads(notebook.read_text())
    source = next("".join(c["source"]) for c in nb["cells"] if "def collectives_per_step" in "".join(c["source"]))
    read = _lessons_reader(source)
    text = L._bias_stack_text(2, 2, 1, 1, True, 8)
    assert read(GPU_HLO) == L.compiled_collectives(GPU_HLO)
    assert read(text) == L.compiled_collectives(text)


def _lessons_reader(source):
    """The lesson's reader: collectives_per_step (section 3), after Going further's as_sync for async ops."""
    namespace = {}
    exec("import collections, re\nimport numpy as np\n" + source[: source.index("with jax.set_mesh")], namespace)
    sync = _notebook_cell("def as_sync")
    exec(sync[: sync.index("\nslices = ")], namespace)
    return lambda text: namespace["collectives_per_step"](namespace["as_sync"](text))


# Forms the expert review found miscounted: the dedicated -start ops typed flat (operand, result, u32[], u32[]),
# and trailing context scalars after the results.
FLAT_HLO = """ENTRY %main {
  %collective-permute-start = (f32[64,64]{1,0}, f32[64,64]{1,0}, u32[], u32[]) collective-permute-start(%p), \
channel_id=1, source_target_pairs={{0,1},{1,0}}
  %collective-permute-done = f32[64,64]{1,0} collective-permute-done(%collective-permute-start)
  %all-gather-start = ((f32[8]{0}), f32[64]{0}, s32[]) all-gather-start(%q), dimensions={0}
  %all-gather-start.1 = (f32[8,4]{1,0}, f32[64,4]{1,0}) all-gather-start(%r), dimensions={0}
  %all-reduce-start = (f32[8]{0}, f32[3,5]{1,0}) all-reduce-start(%s, %t), to_apply=%add
  %all-reduce = (f32[8]{0}, f32[16]{0}) all-reduce(%s, %u), to_apply=%add
}"""


def test_flat_start_ops_and_context_scalars_count_only_the_result():
    found = L.compiled_collectives(FLAT_HLO)
    assert found["collective-permute"] == (1, 64 * 64 * 4)        # not 32,776: operand and scalars dropped
    assert found["all-gather"] == (2, 64 * 4 + 64 * 4 * 4)        # not 260 for the first: s32[] is context
    assert found["all-reduce"] == (2, (8 + 15) * 4 + (8 + 16) * 4)  # a result tuple counts whole
    assert hlo._results_of("(f32[64,64]{1,0}, f32[64,64]{1,0}, u32[], u32[])", "collective-permute", True) \
        .strip() == "f32[64,64]{1,0}"


def _notebook_cell(marker):
    import json
    import pathlib
    notebook = pathlib.Path(__file__).resolve().parent.parent / "notebooks" / "12_capstone_transformer.ipynb"
    nb = json.loads(notebook.read_text())
    return next("".join(c["source"]) for c in nb["cells"] if marker in "".join(c["source"]))


def test_the_lessons_reader_reads_flat_start_ops_like_the_checkers():
    assert _lessons_reader(_notebook_cell("def collectives_per_step"))(FLAT_HLO) == L.compiled_collectives(FLAT_HLO)


SCAN_BODY_GATHER = ("  %all-gather.3 = f32[16,16]{1,0} all-gather(%p), channel_id=4, "
                    "replica_groups=mesh['axis_0'=8] {'axis_0'}, dimensions={1}\n"
                    "  %all-gather.4 = f32[16]{0} all-gather(%q), channel_id=5, "
                    "replica_groups=mesh['data'=2,'fsdp'=4] {'fsdp'}, dimensions={0}\n")


def test_scan_body_axis_0_groups_read_as_all_devices():
    assert L.gather_axes(SCAN_BODY_GATHER) == {"all 8 devices", "fsdp"}
    source = _notebook_cell("def over(")
    start = source.index("GROUPS = ")
    namespace = {}
    exec("import re\n" + source[start: source.index("with jax.set_mesh(mesh2d)")], namespace)
    found = namespace["GROUPS"].findall(SCAN_BODY_GATHER)
    assert [namespace["over"](mesh, axes) for _, _, mesh, axes in found] == ["all 8 devices", "fsdp"]
