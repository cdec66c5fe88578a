"""Throughput per block: audio seconds produced per wall second of one arm's phase (higher is better).

A/A runs on an H200 show throughput far steadier than mean RTF (±0.6 % across blocks where mean
RTF moved by 5 %): mean RTF depends on where each request landed in the queue, throughput on
what the server did per second. So it is judged like RTF and TTFP: per block k one figure per
arm, `d_k = ln(thr_test_k / thr_base_k)`, the t interval over blocks, the MDE and a verdict with
`lower_is_better=False` (a test arm with a higher throughput is `faster`).

Every per-block throughput comes from `block_throughputs`, the only place that defines it:

- count mode (today): Σ audio seconds of the phase's successful measured requests / (last end −
  first send) over all its measured requests (a resumed phase has several `phase_id`s: their
  spans add up, as in `tts_bench.load.metrics.measured_wall_s`);
- duration mode: pass `windows`, a phase's figure from its measurement window (audio attributed
  by chunk arrival time), keyed `(tier, arm, repeat)`; a phase found there is taken from it,
  so windows win over the count-mode span wherever they exist.

    thr = block_throughputs(read_records(run))          # {"2x1": {"base": {0: 41.2, 1: 40.9}, ...}}
    thr["2x1"]["test"][1]
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from tts_bench.load.metrics import measured_wall_s
from tts_bench.rundir.records import RequestRecord

PhaseKey = tuple[str, str, int]  # (tier, arm, repeat)


def _phase_throughput(records: list[RequestRecord]) -> float | None:
    """Σ audio seconds of the ok requests / the phase's measured wall time (`measured_wall_s`)."""
    wall = measured_wall_s(records)
    audio = sum(r.audio_seconds for r in records if r.ok)
    return audio / wall if wall > 0 and audio > 0 else None


def block_throughputs(
    records: Iterable[RequestRecord], *, windows: Mapping[PhaseKey, float] | None = None,
) -> dict[str, dict[str, dict[int, float]]]:
    """{tier: {arm: {repeat: audio s per wall s}}} of the measured phases (see the module
    docstring); a phase without a positive figure (no audio, zero span) is left out."""
    phases: dict[PhaseKey, list[RequestRecord]] = defaultdict(list)
    for r in records:
        if not r.warmup:
            phases[(r.tier, r.arm, r.repeat)].append(r)
    out: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for key in sorted({*phases, *(windows or {})}):
        tier, arm, repeat = key
        value = (windows or {}).get(key)
        if value is None and key in phases:
            value = _phase_throughput(phases[key])
        if value is not None and value > 0:
            out[tier][arm][repeat] = float(value)
    return {t: dict(arms) for t, arms in out.items()}
