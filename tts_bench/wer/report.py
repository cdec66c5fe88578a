"""WER results as a table (shaped like the seed's) and as one JSON document.

    | Branch / arm | mean WER | WER (empty = 1) | 95% CI        | median | corpus | ASR failures |
    | base         | 0.65%    | 0.65%           | [0.0%, 1.4%]  | 0.00%  | 0.52%  | 0            |
    | test         | 0.65%    | 0.65%           | [0.0%, 1.4%]  | 0.00%  | 0.52%  | 0            |

    paired test vs base: 20/20 identical audio, 20/20 identical transcripts, ΔWER +0.00 points [+0.00, +0.00]
    - test vs base: exact: audio byte-identical (20/20)
    verdict: pass

`WER (empty = 1)` counts every empty transcript as WER 1.0 (seed-tts-eval's convention, the
number comparable with published ones), `95% CI` is its t interval over utterances; `mean WER` averages the utterances with a transcript,
with the failures counted beside it. A failed exact comparison lists the differing utterances
with both transcripts under the reasons.

The JSON (`--format json`) carries at least `arms.<arm>.mean_wer/.mean_wer_seedtts/.median_wer/
.corpus_wer/.completed/.failures.<kind>`, `paired.identical_audio`, `paired.delta_mean_wer_ci95`,
`paired.differing`, `modes`, `differences`, `asr.{backend,model,normalizer}` and `verdict`. WER
values are fractions (0.0065 = 0.65%).

A Chinese set (`wer.language: zh`) is scored in characters: the table's columns, the title and
the Δ lines say CER, and the JSON's top-level `metric` ("wer" | "cer") and `language` say which
the `*_wer` fields hold (one schema for both; every arm and paired entry repeats `metric`).

    df = wer_table(report); text = render_report(report, "md")
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pandas as pd

from tts_bench.report.tables import render
from tts_bench.wer.score import ArmScore, Paired

if TYPE_CHECKING:
    from tts_bench.wer.runner import WerReport


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100.0 * x:.2f}%"


def _ci(ci: tuple[float, float] | None) -> str:
    return "n/a" if ci is None else f"[{100.0 * ci[0]:.1f}%, {100.0 * ci[1]:.1f}%]"


def _failures(a: ArmScore) -> str:
    if not a.failed:
        return "0"
    kinds = ", ".join(f"{k} {n}" for k, n in a.failures.items() if n)
    return f"{a.failed} ({kinds})"


def report_metric(report: WerReport) -> str:
    """`WER` or `CER`: what this report's error rates count (words or characters)."""
    return (report.arms[0].metric if report.arms else "wer").upper()


def wer_table(report: WerReport) -> pd.DataFrame:
    m = report_metric(report)
    rows = [{
        "Branch / arm": a.arm,
        f"mean {m}": _pct(a.mean_wer),
        f"{m} (empty = 1)": _pct(a.mean_wer_seedtts),
        "95% CI": _ci(a.mean_wer_seedtts_ci95),
        "median": _pct(a.median_wer),
        "corpus": _pct(a.corpus_wer),
        "ASR failures": _failures(a),
        "scored": f"{a.completed}/{a.total}",
        ">50%": str(a.above_50),
        "insertions": str(a.insertions),
    } for a in report.arms]
    return pd.DataFrame(rows)


def paired_line(p: Paired) -> str:
    ci = p.delta_mean_wer_ci95
    delta = "n/a" if p.delta_mean_wer is None else f"{100 * p.delta_mean_wer:+.2f} points"
    ci_s = "" if ci is None else f" 95% CI [{100 * ci[0]:+.2f}, {100 * ci[1]:+.2f}]"
    return (f"paired {p.test} vs {p.base}: {p.identical_audio}/{p.n_total} identical audio, "
            f"{p.identical_transcripts}/{p.n_total} identical transcripts, Δ{p.metric.upper()} {delta}{ci_s} "
            f"over {p.n_paired} utterances")


