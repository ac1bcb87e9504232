"""Measure again, on your own GPU, the facts of the course's hardware notes (notebooks/hardware.md, §1-§3).

    python tools/measure_hardware.py                   # on the GPU: all three sections
    python tools/measure_hardware.py --only inflight   # one section: inflight, trace or collectives
    python tools/measure_hardware.py --platform cpu    # the same probes on the CPU backend (a quick check)

- ``inflight`` (§1): how many calls of a jitted step Python queues before a call waits for the device.
- ``trace`` (§2): what ``jax.profiler.trace`` of a jitted Adam step holds: files, planes, lines, event names
  and their stats (is there a ``device_ordinal``? which ``hlo_op``?).
- ``collectives`` (§3): the collectives in XLA's program of a data-parallel step compiled for 8 devices. On a
  GPU the 8 devices are compile-only ones (``get_topology_desc(platform="cuda", topology="1x1x8")``), so one
  GPU is enough; nothing runs on them.

On a machine without a GPU (and without ``--platform cpu``) it says so, measures nothing and exits 0. The
figures are your machine's; hardware.md holds those of one NVIDIA H200 with JAX 0.11.2 (2026-11).
"""

import argparse
import os
import pathlib
import re
import statistics
import sys
import tempfile
import time

SECTIONS = ("inflight", "trace", "collectives")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--platform", choices=("gpu", "cpu"), default="gpu",
                    help="where to measure (default gpu; cpu is a quick check of the script itself)")
    ap.add_argument("--only", choices=SECTIONS, action="append",
                    help="measure only this section (may be given more than once)")
    ap.add_argument("--calls", type=int, default=60,
                    help="calls per in-flight probe (default 60; must exceed the queue's depth)")
    args = ap.parse_args(argv)
    if args.calls < 2:
        ap.error(f"--calls {args.calls}: a probe needs at least 2 calls; use e.g. --calls 60")
    return args


# ----------------------------------------------------------------------------------------------------------
# §1 How far Python runs ahead


def first_wait(times, one_call):
    """Index (from 0) of the first call that waited for the device, None if none did, or -1 if the probe
    cannot tell (a call costs the host nearly as much as a step: no queue builds up).

    A call waited if it took the host much longer than the fastest call (more than the geometric mean of
    the fastest call and one step), the calls after it did too (their median over the next five), and it
    took at least a quarter of what each of those took: a slow call before them is the host being busy, not
    a full queue."""
    fastest = min(times)
    if one_call < 3 * fastest:
        return -1
    slow = (fastest * one_call) ** 0.5
    for i, t in enumerate(times):
        after = times[i + 1:i + 6]
        queue_full = t > slow and statistics.median(times[i:i + 5]) > slow
        if queue_full and (not after or t >= statistics.median(after) / 4):
            return i
    return None


def inflight_probe(step, x, calls):
    """``(one call in s, index of the first call that waited or None or -1, steps in flight)``.

    ``step(x) -> x``. The probe calls ``step`` ``calls`` times on its own output, never reading a result, and
    times each call on the host (``first_wait``). Steps in flight: after each call, the results not ready yet
    (``jax.Array.is_ready``), at most; this count needs no timing."""
    import jax

    y = step(x)
    jax.block_until_ready(y)
    start = time.perf_counter()
    for _ in range(5):
        y = step(y)
    jax.block_until_ready(y)
    one_call = (time.perf_counter() - start) / 5
    times, outputs, in_flight = [], [], 0
    for _ in range(calls):
        t = time.perf_counter()
        y = step(y)
        times.append(time.perf_counter() - t)
        outputs.append(y)
        in_flight = max(in_flight, sum(not o.is_ready() for o in outputs))
    jax.block_until_ready(y)
    return one_call, first_wait(times, one_call), in_flight


