"""The WER gate: compare arms with each other and with the committed history, give a verdict.

History: `results/wer-history/<created>-<hash>.json`, one JSON record per accepted run
(`tts-bench wer --accept`), committed to the repository. A record holds, per arm, the TTS config
hash (the arm's config without its `wer`/`bench`/`mem` sections, plus the prompt selection), the
ASR provenance (backend, model + weights hash, compute type, options, library versions), the
normalizer, the language and metric (`wer` on an English set, `cer` on a Chinese one), and every
utterance's transcript, WER/CER and audio hash.

An arm is checked against the newest history entry with the same TTS config hash *and* the same
ASR provenance, normalizer and metric (a CER is never compared with a WER). If entries with that config exist but none with this provenance,
the comparison is refused (InvalidRunError, exit 5): a WER from another ASR setup is not
comparable, and silently skipping it would let the gate pass unchecked.

Each comparison (test arm vs base arm, or an arm vs its history) is judged in a mode
(`wer.mode`; `auto` = exact when the comparison's audio is byte-identical, else
non-inferiority):

- exact (the seed's protocol): passes when every utterance's audio is byte-identical (a
  deterministic ASR then gives identical transcripts, even for utterances that failed), or when
  every transcript and audio hash is equal; on failure the differing utterances are listed with
  both transcripts.
- non-inferiority: passes when the upper bound of the 95% t interval of the mean per-utterance
  ΔWER (test − base, empty transcripts scored 1.0) is under `wer.margin_points` percentage
  points. Identical transcripts pass trivially. A WER that went *down* passes (it is not worse).
  `tts_bench.wer.advice` says before a run whether its prompt count can resolve the margin.

Verdict (exit code):
- `invalid` (5): an arm has more failures than `wer.max_failures`.
- `regression` (4): some comparison failed its mode (or nothing scored in both).
- `pass` (0): otherwise; the reasons list says what each arm was checked against, and how.

    result = judge(arms, paired, history_checks, params)
    result.verdict, result.exit_status, result.reasons
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tts_bench.config.paths import check_writable
from tts_bench.errors import ExitStatus, InvalidRunError
from tts_bench.rundir.atomic_json import write_json_atomic
from tts_bench.wer.language import METRIC
from tts_bench.config.wer import WerParams
from tts_bench.wer.score import ArmScore, Paired, compare_utterances

HISTORY_VERSION = 1
# The config sections that determine an arm's audio, beside the backend's own section (the
# embedded backend's is `stages`). Sections of other backends, wer/bench/mem, and fields added
# to them later, do not change this arm's audio and must not orphan its history.
_AUDIO_SECTIONS = ("backend", "prompts")
_BACKEND_SECTION = {"embedded": "stages"}


def tts_config_hash(config: dict[str, Any], *, num_prompts: int, shuffle: bool) -> str:
    """Hash of what determines an arm's audio: the backend, its section and the prompts, plus
    the selection."""
    backend = config.get("backend", "")
    keys = (*_AUDIO_SECTIONS, _BACKEND_SECTION.get(backend, backend))
    tts = {k: config[k] for k in keys if k in config}
    tts["selection"] = {"num_prompts": num_prompts, "shuffle": shuffle}
    blob = json.dumps(tts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class HistoryEntry:
    """One arm of one accepted run."""

    source: str  # file name
    created: str
    arm: str
    tts_config_hash: str
    asr: dict[str, Any]
    normalizer: str
    utterances: list[dict]
    metric: str = "wer"  # records from before Chinese sets are English WER
    language: str = "en"


def _provenance_key(asr: dict, normalizer: str, metric: str = "wer") -> str:
    return json.dumps({"asr": asr, "normalizer": normalizer, "metric": metric}, sort_keys=True)


def check_history_dir(directory: str | Path) -> None:
    """`--accept` will write into `directory` (`wer.history_dir`): a ConfigError (exit 2) now if
    it cannot be a writable folder, rather than after the run's synthesis and transcription."""
    check_writable(Path(directory), flag="wer.history_dir, --accept", directory=True)


def read_history(directory: str | Path) -> list[HistoryEntry]:
    """The history in `directory` (`wer.history_dir`, resolved by `history_dir_for`), or none
    where it does not exist yet (an unresolved "" reads none, not the working folder)."""
    return load_history(Path(directory)) if str(directory) and Path(directory).is_dir() else []


