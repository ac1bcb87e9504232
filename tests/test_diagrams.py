"""course_lib.diagrams: the DOT source each diagram produces, and its display with and without `dot`."""

import re

import jax
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


def test_diagram_displays_svg_and_compares_as_dot_source(devices):
    g = diagrams.device_topology()
    bundle = g._repr_mimebundle_()
    assert bundle["text/plain"] == g.source
    assert "<svg" in bundle["image/svg+xml"] and "CPU 7" in bundle["image/svg+xml"]


def test_diagram_without_dot_shows_source_and_install_line(monkeypatch, tmp_path, devices):
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` here
    assert not diagrams.dot_available()
    g = diagrams.device_topology()
    bundle = g._repr_mimebundle_()
    assert "image/svg+xml" not in bundle
    assert bundle["text/plain"].startswith(g.source)
    assert "graphviz's `dot` program is missing" in bundle["text/plain"]
    assert diagrams.graphviz_install_hint() in bundle["text/plain"]


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