def measure_inflight(device, platform, calls):
    import jax
    import jax.numpy as jnp

    n = 4096 if platform == "gpu" else 256  # a 4096 matmul takes seconds on a CPU
    small = 1024 if platform == "gpu" else 64
    key = jax.random.key(0)
    rows = []

    def chain(k, unrolled, size):
        w = jax.device_put(jax.random.normal(key, (size, size)) / size ** 0.5, device)

        def body(_, x):
            return x @ w

        @jax.jit
        def step(x):
            if unrolled:
                for _ in range(k):
                    x = body(0, x)
                return x
            return jax.lax.fori_loop(0, k, body, x)

        return step, jax.device_put(jnp.ones((size, size)), device)

    cases = [("20 matmuls, unrolled", 20, True, n), ("20-iteration fori_loop", 20, False, n),
             ("80 matmuls, unrolled", 80, True, n), ("80-iteration fori_loop", 80, False, n),
             (f"4 iterations of {small}x{small}", 4, False, small)]
    for name, k, unrolled, size in cases:
        step, x = chain(k, unrolled, size)
        one, i, fl = inflight_probe(step, x, calls)
        waited = f"none of {calls}" if i is None else "can't tell (step ~ dispatch)" if i < 0 else f"#{i}"
        rows.append((name, f"{one * 1e3:.1f} ms", waited, str(fl)))
    print(f"\n## 1. How far Python runs ahead ({n}x{n} float32 matmuls; calls counted from #0)\n")
    table(("step", "one call", "first call that waited", "steps in flight"), rows)
    print("\nSteps in flight: the most results not ready yet after a call. First call that waited: from the"
          "\ncalls' timings (a busy host shifts it: trust the count of steps in flight more).")
    print("\nOn the CPU backend the first wait is JAX's CPU client's limit (32 executions), not the device's."
          if platform == "cpu" else
          "\nA GPU waits sooner the more kernels a step launches (hardware.md, §1).")


# ----------------------------------------------------------------------------------------------------------
# §2 What a GPU trace looks like


def adam_step():
    """A jitted Adam step on a 2048x2048 layer: ``(params, m, v, x) -> (params, m, v)``."""
    import jax
    import jax.numpy as jnp

    def loss(p, x):
        return jnp.mean(jnp.tanh(x @ p["w"] + p["b"]) ** 2)

    @jax.jit
    def step(p, m, v, x):
        g = jax.grad(loss)(p, x)
        m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
        v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
        p = jax.tree.map(lambda p, m, v: p - 1e-3 * m / (jnp.sqrt(v) + 1e-8), p, m, v)
        return p, m, v

    return step


def measure_trace(device, platform):
    import jax
    import jax.numpy as jnp

    size = 2048 if platform == "gpu" else 256
    step = adam_step()
    p = {"w": jnp.zeros((size, size)), "b": jnp.zeros((size,))}
    p, m, v, x = jax.device_put((p, jax.tree.map(jnp.zeros_like, p), jax.tree.map(jnp.zeros_like, p),
                                 jnp.ones((64, size))), device)
    jax.block_until_ready(step(p, m, v, x))
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for i in range(3):
                with jax.profiler.StepTraceAnnotation("train", step_num=i):
                    p, m, v = step(p, m, v, x)
            jax.block_until_ready(p)
        root = pathlib.Path(d)
        files = sorted(str(f.relative_to(root)) for f in root.rglob("*") if f.is_file())
        generic = lambda f: re.sub(r"profile/[^/]+/[^/.]+\.", "profile/<run>/<host>.",
                                   re.sub(r"profile/[^/]+/perfetto", "profile/<run>/perfetto", f))
        files = sorted({generic(f) for f in files})
        data = jax.profiler.ProfileData.from_file(str(next(root.rglob("*.xplane.pb"))))
        planes = []
        for plane in data.planes:
            lines = [(line.name, list(line.events)) for line in plane.lines]
            planes.append((plane.name, lines))
        device_planes = [(name, lines) for name, lines in planes if name.startswith("/device:")]
        rows = []
        for name, lines in planes:
            shown = [f"{re.sub(r'/-?[0-9]+$', '/<id>', ln)} ({len(ev)} events)" for ln, ev in lines]
            rows.append((name, "; ".join(sorted(set(shown))[:4]) or "-"))
        print(f"\n## 2. What a {platform.upper()} trace looks like (a jitted Adam step, 3 steps)\n")
        print("Files: " + ", ".join(files) + "\n")
        table(("plane", "lines"), rows)
        events = [e for _, lines in (device_planes or planes) for _, ev in lines for e in ev]
        stat_keys = sorted({k for e in events for k, _ in e.stats})
        hlo_ops = sorted({str(v) for e in events for k, v in e.stats if k == "hlo_op"})
        names = sorted({e.name for e in events})
        where = "the device planes" if device_planes else "all planes (no device plane on this backend)"
        print(f"\nOn {where}: {len(events)} events, {len(names)} distinct names, e.g. "
              f"{', '.join(names[:4])}")
        print(f"Their stats: {', '.join(stat_keys) or '-'}")
        in_buffer = hlo_ops and all(h.startswith("command_buffer") for h in hlo_ops)
        note = " (one command buffer: kernels not named by HLO op)" if in_buffer else ""
        print(f"hlo_op values: {', '.join(hlo_ops[:6]) or '-'}{note}")
        for field in ("device_ordinal", "run_id"):
            print(f"`{field}` on an event: {'yes' if field in stat_keys else 'no'}")


