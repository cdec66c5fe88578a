"""Profiling the stages in-process: what a call launches and how long its named ranges take.

- `launches`: device kernels (CUDA) or top-level operators (CPU) per call, and the time inside
  named `record_function` ranges, from one torch profiler run.

Counting launches is stage knowledge (which events are kernels, which operators are views), so
it lives beside the stages; the harness (`tts_bench.profile`) and the benchmark scripts call it.
"""
