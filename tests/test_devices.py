"""course_lib.devices: simulated devices, the lesson fallback, and the environment report.

Device counts are fixed when JAX starts, so each case that starts JAX runs in a fresh interpreter.
"""

import sys

import jax
import pytest

from course_lib import devices as cdev
from conftest import N_DEVICES, run_python


def test_simulate_devices_before_start_gives_that_many():
    r = run_python("""
        from course_lib.devices import simulate_devices
        import jax
        devs = simulate_devices(4)
        print(len(devs), len(jax.devices()), jax.default_backend())
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["4", "4", "cpu"]


def test_simulate_devices_twice_with_same_count_is_a_no_op():
    r = run_python("""
        from course_lib.devices import simulate_devices
        import jax.numpy as jnp
        simulate_devices(4)
        x = jnp.arange(3.0)          # JAX has started now
        devs = simulate_devices(4)   # same count: fine
        print(len(devs), float(x.sum()))
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["4", "3.0"]


def test_simulate_devices_too_late_says_restart_and_call_it_first():
    r = run_python("""
        import jax.numpy as jnp
        jnp.ones(3).block_until_ready()   # JAX starts with its default, 1 CPU device
        from course_lib.devices import simulate_devices
        simulate_devices(8)
    """)
    assert r.returncode != 0
    assert "DeviceSetupError" in r.stderr
    assert "already started with 1 CPU device(s)" in r.stderr
    assert "Restart the kernel" in r.stderr
    assert "simulate_devices(8)" in r.stderr and "before any other JAX code" in r.stderr
    assert "JAX_NUM_CPU_DEVICES=8" in r.stderr


def test_simulate_devices_wrong_count_after_start_names_both_counts():
    r = run_python("""
        from course_lib.devices import simulate_devices, DeviceSetupError
        import jax.numpy as jnp
        simulate_devices(4)
        jnp.ones(3).block_until_ready()
        try:
            simulate_devices(2)
        except DeviceSetupError as e:
            print("ERROR:", e)
    """)
    assert r.returncode == 0, r.stderr
    assert "ERROR: JAX has already started with 4 CPU device(s), so it cannot switch to 2 now" in r.stdout


def test_env_var_counts_as_already_configured():
    r = run_python("""
        from course_lib.devices import simulate_devices
        import jax.numpy as jnp
        jnp.ones(1).block_until_ready()
        print(len(simulate_devices(3)))
    """, env={"JAX_NUM_CPU_DEVICES": "3"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "3"


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-2, ValueError), (2.5, TypeError), ("8", TypeError),
                                        (True, TypeError), (None, TypeError)])
def test_simulate_devices_rejects_a_bad_count(bad, error):
    with pytest.raises(error, match=r"simulate_devices: n must be a whole number >= 1, got .*simulate_devices\(8\)"):
        cdev.simulate_devices(bad)
    with pytest.raises(error, match=r"lesson_devices: n must be a whole number >= 1, got .*lesson_devices\(8\)"):
        cdev.lesson_devices(bad)


def test_simulate_devices_in_this_process_is_a_no_op(devices):
    assert cdev.simulate_devices(N_DEVICES) == jax.devices("cpu")


def test_lesson_devices_on_a_cpu_only_machine_uses_simulated_devices():
    r = run_python("""
        from course_lib.devices import lesson_devices
        import jax
        devs = lesson_devices(8)
        print(len(devs), jax.device_count(), jax.default_backend())
    """)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "Using 8 simulated CPU devices (no accelerator found, so JAX runs on the CPU)."
    assert lines[1] == "8 8 cpu"


def test_lesson_devices_with_libtpu_installed_but_no_tpu_prints_nothing_on_stderr():
    """libtpu (lesson 13's compiler) makes JAX try a TPU that is not there; its hostname warnings on
    stderr would greet every lesson. Where no TPU or GPU is attached, lesson_devices asks for the CPU."""
    import importlib.util
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed here (./course.sh tpu installs it)")
    from jax._src import hardware_utils
    if hardware_utils.num_available_tpu_chips_and_device_id()[0] or hardware_utils.has_visible_nvidia_gpu():
        pytest.skip("this machine has an accelerator attached")
    for _ in range(2):  # the warnings come from a thread: look twice
        r = run_python(accelerators=True, code="""
            from course_lib.devices import lesson_devices
            import jax
            lesson_devices(8, verbose=False)
            print(jax.config.jax_platforms, jax.device_count())
        """)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["cpu", "8"]
        assert r.stderr == ""