# ----------------------------------------------------------------------------------------------------------
# §3 The collectives XLA's GPU compiler writes

COLLECTIVE = re.compile(r"= (?P<type>.+?) (?P<op>all-reduce|all-gather|reduce-scatter|all-to-all|"
                        r"collective-permute)(?P<start>-start)?\(")


def collectives(hlo_text):
    """``[(op, "async" | "sync", result type)]`` for each collective instruction of an HLO program's text.

    A ``-start`` instruction's type is ``((operands...), results...)``; its ``-done`` is not counted again."""
    found = []
    for line in hlo_text.splitlines():
        m = COLLECTIVE.search(line)
        if m:
            found.append((m["op"], "async" if m["start"] else "sync", m["type"]))
    return found


def compile_devices(platform):
    """8 devices to compile for: compile-only ones of this GPU's kind on a GPU, 8 CPU devices on CPU."""
    import jax

    if platform == "gpu":
        from jax.experimental import topologies
        return list(topologies.get_topology_desc("", platform="cuda", topology="1x1x8").devices)
    return jax.devices("cpu")[:8]


def measure_collectives(platform):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    devices = compile_devices(platform)
    if len(devices) < 8:
        print(f"\n## 3. Collectives: skipped, {len(devices)} {platform} devices and 8 needed")
        return
    mesh = Mesh(np.array(devices[:8]), ("data",))
    rep, batch = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

    def spec(shape, sharding, dtype=jnp.float32):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    def mlp_params(sizes, dtype=jnp.float32):
        return [{"w": spec((a, b), rep, dtype), "b": spec((b,), rep, dtype)}
                for a, b in zip(sizes, sizes[1:])]

    def loss(params, x, y):
        for layer in params[:-1]:
            x = jnp.tanh(x @ layer["w"] + layer["b"])
        out = x @ params[-1]["w"] + params[-1]["b"]
        return jnp.mean((out - y) ** 2)

    def shard_map_dp(params, x, y):
        def local(params, x, y):
            g = jax.grad(loss)(params, x, y)
            g = jax.tree.map(lambda t: jax.lax.psum(t, "data"), g)  # one psum per leaf
            return jax.tree.map(lambda p, g: p - 1e-3 * g, params, g)
        return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=P(),
                             check_vma=False)(params, x, y)

    def jit_dp(params, x, y):
        g = jax.grad(loss)(params, x, y)
        return jax.tree.map(lambda p, g: p - 1e-3 * g, params, g)

    def scatter(w, x):  # a replicated gradient enters a shard_map over P("data")
        g = x.T @ x @ w
        return jax.shard_map(lambda g: g * 2.0, mesh=mesh, in_specs=P("data"), out_specs=P("data"))(g)

    small = [64, 256, 10]  # lesson 10's MLP: 19,210 parameters
    big = [2048] * 5  # four 2048x2048 layers: 16.8M parameters
    cases = [
        ("shard_map, psum per leaf, 19,210 params", shard_map_dp,
         (mlp_params(small), spec((256, 64), batch), spec((256, 10), batch))),
        ("sharded jit, 19,210 params", jit_dp,
         (mlp_params(small), spec((256, 64), batch), spec((256, 10), batch))),
        ("shard_map, four 2048x2048 layers", shard_map_dp,
         (mlp_params(big), spec((256, 2048), batch), spec((256, 2048), batch))),
        ("shard_map, four 2048x2048 layers, bf16", shard_map_dp,
         (mlp_params(big, jnp.bfloat16), spec((256, 2048), batch, jnp.bfloat16),
          spec((256, 2048), batch, jnp.bfloat16))),
        ("jit gradient into shard_map P('data')", scatter,
         (spec((1024, 1024), rep), spec((256, 1024), batch))),
    ]
    rows = []
    for name, f, args in cases:
        text = jax.jit(f).lower(*args).compile().as_text()
        found = collectives(text)
        counts = {}
        for op, kind, _ in found:
            counts[f"{op} ({kind})"] = counts.get(f"{op} ({kind})", 0) + 1
        summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "none"
        shapes = sorted({_result(t) for _, _, t in found}, key=len)[:2]
        rows.append((name, summary, "; ".join(shapes) or "-"))
    what = f"compiled for 8 compile-only {devices[0].device_kind}" if platform == "gpu" else \
        "compiled by XLA's CPU compiler for 8 CPU devices"
    print(f"\n## 3. The collectives in a compiled data-parallel step ({what}; nothing executed)\n")
    table(("step", "collectives", "what arrives (first ones)"), rows)


