"""Unit tests run on 8 simulated CPU devices, configured before JAX starts.

The root conftest.py has already set JAX_NUM_CPU_DEVICES. Here the platform is pinned
to the CPU too, so that a machine with one GPU still tests 8-device semantics.
"""

import os
import subprocess
import sys
import textwrap

import jax
import pytest

jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_num_cpu_devices", 8)

N_DEVICES = 8


@pytest.fixture(scope="session")
def devices():
    devs = jax.devices()
    assert len(devs) == N_DEVICES, f"tests expect {N_DEVICES} simulated devices, got {len(devs)}"
    return devs


def run_python(code: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (JAX not yet started), with a timeout."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, timeout=timeout)
