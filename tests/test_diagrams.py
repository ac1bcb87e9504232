"""course_lib.diagrams: the DOT source each diagram produces, and its display with and without `dot`."""

import base64
import json
import os
import pathlib
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from course_lib import diagrams


def device_nodes(source: str) -> list[int]:
    return [int(m) for m in re.findall(r"^\s*dev(\d+) \[label=", source, flags=re.MULTILINE)]


def test_device_topology_has_a_node_per_device(devices):
    g = diagrams.device_topology()
    assert sorted(device_nodes(g.source)) == list(range(len(devices)))
    assert g.source.count("subgraph cluster_process") == 1
    assert f"{len(devices)} CPU devices in 1 process" in g.source
    assert g.source.count("program0 -> dev") == len(devices)


def test_device_topology_of_some_devices(devices):
    g = diagrams.device_topology(devices[2:5], title="three of them")
    assert device_nodes(g.source) == [2, 3, 4]
    assert "three of them" in g.source


def test_device_topology_needs_a_device():
    with pytest.raises(ValueError, match="at least one device"):
        diagrams.device_topology([])


needs_dot = pytest.mark.skipif(not diagrams.dot_available(),
                               reason="graphviz's `dot` is not on PATH here; ./course.sh installs it")


@needs_dot
def test_diagram_displays_svg_and_png_and_compares_as_dot_source(devices):
    g = diagrams.device_topology()
    bundle = g._repr_mimebundle_()
    assert bundle["text/plain"] == g.source
    assert "<svg" in bundle["image/svg+xml"] and "CPU 7" in bundle["image/svg+xml"]
    # The PNG is what an untrusted notebook (a fresh clone in JupyterLab) shows.
    png = base64.b64decode(bundle["image/png"])
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000