def test_lesson_devices_leaves_a_chosen_platform_alone(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    assert cdev._only_a_cpu() is False


# A stand-in for an accelerator this test machine does not have: lesson_devices only reads these fields.
FAKE_ACCELERATOR = """
    import jax
    from course_lib import devices as cd
    real_devices = jax.devices
    class FakeDevice:
        def __init__(self, i, platform): self.id, self.platform, self.device_kind = i, platform, "fake " + platform
    def fake_devices(backend=None):
        if backend is None and jax.config.jax_platforms != "cpu":
            real_devices("cpu")                      # as on a real machine, asking starts the backends
            return [FakeDevice(i, "{platform}") for i in range({count})]
        return real_devices(backend)
    jax.devices = fake_devices
    cd._only_a_cpu = lambda: False                   # the stand-in counts as attached
"""


def test_lesson_devices_with_one_accelerator_falls_back_to_simulated_cpu_devices():
    r = run_python(accelerators=True, code=FAKE_ACCELERATOR.format(platform="tpu", count=1) + """
    devs = cd.lesson_devices(8)
    print(len(devs), {d.platform for d in devs}, len(real_devices()), jax.default_backend())
    """)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == ("This machine has 1 TPU device(s) and the lesson needs 8, so it runs on 8 simulated CPU "
                        "devices instead. They give the same results; they do not show multi-device speed.")
    assert lines[1] == "8 {'cpu'} 8 cpu"


def test_lesson_devices_with_enough_accelerators_uses_them():
    r = run_python(accelerators=True, code=FAKE_ACCELERATOR.format(platform="gpu", count=16) + """
    devs = cd.lesson_devices(8)
    print(len(devs), [d.id for d in devs])
    """)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "Using 8 of this machine's 16 GPU devices."
    assert lines[1] == "8 [0, 1, 2, 3, 4, 5, 6, 7]"


def test_lesson_devices_after_jax_started_on_too_few_cpus_says_restart():
    r = run_python("""
        import jax.numpy as jnp
        jnp.zeros(2).block_until_ready()
        from course_lib.devices import lesson_devices
        lesson_devices(8)
    """)
    assert r.returncode != 0
    assert "DeviceSetupError" in r.stderr and "Restart the kernel" in r.stderr
    assert "lesson_devices(8)" in r.stderr


def test_lesson_devices_in_a_configured_process_is_quiet_when_asked(capsys, devices):
    assert cdev.lesson_devices(N_DEVICES, verbose=False) == devices
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("env, expected", [
    ({}, "local"),
    ({"COLAB_RELEASE_TAG": "release-colab_20261101"}, "Colab"),
    ({"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, "Kaggle"),
    ({"BINDER_LAUNCH_HOST": "https://mybinder.org/"}, "Binder"),
])
def test_where_running(monkeypatch, env, expected):
    for var in ["COLAB_RELEASE_TAG", "KAGGLE_KERNEL_RUN_TYPE", "KAGGLE_URL_BASE", "BINDER_LAUNCH_HOST",
                "BINDER_REPO_URL"]:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert cdev.where_running() == expected


def test_report_counts_devices_and_processes(devices):
    rep = cdev.report()
    assert rep.jax_version == jax.__version__
    assert rep.default_platform == "cpu"
    assert rep.local_devices == {"CPU (cpu)": N_DEVICES}
    assert rep.global_devices == {"CPU (cpu)": N_DEVICES}
    assert (rep.process_index, rep.process_count) == (0, 1)
    assert rep.simulated
    text = str(rep)
    assert f"global devices    {N_DEVICES} ({N_DEVICES} x CPU (cpu))" in text
    assert "process           0 of 1" in text
    assert "simulated         yes" in text


def _has_cuda_plugin() -> bool:
    import importlib.util
    return any(importlib.util.find_spec(name) is not None for name in ("jax_cuda12_plugin", "jax_cuda13_plugin"))


@pytest.mark.parametrize("platforms", [
    pytest.param("cuda", marks=pytest.mark.skipif(_has_cuda_plugin(), reason="this machine's JAX can start CUDA")),
    "nosuchplatform",
])
def test_lesson_devices_with_jax_platforms_naming_a_missing_platform_says_which_setting_and_the_fix(platforms):
    # JAX's own failure is a bare AssertionError (cuda without its plugin) or a RuntimeError about the backend.
    r = run_python(accelerators=True, env={"JAX_PLATFORMS": platforms}, code="""
        from course_lib.devices import lesson_devices, DeviceSetupError
        try:
            lesson_devices(8)
        except DeviceSetupError as e:
            print("DeviceSetupError:", e)
    """)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("DeviceSetupError: JAX could not start the platform(s)"), out
    assert f"environment variable JAX_PLATFORMS={platforms!r}" in out
    assert "unset JAX_PLATFORMS (or set JAX_PLATFORMS=cpu) and restart the kernel" in out
    assert "AssertionError\n" not in r.stderr and "Traceback" not in r.stderr


def test_lesson_devices_after_the_fix_runs_on_simulated_devices():
    # The fix the message gives works: with JAX_PLATFORMS=cpu the same call gets 8 simulated devices.
    r = run_python(accelerators=True, env={"JAX_PLATFORMS": "cpu"}, code="""
        from course_lib.devices import lesson_devices
        print(len(lesson_devices(8, verbose=False)))
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["8"]


def test_simulate_devices_with_jax_platforms_leaving_out_the_cpu_says_so():
    r = run_python(accelerators=True, env={"JAX_PLATFORMS": "cuda"}, code="""
        from course_lib.devices import simulate_devices, DeviceSetupError
        try:
            simulate_devices(4)
        except DeviceSetupError as e:
            print("DeviceSetupError:", e)
    """)
    assert r.returncode == 0, r.stderr
    assert "JAX_PLATFORMS/jax_platforms='cuda' leaves the CPU out" in r.stdout
    assert "unset JAX_PLATFORMS (or set JAX_PLATFORMS=cpu)" in r.stdout
