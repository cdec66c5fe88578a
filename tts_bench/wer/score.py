"""WER scores: per utterance (jiwer), per arm, and paired across arms.

Per utterance the reference is the normalized target text and the hypothesis the normalized
transcript; `wer = (S + D + I) / N` over reference words. On a Chinese set (`wer.language: zh`)
the units are characters and the same numbers are a CER (`tts_bench.wer.language`): the field
names stay `wer`/`mean_wer`/... (one schema for both), and `metric` ("wer" or "cer") on every
arm and comparison says which it is; `ref_words` then counts reference characters. WER is unbounded above 1 (a looping
transcript inserts words), so insertions are also reported on their own and the median and the
count above 50% sit next to the mean.

Per arm: `mean_wer` (mean of per-utterance WER over the utterances that got a transcript),
`mean_wer_seedtts` (the same with every empty transcript counted as WER 1.0: seed-tts-eval's
`content_error_mean` convention, the number to compare with published ones) and its Student t
95% interval over utterances `mean_wer_seedtts_ci95`, `median_wer`,
`corpus_wer` (Σ errors / Σ reference words: long utterances weigh more), `above_50`,
`insertions`, `completed`, and `failures` by kind. Failed utterances are counted, never silently
dropped, and the gate judges them.

Paired (test arm vs base arm, same prompts): per-utterance ΔWER (empty transcripts as 1.0) over
utterances scored in both arms, its mean with a Student t 95% interval (n - 1 df over the paired
differences: at n = 20-40 a percentile bootstrap is too narrow), the SD of the differences, and
identity lines: utterances whose WAV files are byte-identical, whose transcripts are identical,
and the ones whose transcripts differ (both texts, for the exact mode's failure list).

    s = score_utterance("Hello, world!", "hello word", seed_tts_normalize)   # s.wer == 0.5
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import jiwer
import numpy as np

from tts_bench.verdicts.stats import ALPHA, BlockInterval, block_interval
from tts_bench.wer.language import Scorer, as_scorer
from tts_bench.wer.references import has_words
from tts_bench.wer.transcribe import UttTranscript

FAILURE_KINDS = ("request_failed", "no_audio", "asr_failed", "empty_transcript")


@dataclass(frozen=True)
class UttScore:
    request_id: str
    wer: float
    ref_words: int
    substitutions: int
    deletions: int
    insertions: int
    reference: str  # normalized
    hypothesis: str  # normalized

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions


def score_utterance(reference: str, hypothesis: str, normalize: Callable[[str], str] | Scorer,
                    request_id: str = "") -> UttScore:
    """jiwer WER (or CER, with a character Scorer) of one normalized pair; an empty normalized
    reference is a ValueError. A bare normalizer function scores English words."""
    scorer = as_scorer(normalize)
    ref, hyp = scorer.reference(reference), scorer.transcript(hypothesis)
    if not has_words(ref):
        raise ValueError(f"reference text of {request_id or 'utterance'} has no words after normalization")
    out = jiwer.process_words(scorer.units(ref), scorer.units(hyp))
    n = out.hits + out.substitutions + out.deletions
    wer = (out.substitutions + out.deletions + out.insertions) / n
    return UttScore(request_id, wer, n, out.substitutions, out.deletions, out.insertions, ref, hyp)


@dataclass(frozen=True)
class ArmScore:
    arm: str
    completed: int
    total: int
    failures: dict[str, int]
    mean_wer: float | None
    mean_wer_seedtts: float | None  # empty transcripts counted as 1.0 (seed-tts-eval)
    median_wer: float | None
    corpus_wer: float | None
    above_50: int
    insertions: int
    audio_seconds: float
    asr_seconds: float
    utterances: list[dict] = field(default_factory=list)  # per utterance, for records and history
    # t 95% interval of mean_wer_seedtts over the utterances (None below 2): how well this many
    # prompts pin the arm's own error rate (the gate judges the paired Δ, not this)
    mean_wer_seedtts_ci95: tuple[float, float] | None = None
    metric: str = "wer"  # "cer" on a Chinese set: the same fields, counted in characters
    language: str = "en"

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    def to_dict(self) -> dict:
        return asdict(self)


def scored_wer(u: dict) -> float | None:
    """An utterance row's WER with an empty transcript counted as 1.0 (seed-tts-eval's
    convention); None for utterances without audio or ASR (counted as failures instead)."""
    if u.get("wer") is not None:
        return float(u["wer"])
    return 1.0 if u.get("failure_kind") == "empty_transcript" else None


def _utt_row(t: UttTranscript, s: UttScore | None) -> dict:
    return {
        "request_id": t.gen.request_id, "text": t.gen.text, "transcript": t.transcript,
        "wer": None if s is None else s.wer, "errors": None if s is None else s.errors,
        "ref_words": None if s is None else s.ref_words,
        "insertions": None if s is None else s.insertions,
        "audio_sha256": t.gen.audio_sha256, "audio_seconds": t.gen.audio_seconds,
        "wav": t.gen.wav, "failure_kind": t.failure_kind, "failure_detail": t.failure_detail,
        "asr_seconds": t.asr_seconds, "cached": t.cached,
    }


def score_arm(arm: str, results: Sequence[UttTranscript], normalize: Callable[[str], str] | Scorer) -> ArmScore:
    normalize = as_scorer(normalize)
    scores = [score_utterance(t.gen.text, t.transcript or "", normalize, t.gen.request_id) if t.ok else None
              for t in results]
    ok = [s for s in scores if s is not None]
    wers = np.array([s.wer for s in ok])
    failures = Counter(t.failure_kind for t in results if not t.ok)
    ref_words = sum(s.ref_words for s in ok)
    rows = [_utt_row(t, s) for t, s in zip(results, scores)]
    seedtts = [w for w in map(scored_wer, rows) if w is not None]
    return ArmScore(
        arm=arm,
        completed=len(ok),
        total=len(results),
        failures={k: failures.get(k, 0) for k in FAILURE_KINDS},
        mean_wer=float(wers.mean()) if ok else None,
        mean_wer_seedtts=float(np.mean(seedtts)) if seedtts else None,
        median_wer=float(np.median(wers)) if ok else None,
        corpus_wer=sum(s.errors for s in ok) / ref_words if ok else None,
        above_50=int((wers > 0.5).sum()),
        insertions=sum(s.insertions for s in ok),
        audio_seconds=sum(t.gen.audio_seconds for t in results),
        asr_seconds=sum(t.asr_seconds for t in results),
        utterances=rows,
        mean_wer_seedtts_ci95=t_mean_ci(np.array(seedtts, dtype=np.float64)),
        metric=normalize.metric,
        language=normalize.language,
    )


@dataclass(frozen=True)
class Paired:
    base: str
    test: str
    n_paired: int  # utterances scored in both arms (empty transcripts scored as 1.0)
    n_total: int
    delta_mean_wer: float | None  # test - base, fraction
    delta_mean_wer_ci95: tuple[float, float] | None  # t interval; None with fewer than 2 pairs
    identical_audio: int
    identical_transcripts: int
    sd_delta_wer: float | None = None  # SD of the per-utterance differences
    # utterances whose transcripts differ: request_id, base/test transcript and WER
    differing: list[dict] = field(default_factory=list)
    metric: str = "wer"  # what the deltas are: "wer" or "cer" (a comparison never mixes them)

    def to_dict(self) -> dict:
        return asdict(self)


def _t_interval(deltas: np.ndarray, alpha: float = ALPHA) -> BlockInterval | None:
    # deltas: [n]; None below 2 values (block_interval would take the mean of nothing)
    return block_interval(deltas, alpha=alpha) if deltas.size >= 2 else None


def t_mean_ci(deltas: np.ndarray, *, alpha: float = ALPHA) -> tuple[float, float] | None:
    """Student t (1 - alpha) interval of the mean of `deltas`; None with fewer than 2 values.
    The A/B's block interval (`stats.block_interval`), with utterances as the blocks."""
    iv = _t_interval(deltas, alpha)
    return None if iv is None else (iv.lo, iv.hi)


