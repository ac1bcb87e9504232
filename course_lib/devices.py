"""Devices: how many JAX sees, where they are, and how to get 8 of them anywhere.

Lesson 00. JAX decides how many CPU devices exist once, when its first operation
starts the backends. ``simulate_devices`` sets that number beforehand;
``lesson_devices`` is what every multi-device lesson calls first: it returns 8
devices on any machine, falling back to simulated CPU devices where the machine
has fewer accelerators than that (a laptop, a single GPU, a one-chip TPU runtime), and
says which it chose.

Simulated CPU devices are real XLA devices that share one process and the
machine's CPU cores. They reproduce the *semantics* of multi-device programs
(placement, sharding, collectives, their results) exactly; they say nothing about
speed.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import platform
import sys

import jax
from jax._src import xla_bridge as _xla_bridge  # backends_are_initialized has no public name yet
import jax.extend.backend as _backend

from . import _checks

__all__ = [
    "DeviceSetupError",
    "DeviceReport",
    "backends_started",
    "simulate_devices",
    "lesson_devices",
    "where_running",
    "report",
]


class DeviceSetupError(RuntimeError):
    """The device configuration asked for cannot be had in this process."""


def backends_started() -> bool:
    """Whether JAX has already started its backends (after which device counts are fixed)."""
    return _xla_bridge.backends_are_initialized()


def _restart_message(n: int, current: int) -> str:
    return (
        f"JAX has already started with {current} CPU device(s), so it cannot switch to {n} now: "
        "the count is fixed by the first JAX operation in a process. "
        "Restart the kernel (Kernel > Restart Kernel), then run "
        f"`course_lib.devices.simulate_devices({n})` (or `lesson_devices({n})`) before any other JAX code. "
        f"Outside a notebook, set JAX_NUM_CPU_DEVICES={n} in the environment before starting Python."
    )


def simulate_devices(n: int = 8) -> list[jax.Device]:
    """Give JAX ``n`` CPU devices, before its first operation.

    Equivalent to ``jax.config.update("jax_num_cpu_devices", n)`` right after
    ``import jax``. Calling it again with the same ``n`` is a no-op. Calling it
    after JAX has started with a different count raises ``DeviceSetupError``
    saying to restart the kernel.

    Args:
      n: number of CPU devices, at least 1.

    Returns:
      The ``n`` CPU devices, ``jax.devices("cpu")``.
    """
    n = _checks.whole(n, "n", "simulate_devices", fix="Pass e.g. simulate_devices(8).")
    if backends_started():
        have = len(jax.devices("cpu"))
        if have != n:
            raise DeviceSetupError(_restart_message(n, have))
        return jax.devices("cpu")
    jax.config.update("jax_num_cpu_devices", n)
    setting = _platforms_setting()
    if setting and "cpu" not in [p.strip() for p in setting.split(",")]:
        raise DeviceSetupError(
            f"simulate_devices({n}) gives CPU devices, but JAX_PLATFORMS/jax_platforms={setting!r} leaves the CPU "
            f"out. Fix: unset JAX_PLATFORMS (or set JAX_PLATFORMS=cpu) and restart the kernel.")
    return jax.devices("cpu")


def _platforms_setting() -> str | None:
    """The platforms JAX was told to use (``JAX_PLATFORMS`` or ``jax.config.update("jax_platforms", ...)``)."""
    value = getattr(jax.config, "jax_platforms", None) or os.environ.get("JAX_PLATFORMS")
    return value or None


def _devices_or_explain(n: int) -> list[jax.Device]:
    """``jax.devices()``, or a ``DeviceSetupError`` naming the setting that stopped JAX from starting.

    With ``JAX_PLATFORMS=cuda`` (or ``tpu``, or a typo) on a machine without that platform, JAX itself
    fails with a bare ``AssertionError`` or a ``RuntimeError`` about a backend it could not initialise.
    """
    try:
        return jax.devices()
    except Exception as e:  # JAX's own error here is an AssertionError with no message, or a long RuntimeError
        setting = _platforms_setting()
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        detail = f"{type(e).__name__}: {first}" if first else f"JAX raised a bare {type(e).__name__}"
        if setting:
            where = ("the environment variable JAX_PLATFORMS" if os.environ.get("JAX_PLATFORMS") == setting
                     else "the config option jax_platforms")
            raise DeviceSetupError(
                f"JAX could not start the platform(s) {setting!r} named by {where}={setting!r} "
                f"({detail}). This machine has no such device, or JAX lacks its plugin. "
                f"Fix: unset JAX_PLATFORMS (or set JAX_PLATFORMS=cpu) and restart the kernel, then call "
                f"lesson_devices({n}) again: without an accelerator it runs on {n} simulated CPU devices. "
                f"To use a GPU or TPU instead, install JAX for it (pip install -U \"jax[cuda12]\" for an NVIDIA GPU, "
                "\"jax[tpu]\" for a TPU) and restart."
            ) from None
        raise DeviceSetupError(
            f"JAX could not start any device ({detail}). Restart the kernel and call "
            f"lesson_devices({n}) before any other JAX code; `python -c 'import jax; print(jax.devices())'` "
            "shows JAX's own error."
        ) from None


def _fall_back_to_cpu(n: int) -> None:
    """Restart JAX's backends on the CPU alone, with ``n`` devices (nothing must be on the old ones)."""
    _backend.clear_backends()
    jax.config.update("jax_num_cpu_devices", n)
    jax.config.update("jax_platforms", "cpu")


