"""Reading XLA's compiled program (``jax.jit(f).lower(x).compile().as_text()``): how many of each collective one
call runs, loop iterations counted, and the mesh axes its all-gathers run over. Lesson 12's ``collectives_per_step``
does the same by hand; the exercise checkers of lesson 12 use this.

    compiled_collectives(text)   # {"all-gather": (runs per call, bytes of their results per device), ...}
    gather_axes(text)            # {"fsdp"}: the mesh axes the all-gathers run over
"""

from __future__ import annotations

import collections
import re

import numpy as np


_COLLECTIVE = re.compile(r"= (.+?) (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
                         r"(-start)?\(")
_BYTES = {"f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2, "f64": 8, "s64": 8, "pred": 1, "s8": 1, "u8": 1}


def _results_of(type_text: str, kind: str, is_start: bool) -> str:
    """What a collective delivers, from its HLO type. A synchronous op's type is its result (one array, or a tuple
    that XLA's combiner merged: all count). An async ``-start`` op is typed ``((operands...), results..., context...)``
    or, for the dedicated ``all-gather-start``/``collective-permute-start``, flat ``(operand, result, u32[], u32[])``:
    the second element is the result; later elements are the runtime's context scalars. ``all-reduce-start``'s type
    may be its result alone (one array, or a flat tuple of results)."""
    if not (is_start and type_text.startswith("(")):
        return type_text
    parts, depth, begin = [], 0, 1
    for i, ch in enumerate(type_text):
        depth += (ch in "([{") - (ch in ")]}")
        if (ch == "," and depth == 1) or depth == 0:
            parts.append(type_text[begin:i].strip())
            begin = i + 1
        if depth == 0:
            break
    if len(parts) < 2 or (kind == "all-reduce" and not parts[0].startswith("(")):
        return type_text
    return parts[1]


def compiled_collectives(text: str) -> dict[str, tuple[int, int]]:
    """``{kind: (ops run per call, bytes of their results per device)}`` from compiled HLO text.

    A collective inside a ``while`` loop's body (a compiled ``lax.scan``) counts once per iteration, read from the
    loop's ``known_trip_count``. Of an async ``-start`` op (a GPU program) only its result counts, not its operands
    or context scalars; one op counts once however many arrays it carries. Example:
    ``compiled_collectives(jax.jit(f).lower(x).compile().as_text())``.
    """
    trips = {body: int(n) for body, n in
             re.findall(r'body=%?([\w.\-]+).*?"known_trip_count":\{"n":"(\d+)"\}', text)}
    found: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    runs = 1
    for line in text.splitlines():
        if line and not line.startswith(" "):
            name = re.match(r"(?:ENTRY )?%?([\w.\-]+)", line)
            runs = trips.get(name.group(1), 1) if name else 1
        hit = _COLLECTIVE.search(line)
        if hit:
            shapes = re.findall(r"(\w+)\[([\d,]*)\]", _results_of(hit.group(1), hit.group(2), bool(hit.group(3))))
            nbytes = sum(_BYTES.get(t, 4) * int(np.prod([int(d) for d in dims.split(",") if d]))
                         for t, dims in shapes)
            found[hit.group(2)][0] += runs
            found[hit.group(2)][1] += runs * nbytes
    return {kind: (v[0], v[1]) for kind, v in sorted(found.items())}


def gather_axes(text: str) -> set[str]:
    """The mesh axes the all-gathers of compiled HLO text run over (from ``replica_groups=mesh[...] {axes}``).

    Inside a loop body (a compiled ``lax.scan``) XLA may print the groups over a flattened mesh,
    ``mesh['axis_0'=8] {'axis_0'}``: every device of that mesh in one group, read as ``"all N devices"``."""
    axes = set()
    for mesh, group in re.findall(r"all-gather(?:-start)?\(.*?replica_groups=mesh\[([^\]]*)\] \{([^}]*)\}", text):
        names = {a.strip().strip("'") for a in group.split(",") if a.strip()}
        if names and all(re.fullmatch(r"axis_\d+", a) for a in names):
            sizes = dict(re.findall(r"'?([\w]+)'?=(\d+)", mesh))
            names = {f"all {int(np.prod([int(sizes.get(a, 1)) for a in names]))} devices"}
        axes |= names
    return axes