def test_diagram_without_dot_shows_source_and_install_line(monkeypatch, tmp_path, devices):
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` here
    assert not diagrams.dot_available()
    g = diagrams.device_topology()
    bundle = g._repr_mimebundle_()
    assert set(bundle) == {"text/plain"}
    assert bundle["text/plain"].startswith(g.source)
    assert "graphviz's `dot` program is missing" in bundle["text/plain"]
    assert diagrams.graphviz_install_hint() in bundle["text/plain"]


def fake_dot(tmp_path, body: str) -> None:
    """Put a `dot` on PATH that runs the shell ``body`` instead of graphviz."""
    dot = tmp_path / "dot"
    dot.write_text("#!/bin/sh\n" + body + "\n")
    dot.chmod(0o755)


def test_a_failing_dot_shows_source_and_its_error(monkeypatch, tmp_path, devices):
    fake_dot(tmp_path, 'cat >/dev/null; echo "Error: <stdin>: syntax error in line 1" >&2; exit 1')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    g = diagrams.device_topology()
    bundle = g._repr_mimebundle_()
    assert set(bundle) == {"text/plain"}
    assert bundle["text/plain"].startswith(g.source)
    assert "`dot -Tsvg` failed with exit status 1: Error: <stdin>: syntax error in line 1" in bundle["text/plain"]
    with pytest.raises(diagrams.RenderError, match="exit status 1"):
        diagrams.render(g.source, "png")


def test_a_dot_that_never_returns_is_stopped_and_the_source_shown(monkeypatch, tmp_path, devices):
    fake_dot(tmp_path, "exec sleep 60")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(diagrams, "RENDER_TIMEOUT_S", 1)
    g = diagrams.device_topology()
    start = time.monotonic()
    bundle = g._repr_mimebundle_()
    assert time.monotonic() - start < 15, "the time limit did not stop `dot`"
    assert set(bundle) == {"text/plain"}
    assert bundle["text/plain"].startswith(g.source)
    assert "did not finish within 1 s and was stopped" in bundle["text/plain"]


@pytest.mark.parametrize("system, tool, expected", [
    ("Darwin", None, "brew install graphviz"),
    ("Linux", "apt-get", "sudo apt-get install -y graphviz"),
    ("Linux", "dnf", "sudo dnf install -y graphviz"),
    ("Linux", None, "install Graphviz from https://graphviz.org/download/"),
])
def test_graphviz_install_hint_fits_the_system(monkeypatch, system, tool, expected):
    monkeypatch.setattr(diagrams.platform, "system", lambda: system)
    monkeypatch.setattr(diagrams.shutil, "which", lambda name: "/usr/bin/" + name if name == tool else None)
    assert diagrams.graphviz_install_hint().startswith(expected)


def edges(source: str, a: str, b: str) -> list[str]:
    """Labels of the edges from nodes named like ``a`` to nodes named like ``b`` (regex fragments)."""
    found = re.findall(rf'^\s*{a} -> {b} \[label=(?:"([^"]*)"|(\w+))', source, flags=re.MULTILINE)
    return [quoted or bare for quoted, bare in found]


def test_shape_str():
    assert diagrams.shape_str(jnp.zeros((8, 3))) == "f32[8,3]"
    assert diagrams.shape_str(2.0) == "f32[]"
    assert diagrams.shape_str(jax.ShapeDtypeStruct((2,), jnp.int32)) == "i32[2]"
    assert diagrams.shape_str(np.zeros(4, bool)) == "bool[4]"


def test_pmap_dataflow_mapped_and_broadcast_inputs(devices):
    x = jnp.zeros((8, 3))
    g = diagrams.pmap_dataflow(lambda x, s: x * s, x, 2.0, in_axes=(0, None), devices_shown=8)
    assert sorted(device_nodes(g.source)) == list(range(8))
    assert edges(g.source, "in0", r"dev\d+") == [f"[{i}] f32[3]" for i in range(8)]
    assert edges(g.source, "in1", r"dev\d+") == ["copy f32[]"] + [""] * 7, "one label: every copy is the same"
    assert g.source.count("style=dashed") == 8, "broadcast edges are dashed"
    assert 'out0 [label="out: f32[8,3]\\n(stacked on axis 0)"' in g.source
    assert edges(g.source, r"dev\d+", "out0") == [f"[{i}] f32[3]" for i in range(8)]
    assert 'x: f32[8,3]\\n(mapped)' in g.source and 's: f32[]\\n(broadcast)' in g.source


def test_pmap_dataflow_uses_only_as_many_devices_as_slices(devices):
    g = diagrams.pmap_dataflow(jnp.sum, jnp.zeros((4, 5)))
    assert sorted(device_nodes(g.source)) == [0, 1, 2, 3]
    assert "sum(f32[5])\\n-> f32[]" in g.source


def test_pmap_dataflow_in_axes_1_and_out_axes_1(devices):
    g = diagrams.pmap_dataflow(lambda x: x * 2, jnp.zeros((5, 8, 2)), in_axes=1, out_axes=1, devices_shown=8)
    assert edges(g.source, "in0", "dev3") == ["[3] f32[5,2]"]
    assert 'out: f32[5,8,2]\\n(stacked on axis 1)' in g.source


def test_pmap_dataflow_out_axes_none_draws_each_devices_own_copy(devices):
    g = diagrams.pmap_dataflow(lambda x: x * 2, jnp.zeros((8, 3)), out_axes=None, devices_shown=8)
    assert edges(g.source, r"dev\d+", "out0").count("its own copy") == 7
    assert edges(g.source, "dev0", "out0") == ["f32[3]"]
    assert "marked replicated, unchecked:\\nout_axes=None" in g.source


def test_pmap_dataflow_pytree_in_axes_and_outputs(devices):
    params = {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)}
    x = jnp.zeros((8, 4, 3))
    g = diagrams.pmap_dataflow(lambda p, x: {"y": x @ p["w"] + p["b"], "n": x.shape[0]}, params, x,
                               in_axes=({"w": None, "b": None}, 0), devices_shown=8)
    assert "p['b']: f32[2]\\n(broadcast)" in g.source and "p['w']: f32[3,2]\\n(broadcast)" in g.source
    assert edges(g.source, "in2", "dev5") == ["[5] f32[4,3]"]
    assert "out['y']: f32[8,4,2]" in g.source


def test_pmap_dataflow_with_a_collective(devices):
    g = diagrams.pmap_dataflow(lambda x: jax.lax.psum(x, "i"), jnp.zeros((8, 2)), axis_name="i")
    assert edges(g.source, "dev7", "out0") == ["[7] f32[2]"]


def test_pmap_dataflow_errors(devices):
    with pytest.raises(ValueError, match="no argument is mapped"):
        diagrams.pmap_dataflow(lambda x: x, jnp.zeros((8, 2)), in_axes=None)
    with pytest.raises(ValueError, match=r"different sizes \[4, 8\]"):
        diagrams.pmap_dataflow(lambda a, b: a, jnp.zeros((8,)), jnp.zeros((4,)))
    with pytest.raises(ValueError, match=r"size 16 but there are 8 devices.*Reshape to \(8, 16 // 8, ...\)"):
        diagrams.pmap_dataflow(lambda x: x, jnp.zeros((16, 3)))
    with pytest.raises(ValueError, match="one entry per argument"):
        diagrams.pmap_dataflow(lambda a, b: a, jnp.zeros(8), jnp.zeros(8), in_axes=(0,))


def test_array_placement_of_a_pmap_output(devices):
    y = jax.pmap(lambda x: x * 2)(jnp.arange(24.0).reshape(8, 3))
    g = diagrams.array_placement(y, "y", devices_shown=8)
    assert sorted(device_nodes(g.source)) == list(range(8))
    assert "y: f32[8,3], split over 8 devices" in g.source
    assert 'dev3 [label="CPU 3\\n[3:4, :]\\nf32[1,3]\\n[[18. 20. 22.]]"' in g.source, "values read from device 3"


def test_array_placement_of_replicated_and_single_device_arrays(devices):
    from course_lib import sharding
    w = jax.device_put(jnp.arange(2.0), jax.sharding.NamedSharding(sharding.device_mesh(),
                                                                   jax.sharding.PartitionSpec()))
    g = diagrams.array_placement(w, "w", devices_shown=8)
    assert "w: f32[2], a full copy on every device" in g.source
    assert g.source.count("\\n[:]\\n") == 8
    one = diagrams.array_placement(jax.device_put(jnp.ones((100,)), devices[2]), "z")
    assert device_nodes(one.source) == [2] and "on one device" in one.source
    assert "[1. 1." not in one.source, "large blocks are not printed"
    with pytest.raises(TypeError, match="needs a jax.Array"):
        diagrams.array_placement(np.ones(3))


def test_spmd_and_mpmd_overviews(devices):
    def predict(x):
        return x

    g = diagrams.spmd_overview(batch=jnp.zeros((32, 4)), program=predict, devices_shown=8)
    assert sorted(device_nodes(g.source)) == list(range(8))
    assert g.source.count("f32[4,4]") == 8 and "data f32[32,4]" in g.source
    assert "the same predict on 8 devices" in g.source
    with pytest.raises(ValueError, match="does not divide across 8 devices"):
        diagrams.spmd_overview(batch=jnp.zeros((30, 4)))

    def load(x):
        return x

    def train(x):
        return x

    m = diagrams.mpmd_overview([load, train, train])
    assert device_nodes(m.source) == [0, 1, 2] and "2 different programs on 3 devices" in m.source
    with pytest.raises(ValueError, match="2 programs for 3 devices"):
        diagrams.mpmd_overview([load, train], devices=devices[:3])


def test_collective_diagram_draws_the_values_the_devices_hold(devices):
    from course_lib import collectives as C
    xs = np.arange(8.0)
    g = diagrams.collective(jax.lax.psum, xs)
    np.testing.assert_array_equal(g.outputs, np.full(8, 28.0))
    assert 'after0 [label="CPU 0\\n28."' in g.source and 'before3 [label="CPU 3\\n3."' in g.source
    assert "before_name [label=before" in g.source and "after_name [label=after" in g.source
    assert g.source.count("-> op") == 8 and g.source.count("op -> after") == 8
    ring = diagrams.collective(jax.lax.ppermute, xs, perm=C.ring_permutation(8))
    assert 'after0 [label="CPU 0\\n7."' in ring.source, "device 0 got device 7's value"
    assert "before7 -> after0" in ring.source and "op" not in device_nodes(ring.source)
    tiled = diagrams.collective(jax.lax.all_gather, np.arange(8.0).reshape(4, 2), tiled=True)
    assert tiled.outputs.shape == (4, 8) and "(tiled=True)" in tiled.source


def test_collective_diagram_values_come_from_the_run_not_a_reference(devices):
    def not_a_real_collective(x, axis_name):
        return x * 0 + jax.lax.axis_index(axis_name)

    g = diagrams.collective(not_a_real_collective, np.zeros(4))
    assert 'after3 [label="CPU 3\\n3."' in g.source


def test_collective_diagram_errors(devices):
    with pytest.raises(ValueError, match="stacked on a leading axis"):
        diagrams.collective(jax.lax.psum, np.float32(1))
    with pytest.raises(ValueError, match="9 per-device inputs but only 8 devices"):
        diagrams.collective(jax.lax.psum, np.zeros(9))


# ---------------------------------------------------------------------------------------------------------------
# Every diagram fits JupyterLab's output area (848 px in a 1280-px window): at most MAX_WIDTH_PX, in SVG and PNG.


def rendered_width_px(g) -> tuple[float, int]:
    """The drawing's width: the SVG's in CSS px (1 pt = 4/3 px) and the PNG's in pixels."""
    bundle = g._repr_mimebundle_()
    svg_pt = float(re.search(r'<svg width="([\d.]+)pt"', bundle["image/svg+xml"]).group(1))
    png = base64.b64decode(bundle["image/png"])
    return svg_pt * 4 / 3, int.from_bytes(png[16:20], "big")


def natural_width_pt(g) -> float:
    """How wide graphviz lays the drawing out before the size limit scales it: the layout itself must fit."""
    svg = diagrams.render(g.source.replace(f'size="{diagrams.MAX_WIDTH_IN:g},40"', "")).decode()
    return float(re.search(r'<svg width="([\d.]+)pt"', svg).group(1))


def wide_diagrams(devices):
    """The widest kinds of diagram the lessons draw, on all 8 devices."""
    import optax
    from course_lib import collectives as C, data, sharding

    xs = jnp.array([3, 1, 4, 1, 5, 9, 2, 6])
    params = [{"w": jnp.zeros((64, 128)), "b": jnp.zeros(128)}, {"w": jnp.zeros((128, 10)), "b": jnp.zeros(10)}]

    def mlp_loss(p, batch, key):
        logits = jax.nn.relu(batch["x"] @ p[0]["w"] + p[0]["b"]) @ p[1]["w"] + p[1]["b"]
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]))

    x = np.zeros((200, 64), np.float32)
    y = np.zeros(200, np.int32)
    batch = next(data.batches(x, y, 128, remainder="pad"))

    def predict(params, x):
        return x @ params["w"] + params["b"]

    return {
        "device_topology": diagrams.device_topology(),
        "spmd_overview": diagrams.spmd_overview(batch=jnp.zeros((64, 3)), program=predict),
        "array_placement": diagrams.array_placement(jax.pmap(lambda v: v * 2)(jnp.arange(24.0).reshape(8, 3)), "y"),
        "replicated placement": diagrams.array_placement(sharding.replicate({"b": jnp.zeros(2)})["b"],
                                                         "replicated['b']"),
        "pmap_dataflow pytree": diagrams.pmap_dataflow(predict, {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)},
                                                       jnp.zeros((8, 4, 3)), in_axes=({"w": None, "b": None}, 0)),
        "pmap_dataflow two args": diagrams.pmap_dataflow(lambda x, s: x * s, jnp.zeros((8, 3)), 10.0,
                                                         in_axes=(0, None)),
        "psum": diagrams.collective(jax.lax.psum, xs),
        "ring ppermute": diagrams.collective(jax.lax.ppermute, xs, perm=C.ring_permutation(8)),
        "all_gather of vectors": diagrams.collective(jax.lax.all_gather, np.arange(32.0).reshape(8, 4)),
        "train_step": diagrams.train_step(mlp_loss, params, batch, optimizer_name="Adam"),
    }


@needs_dot
def test_every_kind_of_diagram_fits_jupyterlab_without_being_scaled_down(devices):
    for name, g in wide_diagrams(devices).items():
        svg_px, png_px = rendered_width_px(g)
        assert svg_px <= diagrams.MAX_WIDTH_PX + 1 and png_px <= diagrams.MAX_WIDTH_PX + 1, \
            f"{name}: {svg_px:.0f} px (SVG), {png_px} px (PNG)"
        # The layout itself fits: no diagram of the lessons relies on the size limit, which shrinks the text.
        assert natural_width_pt(g) <= diagrams.MAX_WIDTH_IN * 72 + 1, name


@needs_dot
def test_a_diagram_too_wide_for_its_layout_is_scaled_to_fit(devices):
    g = diagrams.collective(jax.lax.psum, np.arange(8.0), devices_shown=8)
    for i in range(30):                                       # a row far wider than a notebook
        g.node(f"extra{i}", "a long label that makes the drawing far too wide")
    assert natural_width_pt(g) > 2000
    svg_px, png_px = rendered_width_px(g)
    assert svg_px <= diagrams.MAX_WIDTH_PX + 1 and png_px <= diagrams.MAX_WIDTH_PX + 1


def test_devices_left_out_are_drawn_as_an_ellipsis(devices):
    from course_lib import collectives as C
    g = diagrams.collective(jax.lax.ppermute, np.arange(8.0), perm=C.ring_permutation(8), devices_shown=3)
    assert re.findall(r"^\s*before(\d+) \[", g.source, flags=re.M) == ["0", "1", "7"]
    assert 'before_more [label="... 5 more ..."' in g.source and 'after_more [label="... 5 more ..."' in g.source
    assert "before0 -> after1" in g.source and "before7 -> after0" in g.source
    assert "before1 -> after_more [color=grey60 style=dotted]" in g.source, "1 -> 2 goes to a device not drawn"
    assert "before_more -> after7 [color=grey60 style=dotted]" in g.source
    np.testing.assert_array_equal(g.outputs, np.roll(np.arange(8.0), 1)), "all 8 devices took part"
    step = diagrams.train_step(lambda p, b, k: jnp.sum(b["x"] * p), jnp.float32(1.0),
                               {"x": jnp.zeros((8, 2))}, devices_shown=2)
    assert sorted(set(re.findall(r"^\s*shard(\d+) \[", step.source, flags=re.M))) == ["0", "7"]
    assert 'shard_more [label="... 6 more ..."' in step.source


def test_all_devices_are_drawn_when_they_fit(devices):
    g = diagrams.collective(jax.lax.psum, np.arange(8.0))
    assert re.findall(r"^\s*after(\d+) \[", g.source, flags=re.M) == [str(i) for i in range(8)]
    assert "_more" not in g.source


def test_devices_shown_must_be_a_whole_number_of_at_least_two(devices):
    with pytest.raises(ValueError, match="devices_shown"):
        diagrams.collective(jax.lax.psum, np.arange(8.0), devices_shown=1)
    with pytest.raises(TypeError, match="devices_shown"):
        diagrams.array_placement(jax.pmap(lambda v: v)(jnp.arange(8.0)), devices_shown="4")


def test_device_topology_of_two_processes_names_the_global_id_and_the_local_index():
    import types
    owners = [types.SimpleNamespace(id=p * 2048 + k, process_index=p, platform="cpu", device_kind="cpu")
              for p in (0, 1) for k in range(4)]
    g = diagrams.device_topology(owners, title="a 2-process job")
    assert 'dev2049 [label="CPU id 2049\\nlocal 1"' in g.source
    assert 'dev1 [label="CPU id 1\\nlocal 1"' in g.source
    assert "global id (jax.devices()), chosen by the runtime" in g.source
    assert "jax.local_devices()[k]" in g.source
    single = diagrams.device_topology()
    assert 'dev3 [label="CPU 3"' in single.source and "local" not in single.source


def test_a_placement_of_one_number_per_device_draws_all_eight(devices):
    g = diagrams.array_placement(jax.pmap(lambda v: v * 2)(jnp.arange(8.0)), "norms_pmap")
    assert sorted(device_nodes(g.source)) == list(range(8)) and "_more" not in g.source


# ---------------------------------------------------------------------------------------------------------------
# The diagrams stored in the notebooks fit too (they are what a learner sees before running anything).

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def stored_diagram_widths(path: pathlib.Path):
    """(cell index, SVG width in CSS px, PNG width in px) of each course diagram stored in the notebook."""
    for k, cell in enumerate(json.loads(path.read_text())["cells"]):
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "image/svg+xml" not in data or not "".join(data.get("text/plain", "")).startswith("digraph"):
                continue
            svg = "".join(data["image/svg+xml"])
            width = re.search(r'<svg[^>]*\swidth="([\d.]+)(pt|px)?"', svg)
            png = base64.b64decode("".join(data.get("image/png", "")))
            yield (k, float(width.group(1)) * (4 / 3 if width.group(2) in (None, "pt") else 1.0) if width else None,
                   int.from_bytes(png[16:20], "big") if png.startswith(b"\x89PNG") else None)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_stored_diagram_fits_jupyterlabs_output_area(path):
    """JupyterLab shows a trusted notebook's SVG at its own size and cuts it at the output area's edge (848 px in
    a 1280-px window); an untrusted one shows the PNG. Both must fit."""
    for k, svg_px, png_px in stored_diagram_widths(path):
        assert svg_px is not None and png_px is not None, f"{path.name} cell {k}: a diagram without SVG width or PNG"
        assert svg_px <= diagrams.MAX_WIDTH_PX + 1 and png_px <= diagrams.MAX_WIDTH_PX + 1, (
            f"{path.name} cell {k}: a stored diagram {svg_px:.0f} px (SVG) / {png_px} px (PNG) wide, more than "
            f"{diagrams.MAX_WIDTH_PX} px; re-execute the notebook (tools/refresh_notebooks.py {path.name}): "
            "course_lib.diagrams lays diagrams out to fit")
