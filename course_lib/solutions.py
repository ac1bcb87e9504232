"""Reference solutions as code to paste, and the switch that withholds them in a class.

``code("02.1")`` is the reference solution of exercise 02.1 as a learner pastes it into the exercise cell:
the function under the stub's own name (``split_batch``, not ``solution_split_batch``), after the imports it
needs. ``solution(id)`` prints it; the instructor and nbgrader copies (tools/copies.py) put it in the cells.

Withholding: ``COURSE_SOLUTIONS=off`` in the environment (a JupyterHub sets it for everyone), or a file
``course_settings.json`` holding ``{"solutions": "off"}`` in the notebook's folder (what ``./course.sh student``
writes next to the notebooks), makes ``solution()`` print no code. The environment wins over the file. This
is a classroom convention, not a lock: course_lib's source, checkers and reference solutions included, is on
every learner's disk.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import json
import os
import pathlib
import sys
import textwrap

SETTINGS_FILE = "course_settings.json"
_OFF = {"off", "0", "false", "no", "withheld", "hidden"}
_ON = {"on", "1", "true", "yes", "shown"}

# The name of each exercise's stub in its notebook (``def split_batch(x, n): ...``). tests/test_class_kit.py
# checks this table against the notebooks.
STUB_NAMES = {
    "00.1": "on_device_3", "00.2": "device_ids",
    "01.1": "split_across", "01.2": "batched_norms", "01.3": "norms_on_devices",
    "02.1": "split_batch", "02.2": "sum_of_squares", "02.3": "block_on",
    "03.1": "scale_on_two", "03.2": "predict_all", "03.3": "device_axis_last", "03.4": "smap_predict",
    "04.1": "ring_allreduce", "04.2": "global_mean_var", "04.3": "rotate_right", "04.4": "gather_all",
    "04.5": "ring_allreduce_chunked",
    "05.1": "dp_step", "05.2": "max_divergence", "05.3": "masked_mse",
    "06.1": "place", "06.2": "stats_out_specs",
    "07.1": "ported", "07.2": "make_sharded_step",
    "08.1": "process_rows", "08.2": "local_part", "08.3": "global_batch",
    "09.1": "ms_per_step", "09.2": "fit_dispatch_and_step",
    "10.1": "zero_bytes", "10.2": "zero2_sgd", "10.3": "choose_k", "10.4": "make_fsdp_step", "10.5": "predict",
    "11.1": "restore_onto", "11.2": "collective_fraction", "11.3": "stalled_step", "11.4": "restore_resharded",
    "12.1": "fsdp_specs", "12.2": "gather_layer", "12.3": "predict",
    "13.1": "predict_state_bytes",
}


def _setting_from_file(folder: pathlib.Path | None = None) -> str | None:
    f = (folder or pathlib.Path.cwd()) / SETTINGS_FILE
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = data.get("solutions") if isinstance(data, dict) else None
    return str(value).strip().lower() if value is not None else None


def withheld() -> bool:
    """Whether the instructor has withheld the solutions: ``COURSE_SOLUTIONS=off``, else ``course_settings.json``."""
    env = os.environ.get("COURSE_SOLUTIONS", "").strip().lower()
    if env in _OFF:
        return True
    if env in _ON:
        return False
    return _setting_from_file() in _OFF


def withheld_message(id: str) -> str:
    return (f"[{id}] The instructor has withheld the solutions in this class, so solution({id!r}) shows no code. "
            f"hint({id!r}) still gives the next hint, and check({id!r}, your_function) says what differs.")


def _import_lines(module) -> dict[str, str]:
    """Each name the module's top-level imports bind, and the import statement that binds it alone."""
    lines = {}
    tree = ast.parse(inspect.getsource(module))
    for node in tree.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                bound = a.asname or a.name.split(".")[0]
                lines[bound] = f"import {a.name}" + (f" as {a.asname}" if a.asname else "")
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            source = node.module or ""
            if node.level:  # relative (``from .. import profile``): spelled out, as a learner's cell needs it
                package = module.__name__.split(".")[:-node.level] if module.__name__.count(".") >= node.level \
                    else []
                source = ".".join(package + ([node.module] if node.module else []))
            for a in node.names:
                bound = a.asname or a.name
                lines[bound] = f"from {source} import {a.name}" + (f" as {a.asname}" if a.asname else "")
    return lines


def _free_names(tree: ast.AST) -> set[str]:
    """Names a function's code reads but does not bind itself (arguments, assignments, imports, nested defs)."""
    bound, loaded = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name.split(".")[0]) for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return loaded - bound - set(dir(builtins))


def code(id: str, name: str | None = None) -> str:
    """Exercise ``id``'s reference solution as code to paste: imports, then ``def <name>(...)``.

    ``name`` defaults to the stub's name in the notebook (``STUB_NAMES``).
    """
    from course_lib.exercises import exercises
    all_ = exercises()
    if id not in all_:
        raise KeyError(f"there is no exercise {id!r}; the exercises are {', '.join(all_)}")
    fn = all_[id].solution
    name = name or STUB_NAMES.get(id) or fn.__name__.removeprefix("solution_")
    src = textwrap.dedent(inspect.getsource(fn))
    tree = ast.parse(src)
    func = tree.body[0]
    if not isinstance(func, ast.FunctionDef):
        raise TypeError(f"exercise {id}'s solution is not a plain function")
    module = sys.modules[fn.__module__]
    imports = _import_lines(module)
    needed, helpers = [], []
    for free in sorted(_free_names(func)):
        if free in imports:
            needed.append(imports[free])
        elif inspect.isfunction(module.__dict__.get(free)):
            helpers.append(textwrap.dedent(inspect.getsource(module.__dict__[free])))
        else:
            raise NameError(f"exercise {id}'s solution uses {free!r}, which its module neither imports nor defines "
                            "as a function, so it cannot be printed as code to paste")
    # Rename the definition only (its first line), leaving the body as written, comments included.
    lines = src.splitlines()
    first = func.lineno - 1 + len(func.decorator_list)
    lines[first] = lines[first].replace(f"def {fn.__name__}(", f"def {name}(", 1)
    # Recursive calls by the old name would break: rename those too.
    body = "\n".join(lines)
    if fn.__name__ != name:
        body = body.replace(f"{fn.__name__}(", f"{name}(")
    parts = []
    if needed:
        parts.append("\n".join(sorted(set(needed), key=lambda s: (not s.startswith("import "), s))))
    parts += [h.rstrip() for h in helpers]
    parts.append(body.rstrip())
    return "\n\n".join(parts) + "\n"