def load_history(directory: Path) -> list[HistoryEntry]:
    """Every arm of every record, newest record first."""
    entries = []
    for path in sorted(Path(directory).glob("*.json"), reverse=True):
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("history_version") != HISTORY_VERSION:
            continue
        for arm, a in doc["arms"].items():
            entries.append(HistoryEntry(path.name, doc["created"], arm, a["tts_config_hash"],
                                        doc["asr"], doc["normalizer"], a["utterances"],
                                        doc.get("metric", "wer"), doc.get("language", "en")))
    return entries


def find_reference(
    history: Sequence[HistoryEntry], tts_hash: str, asr: dict, normalizer: str, *, refuse: bool = True,
    metric: str = "wer",
) -> HistoryEntry | None:
    """Newest entry with this config, provenance and metric; refuses a config recorded only
    under another."""
    same_config = [h for h in history if h.tts_config_hash == tts_hash]
    want = _provenance_key(asr, normalizer, metric)
    for h in same_config:
        if _provenance_key(h.asr, h.normalizer, h.metric) == want:
            return h
    if same_config and refuse:
        h = same_config[0]
        raise InvalidRunError(
            f"error: the WER history for this config ({h.source}) was recorded as {h.metric.upper()} with ASR "
            f"{_describe(h.asr, h.normalizer)}, this run scores {metric.upper()} with {_describe(asr, normalizer)} "
            f"(results/wer-history); error rates from different ASR setups or metrics are not comparable: "
            f"rerun with the recorded --asr/--asr-model/--normalizer/--language (and library versions), or "
            f"record a new baseline with --accept"
        )
    return None


def _describe(asr: dict, normalizer: str) -> str:
    libs = ",".join(f"{k} {v}" for k, v in sorted(asr.get("library_versions", {}).items()))
    return (f"{asr.get('backend')} {asr.get('model')}@{asr.get('model_sha256')} "
            f"{asr.get('compute_type')} beam {asr.get('beam_size')} vad {asr.get('vad')} "
            f"[{libs}] + normalizer {normalizer}")


def write_history(
    directory: Path, *, arms: Sequence[ArmScore], tts_hashes: dict[str, str], asr: dict,
    normalizer: str, run_path: str, config_hashes: dict[str, str], language: str = "en",
    created: _dt.datetime | None = None,
) -> Path:
    """Append one accepted run (atomically) and return its path. `created` (UTC; default now)
    names the file to the second and orders the history: a test passes its own rather than wait."""
    created = created if created is not None else _dt.datetime.now(_dt.timezone.utc)
    doc = {
        "history_version": HISTORY_VERSION,
        "created": created.isoformat(timespec="seconds"),
        "run": run_path,
        "asr": asr,
        "normalizer": normalizer,
        "language": language,
        "metric": METRIC[language],
        "arms": {
            a.arm: {
                "tts_config_hash": tts_hashes[a.arm],
                "config_hash": config_hashes.get(a.arm),
                "mean_wer": a.mean_wer, "median_wer": a.median_wer, "corpus_wer": a.corpus_wer,
                "failures": a.failures,
                "mean_wer_seedtts": a.mean_wer_seedtts,
                "utterances": [{k: u[k] for k in ("request_id", "text", "transcript", "wer", "audio_sha256",
                                                  "failure_kind")} for u in a.utterances],
            }
            for a in arms
        },
    }
    key = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:8]
    return write_json_atomic(Path(directory) / f"{created:%Y%m%d-%H%M%S}-{key}.json", doc)


@dataclass(frozen=True)
class HistoryCheck:
    arm: str
    reference: str  # history file
    paired: Paired


def check_history(arm: ArmScore, ref: HistoryEntry) -> HistoryCheck:
    paired = compare_utterances(f"history:{ref.source}", ref.utterances, arm.arm, arm.utterances,
                                metric=arm.metric)
    return HistoryCheck(arm.arm, ref.source, paired)


