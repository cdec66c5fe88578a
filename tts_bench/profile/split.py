"""The tier split of `tts-bench profile`: where the time of one second of audio goes.

At a tier C x R (C client streams, R code2wav replicas of up to max_num_seqs rows), one second
of audio for all C streams costs token_rate_hz talker steps of C rows and C / b code2wav decodes
of b = min(max_num_seqs, ceil(C / R)) rows (`TierPlan`). `TierSplit` multiplies the time per
call of each component, measured inside its profiler range, by those call rates and reports
each component's share: talker / flow encoder / CFM / HiFT / the rest of the decode.

Range names come from `stages.profiling.ranges`, where the workloads that time them live.

    plan = TierPlan.of(Tier(128, 8), max_num_seqs=8, cfg=stages.code2wav)
    split = TierSplit.build(plan, ("base", "test"), timings)   # timings: profile.StageTiming
    print(render(split.table(), "md", title=split.title()))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pandas as pd

from stages.profiling.launches import RangeTimes
from stages.profiling.ranges import COMPONENT_RANGES, DECODE_RANGE, TALKER_RANGE
from tts_bench.config import Tier

if TYPE_CHECKING:
    from stages.config import Code2WavConfig


class _Timing(Protocol):  # tts_bench.profile.run.StageTiming (not imported: it imports this module)
    arm: str
    step: str
    rows: int
    times: RangeTimes


# Components of the split: (label, step, range); "code2wav other" is the decode range minus its
# three component ranges (stacking, cache trim/split, host copies of the audio).
COMPONENTS = (
    ("talker", "talker_step", TALKER_RANGE),
    ("flow encoder", "code2wav_step", "code2wav.flow_encoder"),
    ("CFM", "code2wav_step", "code2wav.cfm"),
    ("HiFT", "code2wav_step", "code2wav.hift"),
    ("code2wav other", "code2wav_step", DECODE_RANGE),
)


@dataclass(frozen=True)
class TierPlan:
    """How much of each step one second of audio for all C streams of a tier C x R costs.

    The talker emits one code per active row per step at token_rate_hz codes per second, so all
    C streams advance 1 s in token_rate_hz steps of C rows. Code2wav decodes one payload of
    codec_chunk_frames new codes (codec_chunk_frames / token_rate_hz s of audio) per stream;
    each replica serves C / R streams in batches of up to max_num_seqs rows, so one second of
    audio takes C / b decodes of b = min(max_num_seqs, ceil(C / R)) rows (times
    token_rate_hz / codec_chunk_frames payloads per stream-second, 1 for MiniCPM-o 4.5).
    """

    tier: Tier
    talker_rows: int  # C
    code2wav_rows: int  # b
    talker_steps_per_s: float  # token_rate_hz
    decodes_per_s: float  # C / b * token_rate_hz / codec_chunk_frames

    @classmethod
    def of(cls, tier: Tier, max_num_seqs: int, cfg: Code2WavConfig) -> TierPlan:
        c, r = tier.concurrency, tier.replicas
        b = min(max_num_seqs, -(-c // r))
        payloads_per_s = cfg.token_rate_hz / cfg.codec_chunk_frames
        return cls(tier, c, b, float(cfg.token_rate_hz), c / b * payloads_per_s)

    def calls_per_s(self, step: str) -> float:
        return self.talker_steps_per_s if step == "talker_step" else self.decodes_per_s

    def rows_of(self, step: str) -> int:
        return self.talker_rows if step == "talker_step" else self.code2wav_rows


@dataclass(frozen=True)
class SplitRow:
    component: str
    range: str
    rows: int  # B profiled
    calls_per_s: float
    per_call_ms: dict[str, float]  # by arm
    per_audio_s_ms: dict[str, float]  # by arm: per_call_ms * calls_per_s
    percent: dict[str, float]  # by arm: share of the arm's sum over components


@dataclass(frozen=True)
class TierSplit:
    plan: TierPlan
    arms: tuple[str, str]
    unit: str  # "device_ms" (CUDA) | "cpu_ms" (CPU: host time, profiler overhead included)
    rows: list[SplitRow]

    @classmethod
    def build(cls, plan: TierPlan, arms: tuple[str, str], timings: Sequence[_Timing]) -> TierSplit:
        def times(arm: str, step: str) -> RangeTimes:
            rows = plan.rows_of(step)
            return next(t.times for t in timings if (t.arm, t.step, t.rows) == (arm, step, rows))

        per_call = {arm: _component_ms(lambda step, a=arm: times(a, step)) for arm in arms}
        per_s = {arm: {c: ms * plan.calls_per_s(_step_of(c)) for c, ms in per_call[arm].items()}
                 for arm in arms}  # fmt: skip
        totals = {arm: sum(per_s[arm].values()) for arm in arms}
        rows = [
            SplitRow(label, rng, plan.rows_of(step), plan.calls_per_s(step),
                     {a: per_call[a][label] for a in arms}, {a: per_s[a][label] for a in arms},
                     {a: 100 * per_s[a][label] / totals[a] if totals[a] else 0.0 for a in arms})
            for label, step, rng in COMPONENTS
        ]  # fmt: skip
        unit = times(arms[0], "talker_step").unit
        return cls(plan, arms, unit, rows)

    def table(self) -> pd.DataFrame:
        records = []
        for r in self.rows:
            rec: dict[str, str] = {"component": r.component, "B": str(r.rows),
                                   "calls/s": _num(round(r.calls_per_s, 2))}  # fmt: skip
            for a in self.arms:
                rec[f"{a} ms/call"] = f"{r.per_call_ms[a]:.3f}"
                rec[f"{a} ms/s"] = f"{r.per_audio_s_ms[a]:.1f}"
                rec[f"{a} %"] = f"{r.percent[a]:.1f}"
            records.append(rec)
        total = {"component": "total", "B": "", "calls/s": ""}
        for a in self.arms:
            per_s = sum(r.per_audio_s_ms[a] for r in self.rows)
            total |= {f"{a} ms/call": "", f"{a} ms/s": f"{per_s:.1f}", f"{a} %": "100.0"}
        return pd.DataFrame.from_records([*records, total])

    def title(self) -> str:
        p = self.plan
        return (
            f"{self.unit} per second of audio for all streams at tier {p.tier.label}: talker "
            f"{_num(p.talker_steps_per_s)} steps of B={p.talker_rows}; code2wav C/b = "
            f"{_num(round(p.decodes_per_s, 2))} decodes of b=min(max_num_seqs, ceil(C/R))="
            f"{p.code2wav_rows}; ms/s = ms/call x calls/s, % of the arm's total"
        )

    def to_dict(self) -> dict[str, Any]:
        return {"tier": self.plan.tier.label, "unit": self.unit, "plan": asdict(self.plan),
                "rows": [asdict(r) for r in self.rows]}  # fmt: skip


def _step_of(label: str) -> str:
    return next(step for lab, step, _ in COMPONENTS if lab == label)


def _component_ms(times_of: Callable[[str], RangeTimes]) -> dict[str, float]:
    """ms per call of each component; "code2wav other" = decode minus its three parts."""
    out = {}
    for label, step, rng in COMPONENTS:
        out[label] = times_of(step).per_call_ms[rng]
    parts = sum(out[label] for label, _, rng in COMPONENTS if rng in COMPONENT_RANGES)
    out["code2wav other"] = max(0.0, out["code2wav other"] - parts)
    return out


def _num(x: float) -> str:
    return f"{x:g}" if x == int(x) else f"{x:.2f}"