def paired_rows(base: Sequence[dict], test: Sequence[dict]) -> tuple[list[str], np.ndarray]:
    """Request ids scored in both and the per-utterance ΔWER (test − base), empty = 1.0."""
    b = {u["request_id"]: scored_wer(u) for u in base}
    t = {u["request_id"]: scored_wer(u) for u in test}
    ids = [u["request_id"] for u in base if b.get(u["request_id"]) is not None and t.get(u["request_id"]) is not None]
    return ids, np.array([t[i] - b[i] for i in ids], dtype=np.float64)


def _differing(base: Sequence[dict], tb: dict[str, dict]) -> list[dict]:
    out = []
    for u in base:
        v = tb.get(u["request_id"])
        if v is not None and (u.get("transcript") or "") != (v.get("transcript") or ""):
            out.append({"request_id": u["request_id"], "base": u.get("transcript"), "test": v.get("transcript"),
                        "base_wer": scored_wer(u), "test_wer": scored_wer(v)})
    return out


def compare_utterances(base_name: str, base: Sequence[dict], test_name: str, test: Sequence[dict],
                       *, metric: str = "wer") -> Paired:
    """Paired comparison of two per-utterance lists (an arm's, or a history record's), both
    scored as `metric`."""
    ids, deltas = paired_rows(base, test)
    iv = _t_interval(deltas)
    tb = {u["request_id"]: u for u in test}
    same_audio = sum(1 for u in base if u.get("audio_sha256") and u["audio_sha256"] == tb.get(u["request_id"], {}).get("audio_sha256"))
    same_text = sum(1 for u in base if u.get("transcript") is not None
                    and u["transcript"] == tb.get(u["request_id"], {}).get("transcript"))
    return Paired(
        base=base_name, test=test_name, n_paired=len(ids), n_total=len(base),
        delta_mean_wer=float(deltas.mean()) if deltas.size else None,
        delta_mean_wer_ci95=None if iv is None else (iv.lo, iv.hi), identical_audio=same_audio,
        identical_transcripts=same_text, sd_delta_wer=None if iv is None else iv.sd,
        differing=_differing(base, tb), metric=metric,
    )
