"""Checks on stored notebook outputs, shared by the test suite and tools/refresh_notebooks.py."""

import json
import pathlib
import re

# Paths from the machine that ran the notebook: home folders, this checkout, kernel temp files, site-packages.
MACHINE_PATH = re.compile(r"(/work/|/root/|/home/[A-Za-z]|/Users/[A-Za-z]|/tmp/ipykernel_|C:\\\\Users|site-packages/)")
MEMORY_ADDRESS = re.compile(r"\bat 0x[0-9a-fA-F]{6,}")


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def problems(path: pathlib.Path) -> list[str]:
    """What in a notebook's stored outputs would break nbval or leak details of the machine it ran on."""
    nb = json.loads(pathlib.Path(path).read_text())
    found = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        outputs = cell.get("outputs", [])
        where = f"{pathlib.Path(path).name} cell {i}"
        if cell.get("execution_count") is None and _source(cell).strip():
            found.append(f"{where}: never executed")
        text = json.dumps(outputs)
        if MACHINE_PATH.search(text):
            found.append(f"{where}: an output holds a path from the machine it ran on: "
                         f"{MACHINE_PATH.search(text).group(0)!r}")
        if MEMORY_ADDRESS.search(text):
            found.append(f"{where}: an output holds a memory address")
        for out in outputs:
            if out.get("output_type") == "error" and "NBVAL_RAISES_EXCEPTION" not in _source(cell):
                found.append(f"{where}: stored output is an error ({out.get('ename')}: {out.get('evalue')})")
            if out.get("output_type") == "stream" and out.get("name") == "stderr" \
                    and "NBVAL_IGNORE_OUTPUT" not in _source(cell):
                found.append(f"{where}: writes to stderr (a warning?), which nbval compares: "
                             f"{''.join(out.get('text', ''))[:120]!r}")
    return found