def _only_a_cpu() -> bool:
    """True where no platform is chosen and no TPU or GPU is attached: JAX would end on the CPU anyway.

    With libtpu installed (lesson 13's TPU compiler), JAX otherwise also tries to start a TPU that is
    not there, and libtpu prints warnings about TPU hostnames on stderr before JAX moves on.
    """
    if _platforms_setting():
        return False
    try:
        from jax._src import hardware_utils  # JAX's own PCI checks; no public name
        tpus = hardware_utils.num_available_tpu_chips_and_device_id()[0]
        gpus = hardware_utils.has_visible_nvidia_gpu() or hardware_utils.num_available_amd_gpus(stop_at=1)
    except Exception:  # another JAX version: let JAX look for itself
        return False
    return not tpus and not gpus


def lesson_devices(n: int = 8, *, verbose: bool = True) -> list[jax.Device]:
    """The ``n`` devices a multi-device lesson runs on, wherever it runs.

    * ``n`` or more accelerators (a TPU slice, a multi-GPU machine): the first ``n`` of them.
    * Fewer accelerators (a laptop, one GPU, a one-chip TPU runtime): ``n`` simulated CPU
      devices, and JAX's default platform becomes the CPU for the rest of the process.

    Call it first in a notebook, before any other JAX operation. It prints which
    devices it chose and why, unless ``verbose=False``.

    Returns:
      A list of ``n`` ``jax.Device``; afterwards ``jax.devices()`` holds them.
    """
    n = _checks.whole(n, "n", "lesson_devices", fix="Pass e.g. lesson_devices(8).")
    started_before = backends_started()
    if not started_before:
        jax.config.update("jax_num_cpu_devices", n)
        if _only_a_cpu():
            jax.config.update("jax_platforms", "cpu")
    found = _devices_or_explain(n)
    platform_name = found[0].platform
    if platform_name != "cpu" and len(found) >= n:
        message = f"Using {n} of this machine's {len(found)} {platform_name.upper()} devices."
        chosen = found[:n]
    elif platform_name != "cpu":
        if started_before:
            raise DeviceSetupError(
                f"This machine has {len(found)} {platform_name.upper()} device(s); the lesson needs {n}, "
                f"so it must run on {n} simulated CPU devices, but JAX has already started. "
                f"Restart the kernel and run `lesson_devices({n})` before any other JAX code."
            )
        _fall_back_to_cpu(n)
        chosen = jax.devices()
        message = (
            f"This machine has {len(found)} {platform_name.upper()} device(s) and the lesson needs {n}, "
            f"so it runs on {n} simulated CPU devices instead. They give the same results; "
            "they do not show multi-device speed."
        )
    else:
        if len(found) != n:
            raise DeviceSetupError(_restart_message(n, len(found)))
        chosen = found
        message = f"Using {n} simulated CPU devices (no accelerator found, so JAX runs on the CPU)."
    if verbose:
        print(message)
    return list(chosen)


def where_running() -> str:
    """Where this Python runs: ``"Colab"``, ``"Kaggle"``, ``"Binder"`` or ``"local"``."""
    if "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ:
        return "Colab"
    if "KAGGLE_KERNEL_RUN_TYPE" in os.environ or "KAGGLE_URL_BASE" in os.environ:
        return "Kaggle"
    if "BINDER_LAUNCH_HOST" in os.environ or "BINDER_REPO_URL" in os.environ:
        return "Binder"
    return "local"


@dataclasses.dataclass(frozen=True)
class DeviceReport:
    """What ``report()`` found. Prints as a short table."""

    jax_version: str
    python_version: str
    where: str
    default_platform: str
    local_devices: dict[str, int]
    global_devices: dict[str, int]
    process_index: int
    process_count: int
    simulated: bool

    def __str__(self) -> str:
        def kinds(counts: dict[str, int]) -> str:
            return ", ".join(f"{c} x {k}" for k, c in counts.items())

        rows = [
            ("JAX", self.jax_version),
            ("Python", self.python_version),
            ("running on", self.where),
            ("default platform", self.default_platform),
            ("local devices", f"{sum(self.local_devices.values())} ({kinds(self.local_devices)})"),
            ("global devices", f"{sum(self.global_devices.values())} ({kinds(self.global_devices)})"),
            ("process", f"{self.process_index} of {self.process_count}"),
            ("simulated", "yes: CPU devices sharing this machine's cores" if self.simulated else "no"),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    def _repr_pretty_(self, printer, cycle):  # IPython shows the table, not the dataclass repr
        printer.text(str(self))


def _kind_counts(devices) -> dict[str, int]:
    return dict(collections.Counter(f"{d.platform.upper()} ({d.device_kind})" for d in devices))


def report() -> DeviceReport:
    """Summarise the JAX installation and its devices (this starts JAX's backends)."""
    local = jax.local_devices()
    return DeviceReport(
        jax_version=jax.__version__,
        python_version=platform.python_version(),
        where=where_running(),
        default_platform=jax.default_backend(),
        local_devices=_kind_counts(local),
        global_devices=_kind_counts(jax.devices()),
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        simulated=jax.default_backend() == "cpu" and len(local) > 1,
    )
