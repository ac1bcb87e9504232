"""Diagrams: graphviz pictures of devices and dataflow, drawn from real data.

Every function here reads what it draws from JAX itself (the devices a process
has, shapes from ``jax.eval_shape``, placement from an array's sharding, values
from a computation) and returns a ``Diagram``, a ``graphviz.Digraph`` that a
notebook displays as SVG, with a PNG of the same picture beside it: JupyterLab
shows stored SVG only in a trusted notebook, and a freshly cloned one is not
trusted, so it shows the PNG there (as do GitHub's viewer and Colab). Where
graphviz's ``dot`` program is missing, fails, or does not finish within
``RENDER_TIMEOUT_S`` seconds, it displays its DOT source instead, with the reason.

Under nbval the DOT source (``text/plain``) is what gets compared; the SVG
differs between graphviz versions and is masked by ``tests/nbval_sanitize.cfg``,
and nbval does not compare PNG.

Every diagram fits JupyterLab's output area (848 px wide in a 1280-px window) at a
readable size: where a row of one node per device would be wider than the layout's
budget, the first devices and the last are drawn with an ellipsis node between them
(``devices_shown`` chooses the number), and graphviz's ``size`` attribute scales down
whatever is still wider, so no picture is more than ``MAX_WIDTH_IN`` inches
(``MAX_WIDTH_PX``, 768 px) wide, in the SVG as in the PNG.
"""

from __future__ import annotations

import base64
import collections
import inspect
import platform
import shutil
import subprocess

import graphviz
import jax
import numpy as np

from . import _checks

__all__ = ["Diagram", "RenderError", "render", "RENDER_TIMEOUT_S", "MAX_WIDTH_IN", "MAX_WIDTH_PX", "dot_available",
           "graphviz_install_hint", "shape_str", "device_topology", "spmd_overview",
           "mpmd_overview", "pmap_dataflow", "array_placement", "collective", "train_step"]

# The widest a drawing may be, in inches: 8 in is 576 pt in the SVG, which a browser draws 768 px wide (1 pt =
# 4/3 px), and 768 px in the PNG (96 dpi). JupyterLab's output area is 848 px wide in a 1280-px window (the
# course's browser test measures it); a wider SVG is cut off there. Graphviz scales a larger drawing down to it
# (the ``size`` attribute).
MAX_WIDTH_IN = 8.0
MAX_WIDTH_PX = round(MAX_WIDTH_IN * 96)
# What the layout aims for before that scaling, in points (72 per inch): a little less, for the margins.
_ROW_BUDGET_PT = 540.0

# One look for the whole course.
# Boxes at least 0.6 in wide, 0.15 in apart: a row of eight "CPU k" boxes fits MAX_WIDTH_PX with room to spare.
_GRAPH_ATTR = {"fontname": "Helvetica", "fontsize": "11", "rankdir": "TB", "nodesep": "0.15",
               "size": f"{MAX_WIDTH_IN:g},40"}
_NODE_ATTR = {"fontname": "Helvetica", "fontsize": "10", "shape": "box", "style": "rounded,filled", "width": "0.6",
              "fillcolor": "white"}
_EDGE_ATTR = {"fontname": "Helvetica", "fontsize": "9"}
PLATFORM_COLOURS = {"cpu": "#dbe9f6", "gpu": "#d9f0d3", "tpu": "#fde0c5"}
# How long one `dot` run may take. The course's diagrams take well under a second.
RENDER_TIMEOUT_S = 20


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


class RenderError(RuntimeError):
    """graphviz's ``dot`` could not draw a diagram (missing, failed, or too slow)."""