def footer_lines(report: WerReport) -> list[str]:
    lines = [paired_line(p) for p in report.paired]
    lines += [f"history {h.arm}: " + paired_line(h.paired).split(": ", 1)[1] for h in report.history]
    asr = report.asr
    lines.append(f"ASR: {asr.backend} {asr.model} ({asr.language}, {asr.compute_type}, beam {asr.beam_size}, "
                 f"vad {'on' if asr.vad else 'off'}), normalizer {report.normalizer}; "
                 f"audio {sum(a.audio_seconds for a in report.arms):.1f} s, ASR decoded "
                 f"{decoded_audio_seconds(report):.1f} s of it in {decode_wall_seconds(report):.1f} s wall "
                 f"(+ model load {report.asr_load_s:.1f} s; the rest came from the transcript cache)")
    lines += [f"- {r}" for r in report.gate.reasons]
    lines += [f"  differs: {d}" for d in report.gate.differences]
    lines.append(f"verdict: {report.gate.verdict}")
    if report.history_written:
        lines.append(f"recorded in history: {report.history_written}")
    return lines


def decode_wall_seconds(report: WerReport) -> float:
    """Wall time of the transcription phase less the model load: with several clips decoded at
    once, per-utterance times overlap, so their sum would overstate what the phase cost."""
    return max(report.asr_wall_s - report.asr_load_s, 0.0)


def decoded_audio_seconds(report: WerReport) -> float:
    """Audio seconds the ASR actually decoded (cache hits excluded): the real-time factor's base."""
    return sum(u["audio_seconds"] for a in report.arms for u in a.utterances
               if u["asr_seconds"] > 0 and not u["cached"])


def _arm_doc(a: ArmScore, include_utterances: bool) -> dict[str, Any]:
    d = a.to_dict()
    if not include_utterances:
        d.pop("utterances")
    return d


def report_doc(report: WerReport, *, include_utterances: bool = False) -> dict[str, Any]:
    asr = report.asr.to_dict()
    asr["normalizer"] = report.normalizer
    audio = decoded_audio_seconds(report)
    asr_s = sum(a.asr_seconds for a in report.arms)  # per-utterance decode times, summed
    wall = decode_wall_seconds(report)
    return {
        "run": str(report.run_path),
        "metric": report_metric(report).lower(),
        "language": report.arms[0].language if report.arms else "en",
        "arms": {a.arm: _arm_doc(a, include_utterances) for a in report.arms},
        "paired": report.paired[0].to_dict() if report.paired else None,
        "paired_all": [p.to_dict() for p in report.paired],
        "history": [{"arm": h.arm, "reference": h.reference, **h.paired.to_dict()} for h in report.history],
        "asr": asr,
        "timings": {"audio_seconds": sum(a.audio_seconds for a in report.arms),
                    "decoded_audio_seconds": audio, "asr_seconds": asr_s, "asr_load_seconds": report.asr_load_s,
                    "asr_wall_seconds": report.asr_wall_s,
                    "asr_decode_wall_seconds": wall,
                    "asr_x_realtime": (audio / wall) if audio and wall else None},
        "verdict": report.gate.verdict,
        "exit_status": int(report.gate.exit_status),
        "reasons": report.gate.reasons,
        "modes": report.gate.modes,
        "differences": report.gate.differences,
        "history_written": report.history_written,
    }


def render_report(report: WerReport, fmt: str, *, width: int = 120) -> str:
    """The whole result in one of md | table | csv | json."""
    if fmt == "json":
        return json.dumps(report_doc(report), indent=2, ensure_ascii=False) + "\n"
    title = f"seed-tts {report_metric(report)}" + (f" ({report.arms[0].language})" if report.arms else "")
    table = render(wer_table(report), fmt, title=title, width=width)
    if fmt == "csv":
        return table
    return table.rstrip("\n") + "\n\n" + "\n".join(footer_lines(report)) + "\n"
