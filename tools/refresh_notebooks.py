"""Re-execute the course notebooks in place, so their stored outputs are what this environment produces.

Run it through `./course.sh refresh [notebook ...]` (all of notebooks/ by default). Each notebook runs
top to bottom in a fresh kernel of this environment, with the same settings as the nbval run
(conftest.py), a per-cell timeout, and no per-cell timing metadata, so the diffs show only real changes.
Afterwards it checks the outputs for things nbval or a reader should not see (machine paths,
memory addresses, unexpected errors), then runs nbval over the fresh notebooks with XLA's CPU compiler limited
to another instruction set (as `./course.sh test` does), so that no stored output depends on
this machine's processor. It exits non-zero if either finds anything; `--no-isa-check` skips the nbval run.
"""

import argparse
import html
import os
import pathlib
import subprocess
import sys
import time

import nbclient
import nbclient.exceptions
import nbformat
from jupyter_client import KernelManager
from nbval.kernel import CURRENT_ENV_KERNEL_NAME, NbvalKernelspecManager

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import conftest  # noqa: E402,F401  (sets the kernel environment, as under nbval)
sys.path.insert(0, str(ROOT / "tests"))
from notebook_checks import problems  # noqa: E402


def settle_progress_bars(nb) -> int:
    """Store each tqdm widget bar's final state as its text fallback; returns how many were settled.

    ``training.fit``'s own bar is plain text updated in place and stored as its final line: it needs nothing here.
    This is for a ``tqdm.auto`` bar a notebook shows itself. A tqdm bar in a notebook is a widget. Its stored ``text/plain`` is the bar as it was first displayed
    (0%), and that is what a viewer without the widget state shows (GitHub, an untrusted notebook). The
    final state is in the notebook's widget metadata, which nbclient saves: write it out as tqdm's text bar.
    """
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    settled = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            view = out.get("data", {}).get("application/vnd.jupyter.widget-view+json")
            box = state.get(view["model_id"]) if view else None
            if not box or box.get("model_name") != "HBoxModel":
                continue
            parts = [state.get(c.removeprefix("IPY_MODEL_"), {}) for c in box["state"].get("children", [])]
            if [p.get("model_name") for p in parts] != ["HTMLModel", "FloatProgressModel", "HTMLModel"]:
                continue
            left, bar, right = (p["state"] for p in parts)
            done = bar.get("value", 0) / bar["max"] if bar.get("max") else 0
            filled = min(10, int(done * 10))
            text = f"{left.get('value', '')}|{'█' * filled}{' ' * (10 - filled)}|{right.get('value', '')}"
            out["data"]["text/plain"] = html.unescape(text).replace("\u2007", " ")
            settled += 1
    return settled


def drop_unused_widget_state(nb) -> bool:
    """Remove the notebook's stored widget state when no output shows a widget any more; returns whether it did.

    course_lib's progress bar is plain text (``training.fit``), so a re-run stores no widget; a state left from an
    older run would only make viewers look for widget code that nothing uses.
    """
    uses = any("application/vnd.jupyter.widget-view+json" in out.get("data", {})
               for cell in nb.cells for out in cell.get("outputs", []))
    if uses or "widgets" not in nb.metadata:
        return False
    del nb.metadata["widgets"]
    return True


def refresh(path: pathlib.Path, timeout: int) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    # This environment's Python, whatever "python3" means in the user's Jupyter set-up: as nbval --nbval-current-env.
    km = KernelManager(kernel_name=CURRENT_ENV_KERNEL_NAME, kernel_spec_manager=NbvalKernelspecManager())
    client = nbclient.NotebookClient(
        nb, km=km, timeout=timeout, record_timing=False, resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    settle_progress_bars(nb)
    drop_unused_widget_state(nb)
    nbformat.write(nb, path)
    return problems(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=pathlib.Path)
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    parser.add_argument("--no-isa-check", action="store_true",
                        help="skip the nbval run under another instruction set after storing")
    args = parser.parse_args()
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    failed = False
    for path in paths:
        start = time.perf_counter()
        print(f"executing {path.name} ...", flush=True)
        try:
            found = refresh(path.resolve(), args.timeout)
        except nbclient.exceptions.CellExecutionError as e:
            print(f"  a cell failed, so {path.name} was not written:\n{e}"[:4000])
            failed = True
            continue
        print(f"  done in {time.perf_counter() - start:.0f} s", flush=True)
        for p in found:
            print("  problem:", p)
            failed = True
    if not failed and not args.no_isa_check:
        failed = not check_other_isa(paths)
    return 1 if failed else 0


def check_other_isa(paths) -> bool:
    """nbval over ``paths`` with XLA limited to another instruction set; True when every stored output held."""
    isa = conftest.second_isa("auto", os.environ.get("XLA_FLAGS", ""))
    env = {**os.environ, "XLA_FLAGS": conftest.isa_flags(os.environ.get("XLA_FLAGS", ""), isa)}
    print(f"checking the stored outputs with XLA_FLAGS={env['XLA_FLAGS']} (another processor, simulated) ...",
          flush=True)
    cmd = [sys.executable, "-m", "pytest", "-q", "--nbval-isa=none", "-p", "no:cacheprovider",
           *[str(p) for p in paths]]
    done = subprocess.run(cmd, cwd=ROOT, env=env)
    if done.returncode != 0:
        print("  some stored outputs differ under another instruction set (above): print those values at the "
              "precision the lesson claims, or ignore the output and assert the claim (CONTRIBUTING.md, "
              "'Stored outputs that hold on any machine').")
    return done.returncode == 0


if __name__ == "__main__":
    sys.exit(main())
