"""Lesson 12 as a file: its training path is plain JAX, optax and Orbax, and its decision rule has a stable anchor.

The notebook itself runs under nbval (tests/test_notebooks.py and the nbval run over notebooks/).
"""

import ast
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "12_capstone_transformer.ipynb"
# The only course_lib names the lesson may use: choosing the devices, and the exercise checks.
ALLOWED = {("course_lib.devices", "lesson_devices"), ("course_lib.exercises", "check"),
           ("course_lib.exercises", "hint"), ("course_lib.exercises", "solution")}


def _cells(kind):
    nb = json.loads(NOTEBOOK.read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == kind]


def _python(source):
    """A code cell's source as Python (IPython's %magic lines dropped)."""
    return "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))


def test_training_path_imports_nothing_else_from_course_lib():
    used = set()
    for source in _cells("code")[1:]:            # the first cell installs course_lib on Colab and Kaggle
        for node in ast.walk(ast.parse(_python(source))):
            if isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] == "course_lib" for a in node.names), ast.unparse(node)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("course_lib"):
                for alias in node.names:
                    used.add((node.module, alias.name))
            elif isinstance(node, ast.Name):
                assert node.id != "course_lib", "the notebook uses the course_lib package by name"
    assert used <= ALLOWED, f"course_lib names outside devices and exercises: {sorted(used - ALLOWED)}"
    assert ("course_lib.devices", "lesson_devices") in used


def test_exercise_checks_come_after_the_training_path():
    code = _cells("code")
    first_check = next(i for i, s in enumerate(code) if "course_lib.exercises" in s)
    assert all("check(" not in s and "course_lib.exercises" not in s for s in code[:first_check])
    # and the training path (model, steps, FSDP, Orbax, profile) is written out before the exercises
    before = "\n".join(code[:first_check])
    for needle in ["jax.make_mesh", "jax.set_mesh", "jax.make_array_from_process_local_data", "donate_argnums",
                   "jax.shard_map", "jax.lax.all_gather", "jax.checkpoint", "jax.lax.scan", "memory_analysis()",
                   "ocp.CheckpointManagerOptions", "max_to_keep", "enable_async_checkpointing",
                   "jax.ShapeDtypeStruct", "jax.profiler.trace", ".lower(", ".as_text()"]:
        assert needle in before, needle


def test_decision_rule_heading_is_the_anchor_lesson_07_links_to():
    headings = [line for s in _cells("markdown") for line in s.splitlines() if line.startswith("#")]
    assert "## The decision rule" in headings       # Jupyter's anchor: #The-decision-rule
    assert "## Common errors" in headings


def test_cell_count_fits_one_sitting():
    nb = json.loads(NOTEBOOK.read_text())
    assert len(nb["cells"]) <= 62


def test_notebook_removes_its_temporary_directory():
    code = _cells("code")
    assert "tempfile.mkdtemp" in "\n".join(code)
    assert "shutil.rmtree(TMP)" in code[-1]