@dataclass(frozen=True)
class GateResult:
    verdict: str  # pass | regression | invalid
    exit_status: ExitStatus
    reasons: list[str] = field(default_factory=list)
    # exact-mode failures: one line per differing utterance, "<label> <id>: base "..." | test "...""
    differences: list[str] = field(default_factory=list)
    modes: list[str] = field(default_factory=list)  # the mode each comparison was judged in


def pair_mode(p: Paired, params: WerParams) -> str:
    """The mode a comparison is judged in: `auto` -> exact when all audio is byte-identical."""
    if params.mode != "auto":
        return params.mode
    return "exact" if p.n_total and p.identical_audio == p.n_total else "noninferiority"


def _quote(text: str | None, limit: int = 90) -> str:
    text = "" if text is None else text
    return '"' + (text if len(text) <= limit else text[: limit - 3] + "...") + '"'


def _judge_exact(p: Paired, label: str) -> tuple[bool, str, list[str]]:
    n = p.n_total
    if n and p.identical_audio == n:
        # Byte-identical audio gets identical transcripts from a deterministic ASR (and the same
        # failures): the seed's "bit-for-bit identical" pass, valid even where nothing scored.
        return True, f"{label}: exact: audio byte-identical ({n}/{n})", []
    lines = [f"{label} {d['request_id']}: {p.base} {_quote(d['base'])} | {p.test} {_quote(d['test'])}"
             for d in p.differing]
    audio_only = n - p.identical_audio - len(p.differing)
    if audio_only > 0:
        lines.append(f"{label}: {audio_only} more utterances with equal transcripts but different audio")
    return False, (f"{label}: exact: {len(p.differing)}/{n} transcripts and {n - p.identical_audio}/{n} "
                   f"audio hashes differ"), lines


def _judge_noninferiority(p: Paired, label: str, params: WerParams) -> tuple[bool, str]:
    if p.n_paired == p.n_total and p.identical_transcripts == p.n_total:
        return True, f"{label}: non-inferiority: transcripts identical ({p.n_total}/{p.n_total})"
    if p.delta_mean_wer_ci95 is None:
        return False, f"{label}: non-inferiority: fewer than 2 utterances scored in both"
    lo, hi = (100.0 * x for x in p.delta_mean_wer_ci95)
    delta = 100.0 * (p.delta_mean_wer or 0.0)
    ok = hi < params.margin_points
    return ok, (f"{label}: non-inferiority: Δ{p.metric.upper()} {delta:+.2f} points, 95% CI [{lo:+.2f}, {hi:+.2f}] over "
                f"{p.n_paired} utterances; upper bound {'<' if ok else '>='} margin {params.margin_points:g}")


def judge_pair(p: Paired, params: WerParams, mode: str | None = None) -> tuple[bool, str, list[str]]:
    """(passed, reason line, differing-utterance lines) of one comparison in its mode
    (`mode`: `pair_mode(p, params)` when the caller has it already)."""
    label = f"{p.test} vs {p.base}"
    if (mode or pair_mode(p, params)) == "exact":
        return _judge_exact(p, label)
    ok, why = _judge_noninferiority(p, label, params)
    return ok, why, []


def judge(
    arms: Sequence[ArmScore], paired: Sequence[Paired], history: Sequence[HistoryCheck], params: WerParams
) -> GateResult:
    reasons: list[str] = []
    invalid = [a for a in arms if a.failed > params.max_failures]
    for a in invalid:
        kinds = ", ".join(f"{k} {n}" for k, n in a.failures.items() if n)
        reasons.append(f"{a.arm}: {a.failed} failures ({kinds}) > max_failures {params.max_failures}")
    regressed, differences, modes = False, [], []
    for p in [*paired, *(h.paired for h in history)]:
        mode = pair_mode(p, params)
        ok, why, diff = judge_pair(p, params, mode)
        regressed |= not ok
        reasons.append(why)
        differences += diff
        modes.append(mode)
    if not paired and not history:
        reasons.append("no reference: single arm and no matching history (record one with --accept)")
    if invalid:
        return GateResult("invalid", ExitStatus.INVALID_RUN, reasons, differences, modes)
    if regressed:
        return GateResult("regression", ExitStatus.ACCURACY_REGRESSION, reasons, differences, modes)
    return GateResult("pass", ExitStatus.OK, reasons, differences, modes)
