"""Diagrams: graphviz pictures of devices and dataflow, drawn from real data.

Every function here reads what it draws from JAX itself (the devices a process
has, shapes from ``jax.eval_shape``, placement from an array's sharding, values
from a computation) and returns a ``Diagram``, a ``graphviz.Digraph`` that a
notebook displays as SVG. Where graphviz's ``dot`` program is missing, it
displays its DOT source instead, with the line that installs graphviz.

Under nbval the DOT source (``text/plain``) is what gets compared; the SVG
differs between graphviz versions and is masked by ``tests/nbval_sanitize.cfg``.
"""

from __future__ import annotations

import collections
import platform
import shutil

import graphviz
import jax

__all__ = ["Diagram", "dot_available", "graphviz_install_hint", "device_topology"]

# One look for the whole course.
_GRAPH_ATTR = {"fontname": "Helvetica", "fontsize": "11", "rankdir": "TB", "nodesep": "0.25"}
_NODE_ATTR = {"fontname": "Helvetica", "fontsize": "10", "shape": "box", "style": "rounded,filled",
              "fillcolor": "white"}
_EDGE_ATTR = {"fontname": "Helvetica", "fontsize": "9"}
PLATFORM_COLOURS = {"cpu": "#dbe9f6", "gpu": "#d9f0d3", "tpu": "#fde0c5"}


def dot_available() -> bool:
    """Whether graphviz's ``dot`` program is on PATH."""
    return shutil.which("dot") is not None


def graphviz_install_hint() -> str:
    """The command that installs graphviz (the ``dot`` program) on this system."""
    if platform.system() == "Darwin":
        return "brew install graphviz"
    if platform.system() == "Windows":
        return "winget install graphviz  (or: conda install -c conda-forge graphviz)"
    for tool, line in [("apt-get", "sudo apt-get install -y graphviz"), ("dnf", "sudo dnf install -y graphviz"),
                       ("pacman", "sudo pacman -S graphviz"), ("apk", "sudo apk add graphviz"),
                       ("conda", "conda install -c conda-forge graphviz")]:
        if shutil.which(tool):
            return line
    return "install Graphviz from https://graphviz.org/download/ so that `dot` is on PATH"


class Diagram(graphviz.Digraph):
    """A ``graphviz.Digraph`` that displays as SVG, or as its DOT source where ``dot`` is missing."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("graph_attr", dict(_GRAPH_ATTR))
        kwargs.setdefault("node_attr", dict(_NODE_ATTR))
        kwargs.setdefault("edge_attr", dict(_EDGE_ATTR))
        super().__init__(*args, **kwargs)

    def _repr_mimebundle_(self, include=None, exclude=None, **kwargs):
        bundle = {"text/plain": self.source}
        try:
            bundle["image/svg+xml"] = self.pipe(format="svg", encoding="utf-8")
        except graphviz.ExecutableNotFound:
            bundle["text/plain"] = (
                self.source
                + "\n(graphviz's `dot` program is missing, so this is the diagram's DOT source."
                + f" To see the picture, install it with: {graphviz_install_hint()} and restart the kernel.)"
            )
        return bundle


def _device_label(d: jax.Device) -> str:
    return f"{d.platform.upper()} {d.id}\\n{d.device_kind}"


def device_topology(devices=None, *, title: str | None = None) -> Diagram:
    """Processes and the devices each one drives.

    Args:
      devices: devices to draw (default ``jax.devices()``: every device, of every process).
      title: a caption; by default it counts devices and processes.

    Returns:
      A ``Diagram`` with one cluster per process, holding a node for the Python
      program and one node per device, named ``dev<id>``.
    """
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("device_topology needs at least one device.")
    by_process = collections.defaultdict(list)
    for d in devices:
        by_process[d.process_index].append(d)
    g = Diagram("devices")
    kinds = sorted({f"{d.platform.upper()}" for d in devices})
    n_proc = len(by_process)
    g.attr(label=title or f"{len(devices)} {'/'.join(kinds)} devices in {n_proc} process{'es' if n_proc > 1 else ''}",
           labelloc="t")
    for p, devs in sorted(by_process.items()):
        with g.subgraph(name=f"cluster_process{p}") as c:
            c.attr(label=f"process {p}", style="rounded", color="grey50")
            c.node(f"program{p}", "Python program\\n(one per process)", shape="note", fillcolor="#f5f5f5")
            for d in sorted(devs, key=lambda d: d.id):
                c.node(f"dev{d.id}", _device_label(d), fillcolor=PLATFORM_COLOURS.get(d.platform, "white"))
                c.edge(f"program{p}", f"dev{d.id}")
    return g
