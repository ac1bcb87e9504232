"""course_lib: the companion library of the course "SPMD data parallelism in JAX".

One small module per topic, each introduced by the lesson that first writes its idea out by hand:

- ``course_lib.devices``    (lesson 00): 8 devices anywhere, simulated CPU devices, an environment report.
- ``course_lib.diagrams``   (lessons 00-05): graphviz diagrams drawn from real devices, shapes, shardings, values.
- ``course_lib.sharding``   (lessons 02-03, 06-07): shard/unshard a batch, replicate/unreplicate parameters, pad a
  batch; and the mesh forms, ``replicate_on_mesh`` (``P()``) and ``shard_on_mesh`` (``P(axis)``).
- ``course_lib.collectives`` (lesson 04): NumPy reference semantics of every collective, per-device in and out.
- ``course_lib.data``       (lesson 05): a synthetic regression, the bundled digits, seeded sharded batches.
- ``course_lib.training``   (lessons 05, 07): a data-parallel step from any loss and optax optimizer, with a pmap,
  shard_map or jit backend, one all-reduce per step, and a bounded ``fit`` that fuses steps per dispatch.
- ``course_lib.distributed`` (lesson 08): launch and watch several JAX processes on 127.0.0.1.
- ``course_lib.train_dp``   (lesson 08): the multi-process training worker, ``python -m course_lib.train_dp``.
- ``course_lib.bench``      (lesson 09): the benchmark, ``python -m course_lib.bench``: ten variants of a step in two
  like-with-like groups (one dispatch per step, and steps fused with ``lax.scan``), timed.
- ``course_lib.sharded_state`` (lesson 10): ZeRO-1/2 and FSDP training states, gradient accumulation, bfloat16
  compute; bytes per device from live buffers and the compiled step, collectives and their bytes from the HLO.
- ``course_lib.checkpoint`` (lesson 11): Orbax checkpoints: save, restore onto the given devices or sharding,
  latest step, resume a data iterator; clear errors for missing, damaged or mismatched checkpoints.
- ``course_lib.checkpoint_worker`` (lesson 11): several processes saving one checkpoint, and a save killed half-way.
- ``course_lib.profile``    (lesson 11): capture a ``jax.profiler`` trace of N steps, parse it per device,
  summarise (step time, compute, collectives, gaps), plot a timeline.
- ``course_lib.errors``     (every lesson): show an expected error without stopping "Run All".
- ``course_lib.exercises``  (every lesson): exercise checkers and reference solutions.
- ``course_lib.setup_check`` (before lesson 00): ``./course.sh check`` or ``run()`` from a cell: a one-minute check
  of this machine, and ``tpu_compiler_hint()``, how to get lesson 13's TPU compiler on this platform.

Modules are imported explicitly (``from course_lib import sharding``): importing ``course_lib`` alone
does not import JAX, so ``course_lib.devices.simulate_devices`` can still run before JAX starts.
"""

__version__ = "0.1.0"
