"""Device-memory sampling during a tier: steady state, peak, headroom, A/B and a timeline.

The pieces, each usable alone:
- `samplers`: npu-smi (text, parsed by `npu_smi`), NVML, the torch allocator of every stage
  process (through the backend's `memory_snapshot()`), process-tree RSS; `make_sampler("auto")`;
- `recorder`: the sampling thread (`MemoryRecorder`), phases, gaps, per-sample overhead;
- `summary`: steady-state median (measure phase), peak (whole tier), headroom, deltas, the table;
- `plot`: the timeline PNG; `run`: `tts-bench mem` as a library call; `hooks`: `ab --mem`.

    rec = MemoryRecorder(make_sampler("rss"), interval_s=2.0)
    rec.start("warmup"); ...; rec.mark("measure"); ...; series = rec.stop()
    print(render(mem_table(summarize({"base": series}, tier="128x8")), "md"))
"""
