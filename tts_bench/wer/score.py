"""WER scores: per utterance (jiwer), per arm, and paired across arms.

Per utterance the reference is the normalized target text and the hypothesis the normalized
transcript; `wer = (S + D + I) / N` over reference words. WER is unbounded above 1 (a looping
transcript inserts words), so insertions are also reported on their own and the median and the
count above 50% sit next to the mean.

Per arm: `mean_wer` (mean of per-utterance WER: the number papers report, seed-tts-eval's
`content_error_mean`), `median_wer`, `corpus_wer` (Σ errors / Σ reference words: long
utterances weigh more), `above_50`, `insertions`, `completed`, and `failures` by kind. Failed
utterances have no WER; they are counted, never silently dropped, and the gate judges them.

Paired (test arm vs base arm, same prompts): per-utterance ΔWER over utterances scored in both
arms, its mean with a bootstrap 95% CI (resampling utterances), and identity lines: utterances
whose WAV files are byte-identical, and whose transcripts are identical.

    s = score_utterance("Hello, world!", "hello word", seed_tts_normalize)   # s.wer == 0.5
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import jiwer
import numpy as np

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


def score_utterance(reference: str, hypothesis: str, normalize: Callable[[str], str], request_id: str = "") -> UttScore:
    """jiwer WER of one normalized pair; an empty normalized reference is a ValueError."""
    ref, hyp = normalize(reference), normalize(hypothesis)
    if not ref.split():
        raise ValueError(f"reference text of {request_id or 'utterance'} is empty after normalization")
    out = jiwer.process_words(ref, hyp)
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
    median_wer: float | None
    corpus_wer: float | None
    above_50: int
    insertions: int
    audio_seconds: float
    asr_seconds: float
    utterances: list[dict] = field(default_factory=list)  # per utterance, for records and history

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    def to_dict(self) -> dict:
        return asdict(self)


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


def score_arm(arm: str, results: Sequence[UttTranscript], normalize: Callable[[str], str]) -> ArmScore:
    scores = [score_utterance(t.gen.text, t.transcript or "", normalize, t.gen.request_id) if t.ok else None
              for t in results]
    ok = [s for s in scores if s is not None]
    wers = np.array([s.wer for s in ok])
    failures = Counter(t.failure_kind for t in results if not t.ok)
    ref_words = sum(s.ref_words for s in ok)
    return ArmScore(
        arm=arm,
        completed=len(ok),
        total=len(results),
        failures={k: failures.get(k, 0) for k in FAILURE_KINDS},
        mean_wer=float(wers.mean()) if ok else None,
        median_wer=float(np.median(wers)) if ok else None,
        corpus_wer=sum(s.errors for s in ok) / ref_words if ok else None,
        above_50=int((wers > 0.5).sum()),
        insertions=sum(s.insertions for s in ok),
        audio_seconds=sum(t.gen.audio_seconds for t in results),
        asr_seconds=sum(t.asr_seconds for t in results),
        utterances=[_utt_row(t, s) for t, s in zip(results, scores)],
    )


@dataclass(frozen=True)
class Paired:
    base: str
    test: str
    n_paired: int  # utterances scored in both arms
    n_total: int
    delta_mean_wer: float | None  # test - base, fraction
    delta_mean_wer_ci95: tuple[float, float] | None
    identical_audio: int
    identical_transcripts: int

    def to_dict(self) -> dict:
        return asdict(self)


def bootstrap_mean_ci(
    deltas: np.ndarray, *, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile 95% CI of the mean of `deltas` (utterances resampled with replacement)."""
    # deltas: [n]
    if deltas.size == 0:
        raise ValueError("bootstrap of an empty sample")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, deltas.size, size=(resamples, deltas.size))
    means = deltas[idx].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def paired_rows(base: Sequence[dict], test: Sequence[dict]) -> tuple[list[str], np.ndarray]:
    """Request ids scored in both and the per-utterance ΔWER (test − base)."""
    b = {u["request_id"]: u["wer"] for u in base if u.get("wer") is not None}
    t = {u["request_id"]: u["wer"] for u in test if u.get("wer") is not None}
    ids = [u["request_id"] for u in base if u["request_id"] in b and u["request_id"] in t]
    return ids, np.array([t[i] - b[i] for i in ids], dtype=np.float64)


def compare_utterances(
    base_name: str, base: Sequence[dict], test_name: str, test: Sequence[dict], *,
    resamples: int = 2000, seed: int = 0,
) -> Paired:
    """Paired comparison of two per-utterance lists (an arm's, or a history record's)."""
    ids, deltas = paired_rows(base, test)
    tb = {u["request_id"]: u for u in test}
    same_audio = sum(1 for u in base if u.get("audio_sha256") and u["audio_sha256"] == tb.get(u["request_id"], {}).get("audio_sha256"))
    same_text = sum(1 for u in base if u.get("transcript") is not None
                    and u["transcript"] == tb.get(u["request_id"], {}).get("transcript"))
    ci = bootstrap_mean_ci(deltas, resamples=resamples, seed=seed) if deltas.size else None
    return Paired(
        base=base_name, test=test_name, n_paired=len(ids), n_total=len(base),
        delta_mean_wer=float(deltas.mean()) if deltas.size else None,
        delta_mean_wer_ci95=ci, identical_audio=same_audio, identical_transcripts=same_text,
    )
