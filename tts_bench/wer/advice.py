"""Before a non-inferiority WER run: can this many prompts resolve the margin, and how many would?

The gate passes when the upper bound of the 95% t interval of mean ΔWER is under the margin. For
two arms that are equally good (true ΔWER 0) that happens with 80% probability once

    margin >= (t(0.975, n-1) + t(0.80, n-1)) * sd / sqrt(n)      (the MDE at n prompts)

where sd is the SD of the per-utterance differences. Where sd comes from, best first:

1. two history records of the same TTS config and ASR setup (a non-deterministic arm accepted
   twice): the SD of their per-utterance differences, exactly what the gate will see;
2. otherwise the larger of: sqrt(2) x the SD of the newest history record's per-utterance WERs
   (two independent draws of an utterance's WER, if its spread were all run-to-run), and the
   shipped measurement, piper at its default noise in both arms of A/As with faster-whisper
   tiny.en (`PIPER_AA_SD_POINTS`). The history alone can mislead: a deterministic record
   (noise 0) is cleaner than any non-deterministic run it would be compared with.

    advice = prompt_advice(params, num_prompts=40, available=150)
    advice.resolvable, advice.needed, advice.line()
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tts_bench.verdicts.stats import ALPHA, POWER, mde_log, samples_needed
from tts_bench.wer.gate import HistoryEntry, read_history
from tts_bench.wer.language import METRIC
from tts_bench.config.wer import WerParams
from tts_bench.wer.score import paired_rows, scored_wer

# SD of per-utterance ΔWER (points), pooled over 24 piper A/As at its default noise (noise_scale
# 0.667, noise_w_scale 0.8) on the first 80 builtin prompts, faster-whisper tiny.en int8
# (results/wer-gate/figures.md).
PIPER_AA_SD_POINTS = 7.7


def mde_points(sd_points: float, n: int, *, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest margin n paired utterances resolve at `power` when the arms are equally good."""
    return math.inf if n < 2 else mde_log(sd_points, n, n - 1, alpha=alpha, power=power)


def prompts_needed(sd_points: float, margin_points: float, *, limit: int = 100_000) -> int | None:
    """Smallest n whose MDE is within the margin (None past `limit`)."""
    return samples_needed(sd_points, margin_points, limit=limit, step=1)


@dataclass(frozen=True)
class PromptAdvice:
    margin_points: float
    num_prompts: int
    available: int
    sd_points: float
    source: str
    mde_points: float
    needed: int | None
    metric: str = "wer"

    @property
    def resolvable(self) -> bool:
        return self.mde_points <= self.margin_points

    def line(self) -> str:
        head = (f"wer: non-inferiority margin {self.margin_points:g} points with {self.num_prompts} prompts: "
                f"per-utterance Δ{self.metric.upper()} SD ~{self.sd_points:.1f} points ({self.source}), MDE at 80% power "
                f"{self.mde_points:.1f} points")
        if self.resolvable:
            return f"{head}: resolvable (needs >= {self.needed} prompts)"
        if self.needed is not None and self.needed <= self.available:
            return f"{head}: NOT resolvable; it needs >= {self.needed} prompts (--num-prompts {self.needed})"
        return (f"{head}: NOT resolvable; it needs >= {self.needed or 'too many'} prompts and the set has "
                f"{self.available}: use a larger set or a wider wer.margin_points")


def _sd(values: np.ndarray) -> float | None:
    return float(values.std(ddof=1)) if values.size > 1 else None


def history_spread(history: list[HistoryEntry]) -> tuple[float, str]:
    """(SD of per-utterance ΔWER in points, where it came from); see the module docstring."""
    by_config: dict[tuple[str, str], list[HistoryEntry]] = {}
    for h in history:  # newest first
        by_config.setdefault((h.tts_config_hash, str(sorted(h.asr.items()))), []).append(h)
    for entries in by_config.values():
        if len(entries) >= 2:
            _, deltas = paired_rows(entries[1].utterances, entries[0].utterances)
            sd = _sd(deltas)
            if sd is not None and sd > 0:
                return 100.0 * sd, f"history {entries[1].source} vs {entries[0].source}"
    shipped = (PIPER_AA_SD_POINTS, "the shipped piper A/A measurement")
    if not history:
        return shipped
    newest = history[0]
    sd = _sd(np.array([w for w in map(scored_wer, newest.utterances) if w is not None]))
    if sd is not None and 100.0 * math.sqrt(2.0) * sd > shipped[0]:
        return 100.0 * math.sqrt(2.0) * sd, f"sqrt(2) x per-utterance spread of history {newest.source}"
    return shipped


def prompt_advice(params: WerParams, num_prompts: int, *, available: int,
                  history: list[HistoryEntry] | None = None) -> PromptAdvice:
    """`history`: the records of `params.history_dir`, when the caller has read them already.
    Only records of this run's metric count: a CER spread says nothing about a WER run."""
    metric = METRIC[params.language]
    history = read_history(params.history_dir) if history is None else history
    sd, source = history_spread([h for h in history if h.metric == metric])
    if metric != "wer" and source.startswith("the shipped"):
        source += ", English WER: no CER history yet"
    return PromptAdvice(params.margin_points, num_prompts, available, sd, source,
                        mde_points(sd, num_prompts), prompts_needed(sd, params.margin_points), metric)