def render(source: str, fmt: str = "svg", *, timeout: float | None = None) -> bytes:
    """Run graphviz's ``dot`` on DOT ``source``, with a time limit.

    Args:
      source: the DOT text, e.g. ``Diagram.source``.
      fmt: an output format of ``dot -T``: ``"svg"``, ``"png"``, ...
      timeout: seconds ``dot`` may take (default ``RENDER_TIMEOUT_S``); it is killed after that.

    Returns:
      The rendered bytes.

    Raises:
      RenderError: ``dot`` is missing, exits with an error, or does not finish in time; the
        message says which and what to do.
    """
    timeout = RENDER_TIMEOUT_S if timeout is None else timeout
    dot = shutil.which("dot")
    if dot is None:
        raise RenderError(f"graphviz's `dot` program is missing. To see the picture, install it with: "
                          f"{graphviz_install_hint()} and restart the kernel.")
    try:
        done = subprocess.run([dot, f"-T{fmt}"], input=source.encode(), capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RenderError(f"graphviz's `dot` did not finish within {timeout:g} s and was stopped. "
                          "Check that `dot -V` runs in a terminal.") from None
    except OSError as e:
        raise RenderError(f"graphviz's `dot` ({dot}) could not be started: {e.strerror or e}.") from None
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().splitlines()
        raise RenderError(f"graphviz's `dot -T{fmt}` failed with exit status {done.returncode}"
                          + (f": {why[-1]}" if why else "") + ". Check that `dot -V` runs in a terminal.")
    return done.stdout


class Diagram(graphviz.Digraph):
    """A ``graphviz.Digraph`` that displays as SVG and PNG, or as its DOT source where ``dot`` cannot draw it."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("graph_attr", dict(_GRAPH_ATTR))
        kwargs.setdefault("node_attr", dict(_NODE_ATTR))
        kwargs.setdefault("edge_attr", dict(_EDGE_ATTR))
        super().__init__(*args, **kwargs)

    def _repr_mimebundle_(self, include=None, exclude=None, **kwargs):
        # text/plain is the DOT source: nbval compares it. The PNG is for untrusted notebooks
        # (a fresh clone in JupyterLab), which do not show SVG; trusted ones show the SVG.
        try:
            svg = render(self.source, "svg").decode("utf-8")
            png = render(self.source, "png")
        except RenderError as e:
            return {"text/plain": f"{self.source}\n(This is the diagram's DOT source: {e})"}
        return {"text/plain": self.source, "image/svg+xml": svg,
                "image/png": base64.b64encode(png).decode("ascii")}


def _device_label(d: jax.Device) -> str:
    label = f"{d.platform.upper()} {d.id}"
    return label if d.device_kind.lower() == d.platform else f"{label}\\n{d.device_kind}"


def _keep_in_order(g, node_ids) -> None:
    """Lay out nodes of one rank left to right in the given order (dot would reorder them to save crossings)."""
    for a, b in zip(node_ids, node_ids[1:]):
        g.edge(a, b, style="invis")


def _label_width_pt(label: str, fontsize: float = 10.0) -> float:
    """Roughly how wide graphviz draws a box with this label, in points (Helvetica, margins included)."""
    longest = max(len(line) for line in label.replace("\\n", "\n").split("\n"))
    return max(43.2, 0.56 * fontsize * longest + 18.0)


def _devices_to_draw(n: int, widths, devices_shown, where: str, *, extra_pt: float = 0.0,
                     per_device_pt: float = 0.0) -> list[int]:
    """Which of ``n`` devices to draw: all if their row fits ``_ROW_BUDGET_PT``, else the first few and the last.

    ``widths`` is the estimated width of one device's widest node; ``devices_shown`` (an int >= 2) overrides the
    estimate; ``extra_pt`` is room the row needs besides the devices (a side node), ``per_device_pt`` room each
    device's column needs besides its node (edges passing through the row, their labels).
    """
    if devices_shown is not None:
        k = _checks.whole(devices_shown, "devices_shown", where, minimum=2,
                          fix="Pass devices_shown=2 or more (the first devices and the last), or None to fit "
                              "the width.")
    else:
        widths = list(widths)
        step = max(widths) + 10.8 + per_device_pt     # a node and the gap (nodesep) after it
        k = n
        while k > 2 and k * step + (step if k < n else 0.0) + extra_pt > _ROW_BUDGET_PT:
            k -= 1
    if k >= n:
        return list(range(n))
    return list(range(k - 1)) + [n - 1]


def _ellipsis(g, name: str, hidden: int) -> str:
    """A plain-text node standing for ``hidden`` devices that are not drawn; returns its name."""
    g.node(name, f"... {hidden} more ...", shape="plaintext", style="", fontsize="10")
    return name


def _device_row(s, prefix: str, shown: list[int], n: int, label_of, fill_of) -> list[str]:
    """Draw one rank of device nodes ``<prefix><i>`` for ``i`` in ``shown``, an ellipsis where some are left out.

    Returns the node names in drawing order (kept left to right).
    """
    s.attr(rank="same")
    for i in shown:
        s.node(f"{prefix}{i}", label_of(i), fillcolor=fill_of(i))
    names = [f"{prefix}{i}" for i in shown]
    if len(shown) < n:
        names = names[:-1] + [_ellipsis(s, f"{prefix}_more", n - len(shown)), names[-1]]
    _keep_in_order(s, names)
    return names


def device_topology(devices=None, *, title: str | None = None) -> Diagram:
    """Processes and the devices each one drives.

    Args:
      devices: devices to draw (default ``jax.devices()``: every device, of every process).
      title: a caption; by default it counts devices and processes.

    Returns:
      A ``Diagram`` with one cluster per process, holding a node for the Python
      program and one node per device, named ``dev<id>``.
    """
    devices = _checks.device_list(devices, "devices", "device_topology", described=True) or jax.devices()
    by_process = collections.defaultdict(list)
    for d in devices:
        by_process[d.process_index].append(d)
    g = Diagram("devices")
    kinds = sorted({f"{d.platform.upper()}" for d in devices})
    n_proc = len(by_process)
    caption = title or f"{len(devices)} {'/'.join(kinds)} devices in {n_proc} process{'es' if n_proc > 1 else ''}"
    if n_proc > 1:
        # Device ids are global in a multi-process job, and the runtime chooses them: they need not run 0..n-1
        # (process 1's CPU devices can be 2048, 2049, ...). Name each device by its place in its own process too.
        caption += ("\\nid: the device's global id (jax.devices()), chosen by the runtime;"
                    "\\nlocal k: jax.local_devices()[k] in its process")
    g.attr(label=caption, labelloc="t")
    for p, devs in sorted(by_process.items()):
        with g.subgraph(name=f"cluster_process{p}") as c:
            c.attr(label=f"process {p}", style="rounded", color="grey50")
            c.node(f"program{p}", "Python program\\n(one per process)", shape="note", fillcolor="#f5f5f5")
            for k, d in enumerate(sorted(devs, key=lambda d: d.id)):
                label = _device_label(d)
                if n_proc > 1:
                    label = f"{d.platform.upper()} id {d.id}\\nlocal {k}" + label[len(f"{d.platform.upper()} {d.id}"):]
                c.node(f"dev{d.id}", label, fillcolor=PLATFORM_COLOURS.get(d.platform, "white"))
                c.edge(f"program{p}", f"dev{d.id}")
    return g


_DTYPE_SHORT = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int32": "i32",
                "int64": "i64", "int16": "i16", "int8": "i8", "uint8": "u8", "uint32": "u32", "bool": "bool",
                "complex64": "c64"}


def shape_str(x) -> str:
    """``f32[8,3]``: an array's (or ``ShapeDtypeStruct``'s) dtype and shape, as JAX prints them."""
    if not hasattr(x, "dtype") and not isinstance(x, (int, float, complex, bool, list, tuple)):
        _checks.fail("shape_str", "x", "an array, a jax.ShapeDtypeStruct or a number", x,
                     "Pass e.g. np.zeros((8, 3)) or jax.ShapeDtypeStruct((8, 3), np.float32).", TypeError)
    dtype = np.dtype(x.dtype).name if hasattr(x, "dtype") else np.dtype(jax.numpy.result_type(x)).name
    return f"{_DTYPE_SHORT.get(dtype, dtype)}[{','.join(str(d) for d in np.shape(x))}]"


def _fn_name(fn) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return "lambda" if name == "<lambda>" else name


def spmd_overview(devices=None, batch=None, program=None, *, devices_shown: int | None = None) -> Diagram:
    """SPMD: one program, one shard of the data per device, one result per device.

    Args:
      devices: the devices (default ``jax.devices()``).
      batch: optional array (or ``ShapeDtypeStruct``) of shape ``(B, ...)``; the shards are
        drawn with their real shapes ``(B // n, ...)``. ``B`` must divide by ``n``.
      program: optional function whose name labels the program.
      devices_shown: how many devices to draw (the first ones and the last, with an ellipsis between);
        default: as many as fit ``MAX_WIDTH_PX``.

    Returns:
      A ``Diagram`` with nodes ``program``, ``data``, ``shard<i>``, ``dev<id>`` (for the devices drawn).
    """
    devices = _checks.device_list(devices, "devices", "spmd_overview", described=True) or jax.devices()
    if program is not None and not callable(program):
        _checks.fail("spmd_overview", "program", "a function (its name labels the program)", program,
                     "Pass the function itself, or leave program out.", TypeError)
    if batch is not None and (not hasattr(batch, "dtype") or np.ndim(batch) == 0):
        _checks.fail("spmd_overview", "batch", "an array or jax.ShapeDtypeStruct of shape (B, ...)", batch,
                     "Pass the global batch, e.g. np.zeros((64, 3), np.float32), whose axis 0 is split.",
                     TypeError if not hasattr(batch, "dtype") else ValueError)
    n = len(devices)
    by_id = {d.id: d for d in devices}
    name = _fn_name(program) if program is not None else "program"
    g = Diagram("spmd")
    g.attr(label=f"SPMD: the same {name} on {n} devices, each on its own shard of the data", labelloc="t")
    program_label = f"{name}\\n(one copy of the code)"
    if batch is not None:
        b = np.shape(batch)[0]
        if b % n:
            raise ValueError(f"spmd_overview: batch has B={b} rows on axis 0, which does not divide across {n} "
                             f"devices; pass a batch of {b - b % n or n} or {b - b % n + n} rows.")
        g.node("data", f"data {shape_str(batch)}", shape="folder", fillcolor="#fff7d6")
        shard_shape = jax.ShapeDtypeStruct((b // n,) + tuple(np.shape(batch)[1:]), batch.dtype)
    widths = [_label_width_pt(_device_label(d)) for d in devices]
    if batch is not None:
        widths.append(_label_width_pt(f"shard {n - 1}\\n{shape_str(shard_shape)}"))
    # With a batch, the program sits at the left of the shards' row, so that its edges to the devices do not
    # cross that row (each crossing edge would need room beside every shard).
    shown = _devices_to_draw(n, widths, devices_shown, "spmd_overview",
                             extra_pt=_label_width_pt(program_label) + 18.0 if batch is not None else 0.0)
    if batch is not None:
        with g.subgraph(name="shards") as row:
            row.node("program", program_label, shape="note", fillcolor="#f5f5f5")
            names = _device_row(row, "shard", shown, n, lambda i: f"shard {i}\\n{shape_str(shard_shape)}",
                                lambda i: "#fff7d6")
            row.edge("program", names[0], style="invis")
    else:
        g.node("program", program_label, shape="note", fillcolor="#f5f5f5")
    with g.subgraph(name="devices") as row:
        _device_row(row, "dev", [devices[i].id for i in shown], n, lambda i: _device_label(by_id[i]),
                    lambda i: PLATFORM_COLOURS.get(by_id[i].platform, "white"))
    for i in shown:
        d = devices[i]
        g.edge("program", f"dev{d.id}", style="dashed", color="grey40")
        if batch is not None:
            g.edge("data", f"shard{i}")
            g.edge(f"shard{i}", f"dev{d.id}")
    if len(shown) < n:
        if batch is not None:
            g.edge("data", "shard_more", style="dotted", color="grey60")
        g.edge("program", "dev_more", style="dotted", color="grey60")
    return g


def mpmd_overview(programs, devices=None) -> Diagram:
    """MPMD: a different program on each device (the contrast to SPMD).

    Args:
      programs: one function per device; their names label the boxes.
      devices: the devices (default the first ``len(programs)`` of ``jax.devices()``).
    """
    try:
        programs = list(programs)
    except TypeError:
        _checks.fail("mpmd_overview", "programs", "a list of functions, one per device", programs,
                     "Pass e.g. programs=[f, g].", TypeError)
    if not programs or not all(callable(p) for p in programs):
        _checks.fail("mpmd_overview", "programs", "a non-empty list of functions, one per device", programs,
                     "Pass e.g. programs=[f, g].", TypeError if programs else ValueError)
    devices = _checks.device_list(devices, "devices", "mpmd_overview", described=True) or jax.devices()[: len(programs)]
    if len(devices) != len(programs):
        raise ValueError(f"mpmd_overview: {len(programs)} programs for {len(devices)} devices; devices must hold one "
                         "device per program. Pass as many devices as programs.")
    g = Diagram("mpmd")
    g.attr(label=f"MPMD: {len({_fn_name(p) for p in programs})} different programs on {len(devices)} devices",
           labelloc="t")
    for i, (fn, d) in enumerate(zip(programs, devices)):
        g.node(f"program{i}", _fn_name(fn), shape="note", fillcolor="#f5f5f5")
        g.node(f"dev{d.id}", _device_label(d), fillcolor=PLATFORM_COLOURS.get(d.platform, "white"))
        g.edge(f"program{i}", f"dev{d.id}", style="dashed", color="grey40")
    return g


def _arg_names(fn, n_args):
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"arg{i}" for i in range(n_args)]


def _per_arg_axes(in_axes, n_args):
    if in_axes is None or isinstance(in_axes, int):
        return (in_axes,) * n_args
    if isinstance(in_axes, list):
        in_axes = tuple(in_axes)
    if not isinstance(in_axes, tuple) or len(in_axes) != n_args:
        raise ValueError(f"in_axes must be an int, None, or a tuple with one entry per argument ({n_args}); "
                         f"got {in_axes!r}.")
    return in_axes


def _axis_leaves(axes, arg):
    """Pair each array leaf of ``arg`` with its mapped axis (or None), given an in_axes prefix ``axes``."""
    full = jax.tree.map(lambda ax, sub: jax.tree.map(lambda _: ax, sub), axes, arg, is_leaf=lambda a: a is None)
    paths_and_leaves = jax.tree_util.tree_flatten_with_path(arg)[0]
    return [(path, leaf, ax) for (path, leaf), ax in zip(paths_and_leaves, jax.tree.leaves(full,
                                                                                            is_leaf=lambda a: a is None))]


def pmap_dataflow(fn, *args, in_axes=0, out_axes=0, axis_name=None, devices=None,
                  devices_shown: int | None = None) -> Diagram:
    """What ``jax.pmap(fn, in_axes=..., out_axes=...)(*args)`` sends to each device and gets back.

    Shapes come from ``jax.eval_shape``: nothing is computed. Mapped inputs are drawn with
    solid edges labelled with the slice each device receives, broadcast inputs (``in_axes=None``)
    with dashed edges carrying the whole value (labelled on the first device's edge: every copy is
    the same); outputs are stacked on ``out_axes``, or, for
    ``out_axes=None``, one array marked replicated whose copies pmap does not compare: printing it
    reads the first device's, and each other device keeps its own (those edges are drawn dotted).

    Args:
      fn, in_axes, out_axes, axis_name: as for ``jax.pmap`` (``in_axes`` may hold pytrees).
      *args: arrays or ``jax.ShapeDtypeStruct`` (positional arguments only).
      devices: default: the first ``n`` of ``jax.local_devices()``, ``n`` the mapped axis size.
      devices_shown: how many devices to draw (the first ones and the last, with an ellipsis between);
        default: as many as fit ``MAX_WIDTH_PX``.

    Returns:
      A ``Diagram`` with input nodes ``in<k>``, device nodes ``dev<id>`` (for the devices drawn) and output
      nodes ``out<k>``.

    Raises:
      ValueError: no argument is mapped, mapped sizes disagree, or there are more slices than devices.
    """
    if not callable(fn):
        _checks.fail("pmap_dataflow", "fn", "a function", fn, "Pass the function pmap would map.", TypeError)
    if not args:
        raise ValueError("pmap_dataflow: args must hold at least one argument of fn to map, got none. Pass them "
                         "after fn: pmap_dataflow(fn, x, ...).")
    devices = _checks.device_list(devices, "devices", "pmap_dataflow", described=True)
    names = _arg_names(fn, len(args))
    inputs = []  # (label, per-device shape string, mapped)
    sizes = set()
    for name, axes, arg in zip(names, _per_arg_axes(in_axes, len(args)), args):
        for path, leaf, ax in _axis_leaves(axes, arg):
            label = name + jax.tree_util.keystr(path)
            shape = tuple(np.shape(leaf))
            if ax is None:
                inputs.append((label, shape_str(leaf), shape_str(leaf), False))
            else:
                if not shape or not -len(shape) <= ax < len(shape):
                    fix = (f"{label} is a scalar: pass in_axes=None for it (broadcast), or give it an axis to map"
                           if not shape else f"{label} has {len(shape)} axes: pick one of them")
                    _checks.fail("pmap_dataflow", f"in_axes for {label}", f"an axis of its shape {shape}", ax,
                                 fix + ".")
                ax = ax % len(shape)
                sizes.add(shape[ax])
                per = jax.ShapeDtypeStruct(shape[:ax] + shape[ax + 1:], leaf.dtype)
                inputs.append((label, shape_str(leaf), shape_str(per), True))
    if not sizes:
        raise ValueError("pmap_dataflow: no argument is mapped (every in_axes is None); pmap needs at least one.")
    if len(sizes) > 1:
        raise ValueError(f"pmap_dataflow: the mapped axes have different sizes {sorted(sizes)}; pmap needs one size.")
    n = sizes.pop()
    available = list(jax.local_devices() if devices is None else devices)
    if n > len(available):
        raise ValueError(f"pmap_dataflow: the mapped axis has size {n} but there are {len(available)} devices; "
                         f"pmap puts exactly one slice on each device. Reshape to ({len(available)}, "
                         f"{n} // {len(available)}, ...) first (course_lib.sharding.shard).")
    devs = available[:n]

    vmapped = jax.vmap(fn, in_axes=in_axes if not isinstance(in_axes, list) else tuple(in_axes), out_axes=0,
                       axis_name=axis_name)
    out_stacked = jax.eval_shape(vmapped, *args)
    out_leaves = jax.tree_util.tree_flatten_with_path(out_stacked)[0]
    out_axes_leaves = [ax for _, _, ax in _axis_leaves(out_axes, out_stacked)]

    g = Diagram("pmap")
    g.attr(label=f"pmap({_fn_name(fn)}, in_axes={in_axes!r}, out_axes={out_axes!r}) on {n} devices", labelloc="t")
    with g.subgraph(name="inputs") as s:
        s.attr(rank="same")
        for k, (label, full, _, mapped) in enumerate(inputs):
            how = "mapped" if mapped else "broadcast"
            s.node(f"in{k}", f"{label}: {full}\\n({how})", shape="folder",
                   fillcolor="#fff7d6" if mapped else "#eeeeee")
    per_dev_in = ", ".join(per for _, _, per, _ in inputs)
    if len(_fn_name(fn)) + len(per_dev_in) > 24:      # one argument per line, so the device boxes stay narrow
        per_dev_in = ",\\n".join(per for _, _, per, _ in inputs)
    per_dev_out = ", ".join(shape_str(jax.ShapeDtypeStruct(x.shape[1:], x.dtype)) for _, x in out_leaves)

    def device_text(d):
        return f"{_device_label(d)}\\n{_fn_name(fn)}({per_dev_in})\\n-> {per_dev_out}"

    # One device's column holds its node and the labels of the edges into it and out of it, side by side. A
    # broadcast input's edges all carry the same copy: only the first is labelled, to leave room for devices.
    in_labels = [f"[{n - 1}] {per}" for _, _, per, mapped in inputs if mapped]
    out_labels = [f"[{n - 1}] " + shape_str(jax.ShapeDtypeStruct(x.shape[1:], x.dtype)) for _, x in out_leaves]
    column = max(_label_width_pt(device_text(devs[-1])),
                 sum(_label_width_pt(t, 9) for t in in_labels), sum(_label_width_pt(t, 9) for t in out_labels),
                 0.0)
    shown = _devices_to_draw(n, [column], devices_shown, "pmap_dataflow")
    shown_devs = [devs[i] for i in shown]
    by_id = {d.id: d for d in devs}
    with g.subgraph(name="devices") as s:
        _device_row(s, "dev", [d.id for d in shown_devs], n, lambda i: device_text(by_id[i]),
                    lambda i: PLATFORM_COLOURS.get(by_id[i].platform, "white"))
    for k, (label, _, per, mapped) in enumerate(inputs):
        for i, d in zip(shown, shown_devs):
            if mapped:
                g.edge(f"in{k}", f"dev{d.id}", label=f"[{i}] {per}")
            else:
                g.edge(f"in{k}", f"dev{d.id}", label=f"copy {per}" if i == shown[0] else "", style="dashed",
                       color="grey40")
        if len(shown) < n:
            g.edge(f"in{k}", "dev_more", style="dotted", color="grey60")
    with g.subgraph(name="outputs") as s:
        s.attr(rank="same")
        for k, ((path, x), ax) in enumerate(zip(out_leaves, out_axes_leaves)):
            per = jax.ShapeDtypeStruct(x.shape[1:], x.dtype)
            if ax is None:
                s.node(f"out{k}", f"out{jax.tree_util.keystr(path)}: {shape_str(per)}\\n(marked replicated, "
                       "unchecked:\\nout_axes=None)", shape="folder", fillcolor="#e5f5e0")
            else:
                ax = ax % (len(per.shape) + 1)
                full = jax.ShapeDtypeStruct(per.shape[:ax] + (n,) + per.shape[ax:], x.dtype)
                s.node(f"out{k}", f"out{jax.tree_util.keystr(path)}: {shape_str(full)}\\n(stacked on axis {ax})",
                       shape="folder", fillcolor="#e5f5e0")
    for k, ((_, x), ax) in enumerate(zip(out_leaves, out_axes_leaves)):
        per = shape_str(jax.ShapeDtypeStruct(x.shape[1:], x.dtype))
        for i, d in zip(shown, shown_devs):
            if ax is None and i > 0:
                g.edge(f"dev{d.id}", f"out{k}", label="its own copy", style="dotted", color="grey60")
            else:
                g.edge(f"dev{d.id}", f"out{k}", label=f"[{i}] {per}" if ax is not None else per)
        if len(shown) < n:
            g.edge("dev_more", f"out{k}", style="dotted", color="grey60")
    return g


def _index_str(index, shape) -> str:
    parts = []
    for sl, dim in zip(index, shape):
        start, stop, _ = sl.indices(dim)
        parts.append(":" if (start, stop) == (0, dim) else f"{start}:{stop}")
    return "[" + ", ".join(parts) + "]"


def array_placement(x, name: str = "x", max_values: int = 8, *, devices_shown: int | None = None) -> Diagram:
    """Which part of a ``jax.Array`` lives on which device, read from its sharding.

    Each device node shows the index of the block it holds in ``x`` (``[2:3, :]``), the block's
    shape, and, when the block has at most ``max_values`` elements, its values as read
    from that device. ``devices_shown`` is how many devices to draw (the first ones and the last, with
    an ellipsis between); by default as many as fit ``MAX_WIDTH_PX``.

    Returns:
      A ``Diagram`` with the node ``array`` and one node ``dev<id>`` per device drawn.
    """
    if not isinstance(x, jax.Array):
        raise TypeError(f"array_placement needs a jax.Array (on devices) as x, got {type(x).__name__}; "
                        "place it first, e.g. with jax.device_put.")
    if not isinstance(name, str):
        _checks.fail("array_placement", "name", "a string (the label)", name, "Pass e.g. name='x'.", TypeError)
    max_values = _checks.whole(max_values, "max_values", "array_placement", minimum=0)
    shards = {s.device: s for s in x.addressable_shards}
    index_map = x.sharding.devices_indices_map(x.shape)
    replicated = all(_index_str(i, x.shape) == _index_str((slice(None),) * x.ndim, x.shape)
                     for i in index_map.values())
    g = Diagram("placement")
    if len(index_map) == 1:
        how = "on one device"
    else:
        how = "a full copy on every device" if replicated else f"split over {len(index_map)} devices"
    g.attr(label=f"{name}: {shape_str(x)}, {how}", labelloc="t")
    spec = getattr(x.sharding, "spec", None)
    g.node("array", f"{name}: {shape_str(x)}" + (f"\\n{spec}" if spec is not None else ""), shape="folder",
           fillcolor="#fff7d6")
    placed = sorted(index_map, key=lambda d: d.id)

    def device_text(d):
        label = [_device_label(d), _index_str(index_map[d], x.shape)]    # the block's index in the array above
        if d in shards:
            block = shards[d].data
            label.append(shape_str(block))
            if block.size <= max_values:
                label.append(np.array2string(np.asarray(block), separator=" ").replace("\n", " "))
        return "\\n".join(label)

    texts = {d.id: device_text(d) for d in placed}
    by_id = {d.id: d for d in placed}
    shown = _devices_to_draw(len(placed), [_label_width_pt(t) for t in texts.values()], devices_shown,
                             "array_placement")
    ids = [placed[i].id for i in shown]
    with g.subgraph(name="devices") as s:
        _device_row(s, "dev", ids, len(placed), lambda i: texts[i],
                    lambda i: PLATFORM_COLOURS.get(by_id[i].platform, "white"))
    for i in ids:
        g.edge("array", f"dev{i}")
    if len(ids) < len(placed):
        g.edge("array", "dev_more", style="dotted", color="grey60")
    return g


def _values_label(values, precision: int = 3, max_values: int = 12) -> str:
    values = np.asarray(values)
    if values.size > max_values:
        return shape_str(values)
    text = np.array2string(values, precision=precision, suppress_small=True, separator=" ")
    return text.replace("\n", "\\n")


def collective(op, xs, *, axis_name: str = "i", devices=None, devices_shown: int | None = None,
               **params) -> Diagram:
    """Run a collective on the devices and draw what each device held before and after.

    ``op(x, axis_name, **params)`` is called inside ``jax.pmap`` (``jax.lax.psum``,
    ``jax.lax.all_gather``, ``jax.lax.ppermute`` with ``perm=...``, or your own function of
    ``(x, axis_name)``). The values drawn are the ones the devices hold after the real run.
    For ``ppermute`` the edges are the messages, from ``src`` to ``dst`` (an edge that
    starts or ends at the ellipsis, dotted, stands for messages of devices not drawn); for the other
    collectives every input feeds the operation and the operation feeds every output.

    Args:
      op: the collective.
      xs: per-device inputs, ``(n, ...)``: ``xs[i]`` is what device ``i`` holds before.
      axis_name: the name of the mapped axis.
      devices: default: the first ``n`` of ``jax.local_devices()``.
      devices_shown: how many devices to draw (the first ones and the last, with an ellipsis between);
        default: as many as fit ``MAX_WIDTH_PX``. All ``n`` take part in the collective either way.
      **params: passed to ``op`` (``perm``, ``tiled``, ``axis``, ...).

    Returns:
      A ``Diagram`` with nodes ``before<i>``, ``op`` (not for ppermute) and ``after<i>`` for the devices
      drawn; ``diagram.outputs`` holds every device's result, ``(n, ...)``.
    """
    if not callable(op):
        _checks.fail("collective", "op", "a function op(x, axis_name, **params)", op,
                     "Pass e.g. jax.lax.psum.", TypeError)
    if not isinstance(axis_name, str):
        _checks.fail("collective", "axis_name", "a string", axis_name, "Pass e.g. axis_name='i'.", TypeError)
    xs = np.asarray(xs)
    if xs.ndim == 0 or xs.shape[0] == 0 or xs.dtype == object:
        _checks.fail("collective", "xs", "per-device inputs stacked on a leading axis, (n_devices, ...)", xs,
                     "Stack one value per device, e.g. xs=np.arange(8.0).reshape(4, 2) for 4 devices.", ValueError)
    n = xs.shape[0]
    available = _checks.device_list(devices, "devices", "collective") or jax.local_devices()
    if n > len(available):
        raise ValueError(f"collective: {n} per-device inputs but only {len(available)} devices; xs must have at "
                         f"most {len(available)} rows on axis 0 (one per device).")
    devs = available[:n]
    outputs = jax.pmap(lambda x: op(x, axis_name, **params), axis_name=axis_name, devices=devs)(xs)
    outs = [s.data[0] for s in sorted(outputs.addressable_shards, key=lambda s: s.index[0].start or 0)]
    name = _fn_name(op)
    shown = ", ".join(f"{k}={v!r}" for k, v in params.items() if k != "perm")
    g = Diagram("collective")
    g.attr(label=f"{name} over axis '{axis_name}' on {n} devices" + (f" ({shown})" if shown else ""),
           labelloc="t", ranksep="0.6")
    rows = {"before": [_values_label(xs[i]) for i in range(n)], "after": [_values_label(v) for v in outs]}
    widths = [_label_width_pt(f"{_device_label(d)}\\n{t}") for row in rows.values() for d, t in zip(devs, row)]
    # Edges between the rows carry no labels (an arrow from "before: CPU 7" to "after: CPU 0" says 7 -> 0):
    # labels would need room beside every device.
    # Room beside the row: its name ("before"), and for ppermute a lane for the edges that wrap round past the
    # row's ends (7 -> 0 in a ring).
    shown = _devices_to_draw(n, widths, devices_shown, "collective", extra_pt=108.0 if "perm" in params else 72.0)
    for row, texts in rows.items():
        with g.subgraph(name=row) as s:
            s.node(f"{row}_name", row, shape="plaintext", style="", fontsize="11")
            names = _device_row(s, row, shown, n, lambda i: f"{_device_label(devs[i])}\\n{texts[i]}",
                                lambda i: (PLATFORM_COLOURS.get(devs[i].platform, "white") if row == "before"
                                           else "#e5f5e0"))
            s.edge(f"{row}_name", names[0], style="invis")
    g.edge("before_name", "after_name", style="invis")

    def node(row, i):
        return f"{row}{i}" if i in shown else f"{row}_more"

    if "perm" in params:
        drawn = set()
        for src, dst in params["perm"]:
            pair = (node("before", src), node("after", dst))
            if pair in drawn:
                continue
            drawn.add(pair)
            hidden = src not in shown or dst not in shown
            if hidden:
                g.edge(*pair, style="dotted", color="grey60")
            else:
                g.edge(*pair)
    else:
        g.node("op", name, shape="circle", fillcolor="#fff7d6", fontsize="11")
        for i in shown:
            g.edge(f"before{i}", "op")
            g.edge("op", f"after{i}")
        if len(shown) < n:
            g.edge("before_more", "op", style="dotted", color="grey60")
            g.edge("op", "after_more", style="dotted", color="grey60")
    g.outputs = np.asarray(outputs)
    return g


def train_step(loss_fn, params, batch, *, devices=None, optimizer_name: str = "optimizer",
               devices_shown: int | None = None) -> Diagram:
    """One data-parallel training step: per-device forward and backward, the gradient average, the update.

    Shapes come from ``jax.eval_shape`` on one device's shard of ``batch`` (nothing is computed).

    Args:
      loss_fn: ``loss_fn(params, shard, key) -> loss`` or ``(loss, aux)``, as for ``training.make_train_step``.
      params: the (unreplicated) parameters, or their ``ShapeDtypeStruct``s.
      batch: a sharded batch, each leaf ``(n, B // n, ...)``.
      devices: default: the first ``n`` of ``jax.local_devices()``.
      optimizer_name: the name shown in the update boxes.
      devices_shown: how many devices to draw (the first ones and the last, with an ellipsis between);
        default: as many as fit ``MAX_WIDTH_PX``.

    Returns:
      A ``Diagram`` with, per device ``i`` drawn, nodes ``shard<i>``, ``grad<i>``, ``update<i>``, and one node
      ``mean``.
    """
    if not callable(loss_fn):
        _checks.fail("train_step", "loss_fn", "a function loss_fn(params, shard, key)", loss_fn,
                     "Pass the loss function itself.", TypeError)
    available = _checks.device_list(devices, "devices", "train_step", described=True) or jax.local_devices()
    leaves = jax.tree_util.tree_flatten_with_path(batch)[0]
    if not leaves:
        _checks.fail("train_step", "batch", "a sharded batch with at least one array, leaves (n, B // n, ...)",
                     batch, "Pass e.g. sharding.shard({'x': x, 'y': y}).", ValueError)
    fix = "Shard the global batch first: sharding.shard(batch) turns (B, ...) into (n_devices, B // n_devices, ...)."
    for path, leaf in leaves:
        if not hasattr(leaf, "dtype") or np.ndim(leaf) < 2:
            raise ValueError(f"train_step: batch must be sharded, each leaf (n, B // n, ...), but leaf "
                             f"{jax.tree_util.keystr(path) or 'batch'} has shape {np.shape(leaf)}. {fix}")
    leading = {np.shape(leaf)[0] for _, leaf in leaves}
    n = leading.pop()
    if leading or n > len(available):
        raise ValueError(f"train_step: batch must be sharded over at most {len(available)} devices, each leaf "
                         f"(n, B // n, ...) with one n, but the leaves have {sorted(leading | {n})} on axis 0. {fix}")
    devs = list(available)[:n]
    shard = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x)[1:], x.dtype), batch)
    out, grads = jax.eval_shape(lambda p, b: jax.value_and_grad(lambda *a: _first(loss_fn(*a)))(p, b,
                                                                                         jax.random.key(0)),
                                params, shard)
    n_params = sum(int(np.prod(g.shape)) for g in jax.tree.leaves(grads))
    batch_text = "\\n".join(f"{jax.tree_util.keystr(p)[2:-2] or 'batch'} {shape_str(x)}"
                            for p, x in jax.tree_util.tree_flatten_with_path(shard)[0])
    g = Diagram("train_step")
    g.attr(label=f"one data-parallel step on {n} devices: {n_params:,} parameters, gradients averaged once",
           labelloc="t", ranksep="0.45")
    labels = {"shard": lambda i: f"{_device_label(devs[i])}: shard {i}\\n{batch_text}",
              "grad": lambda i: f"forward + backward\\nloss {shape_str(out)}\\ngrads of {len(jax.tree.leaves(grads))} "
                                "arrays",
              "update": lambda i: f"{optimizer_name} update\\nparams copy {i}"}
    colours = {"shard": "#fff7d6", "grad": "#dbe9f6", "update": "#e5f5e0"}
    widths = [_label_width_pt(label(n - 1)) for label in labels.values()]
    shown = _devices_to_draw(n, widths, devices_shown, "train_step")
    for name, label in labels.items():
        with g.subgraph(name=name) as s:
            _device_row(s, name, shown, n, label, lambda i, c=colours[name]: c)
    g.node("mean", "average over devices\\n(pmean / weighted psum)\\nsame gradients everywhere", shape="box",
           style="rounded,filled,bold", fillcolor="#fde0c5")
    for i in shown:
        g.edge(f"shard{i}", f"grad{i}")
        g.edge(f"grad{i}", "mean", label="local grads" if i == 0 else "")
        g.edge("mean", f"update{i}", label="mean grads" if i == 0 else "")
    if len(shown) < n:
        g.edge("shard_more", "grad_more", style="invis")
        g.edge("grad_more", "mean", style="dotted", color="grey60")
        g.edge("mean", "update_more", style="dotted", color="grey60")
    return g


def _first(out):
    return out[0] if isinstance(out, tuple) else out