def _result(t):
    """The arriving half of an async type ``((operands...), results)``, else the type itself, shortened."""
    if t.startswith("(("):
        depth = 0
        for i, c in enumerate(t):
            depth += (c == "(") - (c == ")")
            if depth == 1 and c == ")":
                t = t[i + 1:].lstrip(", ").removesuffix(")")
                break
    t = re.sub(r"\{[0-9,]*\}", "", t)
    return t if len(t) <= 60 else t[:57] + "..."


# ----------------------------------------------------------------------------------------------------------


def table(header, rows):
    """A Markdown table, as in hardware.md."""
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")


def _start_backends(jax, platform):
    """``(first device of platform, None)``, or ``(None, why not)``.

    JAX starts every backend it finds on its first use. Where libtpu is installed but there is no TPU, that
    writes lines of start-up noise to file descriptor 2 (from C++, past ``sys.stderr``). They are held back
    here, and shown only when the platform was found (they may then say something about it)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            device, said = jax.devices(platform)[0], None
        except RuntimeError as e:
            device, said = None, str(e).splitlines()[0]
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        if device is not None:
            held.seek(0)
            sys.stderr.write(held.read().decode(errors="replace"))
    return device, said


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.platform == "cpu":  # before JAX starts: only the CPU backend, with 8 devices for section 3
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
    import warnings

    import jax

    warnings.filterwarnings("ignore", category=DeprecationWarning)  # ProfileData's stats types say so
    device, said = _start_backends(jax, args.platform)
    if device is None:
        print(f"No {args.platform.upper()} here ({said}), so nothing was measured. "
              "Run this on a machine with a GPU, or with --platform cpu to try the script "
              "on the CPU backend. "
              "notebooks/hardware.md holds one H200's figures.")
        return 0
    print(f"# Measured on {device.device_kind} ({len(jax.devices(args.platform))} {args.platform} "
          f"device(s)), JAX {jax.__version__}, {time.strftime('%Y-%m-%d')}")
    for section in args.only or SECTIONS:
        if section == "inflight":
            measure_inflight(device, args.platform, args.calls)
        elif section == "trace":
            measure_trace(device, args.platform)
        else:
            measure_collectives(args.platform)
    return 0


if __name__ == "__main__":
    sys.exit(main())
