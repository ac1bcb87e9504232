"""course_lib.diagrams: the DOT source each diagram produces, and its display with and without `dot`."""

import base64
import os
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
    g = diagrams.pmap_dataflow(lambda x, s: x * s, x, 2.0, in_axes=(0, None))
    assert sorted(device_nodes(g.source)) == list(range(8))
    assert edges(g.source, "in0", r"dev\d+") == [f"[{i}] f32[3]" for i in range(8)]
    assert edges(g.source, "in1", r"dev\d+") == ["copy f32[]"] * 8
    assert g.source.count("style=dashed") == 8, "broadcast edges are dashed"
    assert 'out0 [label="out: f32[8,3]\\n(stacked on axis 0)"' in g.source
    assert edges(g.source, r"dev\d+", "out0") == [f"[{i}] f32[3]" for i in range(8)]
    assert 'x: f32[8,3]\\n(mapped)' in g.source and 's: f32[]\\n(broadcast)' in g.source


def test_pmap_dataflow_uses_only_as_many_devices_as_slices(devices):
    g = diagrams.pmap_dataflow(jnp.sum, jnp.zeros((4, 5)))
    assert sorted(device_nodes(g.source)) == [0, 1, 2, 3]
    assert "sum(f32[5])\\n-> f32[]" in g.source


def test_pmap_dataflow_in_axes_1_and_out_axes_1(devices):
    g = diagrams.pmap_dataflow(lambda x: x * 2, jnp.zeros((5, 8, 2)), in_axes=1, out_axes=1)
    assert edges(g.source, "in0", "dev3") == ["[3] f32[5,2]"]
    assert 'out: f32[5,8,2]\\n(stacked on axis 1)' in g.source


def test_pmap_dataflow_out_axes_none_draws_the_dropped_values(devices):
    g = diagrams.pmap_dataflow(lambda x: x * 2, jnp.zeros((8, 3)), out_axes=None)
    assert edges(g.source, r"dev\d+", "out0").count("dropped") == 7
    assert edges(g.source, "dev0", "out0") == ["f32[3]"]
    assert "first device's value, out_axes=None" in g.source


def test_pmap_dataflow_pytree_in_axes_and_outputs(devices):
    params = {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)}
    x = jnp.zeros((8, 4, 3))
    g = diagrams.pmap_dataflow(lambda p, x: {"y": x @ p["w"] + p["b"], "n": x.shape[0]}, params, x,
                               in_axes=({"w": None, "b": None}, 0))
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
    g = diagrams.array_placement(y, "y")
    assert sorted(device_nodes(g.source)) == list(range(8))
    assert "y: f32[8,3], split over 8 devices" in g.source
    assert 'dev3 [label="CPU 3\\ny[3:4, :]\\nf32[1,3]\\n[[18. 20. 22.]]"' in g.source, "values read from device 3"


def test_array_placement_of_replicated_and_single_device_arrays(devices):
    from course_lib import sharding
    w = jax.device_put(jnp.arange(2.0), jax.sharding.NamedSharding(sharding.device_mesh(),
                                                                   jax.sharding.PartitionSpec()))
    g = diagrams.array_placement(w, "w")
    assert "w: f32[2], a full copy on every device" in g.source
    assert g.source.count("w[:]") == 8
    one = diagrams.array_placement(jax.device_put(jnp.ones((100,)), devices[2]), "z")
    assert device_nodes(one.source) == [2] and "on one device" in one.source
    assert "[1. 1." not in one.source, "large blocks are not printed"
    with pytest.raises(TypeError, match="needs a jax.Array"):
        diagrams.array_placement(np.ones(3))


def test_spmd_and_mpmd_overviews(devices):
    def predict(x):
        return x

    g = diagrams.spmd_overview(batch=jnp.zeros((32, 4)), program=predict)
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
    assert 'after0 [label="after: CPU 0\\n28."' in g.source and 'before3 [label="before: CPU 3\\n3."' in g.source
    assert g.source.count("-> op") == 8 and g.source.count("op -> after") == 8
    ring = diagrams.collective(jax.lax.ppermute, xs, perm=C.ring_permutation(8))
    assert 'after0 [label="after: CPU 0\\n7."' in ring.source, "device 0 got device 7's value"
    assert edges(ring.source, "before7", "after0") == ["7->0"] and "op" not in device_nodes(ring.source)
    tiled = diagrams.collective(jax.lax.all_gather, np.arange(8.0).reshape(4, 2), tiled=True)
    assert tiled.outputs.shape == (4, 8) and "(tiled=True)" in tiled.source


def test_collective_diagram_values_come_from_the_run_not_a_reference(devices):
    def not_a_real_collective(x, axis_name):
        return x * 0 + jax.lax.axis_index(axis_name)

    g = diagrams.collective(not_a_real_collective, np.zeros(4))
    assert 'after3 [label="after: CPU 3\\n3."' in g.source


def test_collective_diagram_errors(devices):
    with pytest.raises(ValueError, match="stacked on a leading axis"):
        diagrams.collective(jax.lax.psum, np.float32(1))
    with pytest.raises(ValueError, match="9 per-device inputs but only 8 devices"):
        diagrams.collective(jax.lax.psum, np.zeros(9))
