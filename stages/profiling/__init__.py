"""Profiling the stages in-process: what a call launches, how long its named ranges take, and
the fixed workloads `tts-bench profile` and the benchmark scripts measure them on.

- `launches`: device kernels (CUDA) or top-level operators (CPU) per call, and the time inside
  named `record_function` ranges, from one torch profiler run;
- `ranges`: the range names the workloads are timed by, and which ranges each step reports;
- `build`: the talker and an eager Token2Wav built for a profile (seeded random weights, the
  talker's cache sized to the workload, not to serving);
- `talker_step`: one steady talker decode step with B active rows;
- `code2wav_step`: one code2wav decode of B streams' steady payloads;
- `cache_split`: storing a B-row chunk's flow caches into the slot pool, per row or batched;
- `window`: a profiler window in a serving stage process (`StageRunner.trace`) and what ran on
  each device stream during it.

Stage knowledge (how to build an engine, grow caches to their steady shapes, which ranges the
decode is annotated with) lives here, beside the stages; the harness (`tts_bench.profile.run`) only
tabulates what these functions return.

    place = build.placement(stages.runner)
    engine = build.build_talker(stages, place, rows=8, text=talker_step.profile_text(0), chunks=3)
    talker_step.measure_talker_step(engine, 8, chunks=3).launches.per_call
"""
