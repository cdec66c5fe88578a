"""The WER gate end to end as library calls: generate (phase 1), then evaluate (phase 2).

`generate` runs each arm's backend in turn and records every (arm, prompt) in the run directory;
`evaluate` reads the run directory back (so `--transcribe-only <run>` re-scores an old run with
another ASR or normalizer), transcribes, scores, compares arms and history, and writes the result
into run.json. The first arm is the base every other arm is paired with.

    run = RunDir.create(root, "wer", command_line=argv, configs=..., extra=selection_doc(...))
    asyncio.run(generate(arms, prompts, run, params))
    report = evaluate(run, params, accept=False)
    report.gate.exit_status
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tts_bench import backends
from tts_bench.report import progress
from tts_bench.asr import (
    AsrOptions, AsrProvenance, Transcriber, backend_parallelism, describe_asr, make_transcriber,
)
from tts_bench.asr.models import cache_root
from tts_bench.backends.base import Backend
from tts_bench.errors import ConfigError, InvalidRunError
from tts_bench.inputs.prompts import select_prompts
from tts_bench.rundir.results import RunDir
from tts_bench.wer.gate import (
    GateResult,
    HistoryCheck,
    HistoryEntry,
    check_history,
    find_reference,
    judge,
    read_history,
    tts_config_hash,
    write_history,
)
from tts_bench.wer.generate import WER_TIER, GenRecord, generate_arm
from tts_bench.wer.language import get_scorer
from tts_bench.config.wer import WerParams
from tts_bench.wer.references import check_reference_texts
from tts_bench.wer.report import report_doc
from tts_bench.wer.score import ArmScore, Paired, compare_utterances, score_arm
from tts_bench.wer.transcribe import AsrSession, TranscriptCache, setup_key, transcribe_records

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WerArm:
    name: str
    config: Any  # tts_bench.config.BenchConfig


def asr_options(params: WerParams) -> AsrOptions:
    return AsrOptions(backend=params.asr, model=params.asr_model, compute_type=params.compute_type,
                      beam_size=params.beam_size, vad=params.vad, cpu_threads=params.cpu_threads,
                      workers=params.asr_workers, language=params.language)


def select_wer_prompts(prompts: Sequence, num_prompts: int, *, shuffle: bool, seed: int) -> list:
    """The prompts of a WER run: each utterance of the set at most once. `num_prompts` caps the
    count; a set smaller than that is used whole (cycling would score the same utterance twice
    and pretend to more evidence than there is)."""
    n = min(num_prompts, len(prompts))
    if n < num_prompts:
        log.warning("the prompt set has %d utterances, fewer than wer.num_prompts=%d: each is "
                    "evaluated once (a WER set is never cycled)", len(prompts), num_prompts)
    return select_prompts(prompts, n, shuffle=shuffle, seed=seed)


def selection_doc(prompts: Sequence, *, num_prompts: int, shuffle: bool) -> dict:
    """What run.json keeps about the prompt selection (order and texts live in requests.jsonl)."""
    return {"wer_selection": {"request_ids": [p.request_id for p in prompts],
                              "num_prompts": num_prompts, "shuffle": shuffle}}


async def generate(
    arms: Sequence[WerArm], prompts: Sequence, run: RunDir, params: WerParams, *,
    backend_factory: Callable[[Any], Backend] | None = None, timeout_s: float = 120.0,
) -> dict[str, list[GenRecord]]:
    """Phase 1: every arm's audio, one arm at a time; each backend is stopped before the next."""
    backend_factory = backend_factory or backends.make_backend  # looked up now: tests replace it
    out, described = {}, {}
    for arm in arms:
        t0 = time.perf_counter()
        backend = backend_factory(arm.config)
        progress.task(f"generate {arm.name}", len(prompts))
        out[arm.name] = await generate_arm(
            arm.name, backend, prompts, run.path,
            concurrency=params.concurrency, replicas=params.replicas, timeout_s=timeout_s,
            seed=params.seed, sink=lambda r: (run.append_request(r.to_json()), progress.advance()),
        )
        failed = sum(not r.ok for r in out[arm.name])
        log.info("generated arm %s: %d prompts, %d failed, %.1f s", arm.name, len(prompts), failed,
                 time.perf_counter() - t0)
        described[arm.name] = {**backend.describe(), "generate_seconds": time.perf_counter() - t0}
    run.update(status="generated", backends=described)
    return out


def generation_problems(generated: dict[str, list[GenRecord]], params: WerParams) -> list[str]:
    """Arms whose failed requests exceed `wer.max_failures`, as the gate would word them (the
    gate calls such a run invalid, exit 5; `--generate-only` says it before any transcription)."""
    problems = []
    for arm, records in generated.items():
        failed = [r.failure_kind or "failed" for r in records if not r.ok]
        if len(failed) > params.max_failures:
            kinds = ", ".join(f"{k} {failed.count(k)}" for k in sorted(set(failed)))
            problems.append(f"{arm}: {len(failed)} of {len(records)} requests failed ({kinds}) > "
                            f"max_failures {params.max_failures}")
    return problems


def read_generation(run: RunDir) -> dict[str, list[GenRecord]]:
    """Generation records per arm, in prompt order (a repeated id counts once: the first record,
    see RunDir.iter_requests)."""
    sel = run.doc.get("wer_selection")
    if run.kind != "wer" or sel is None:
        raise ConfigError(f"error: {run.path} is not a WER run (--transcribe-only); pass a directory made by tts-bench wer")
    by_arm: dict[str, dict[str, GenRecord]] = {arm: {} for arm in run.doc["configs"]}
    for rec in run.iter_requests():
        if rec.get("tier") == WER_TIER:
            try:
                record = GenRecord.from_json(rec)
            except TypeError:  # a record without the text or another field a generation writes
                raise ConfigError(f"error: {run.requests_path} holds a damaged generation record "
                                  f"({rec['arm']} {rec['request_id']}: missing fields) (--transcribe-only); "
                                  "regenerate the run") from None
            by_arm.setdefault(rec["arm"], {})[rec["request_id"]] = record
    out = {}
    for arm, recs in by_arm.items():
        missing = [i for i in sel["request_ids"] if i not in recs]
        if missing:
            raise InvalidRunError(
                f"error: arm {arm} of {run.path} has no audio record for {len(missing)} prompts "
                f"(first {missing[0]}) (--transcribe-only); the generation was interrupted: rerun it"
            )
        out[arm] = [recs[i] for i in sel["request_ids"]]
    return out


def precheck_history(configs: dict[str, dict], selection: dict, params: WerParams,
                     history: list[HistoryEntry] | None = None) -> None:
    """Refuse a history/provenance mismatch *before* minutes of generation and ASR (evaluate
    checks again, on the history as it is then; this only fails early). `history`: the records
    of `params.history_dir`, when the caller has read them already."""
    history = read_history(params.history_dir) if history is None else history
    if not history:
        return
    asr = describe_asr(asr_options(params)).to_dict()
    for config in configs.values():
        h = tts_config_hash(config, num_prompts=selection["num_prompts"], shuffle=selection["shuffle"])
        find_reference(history, h, asr, params.normalizer, refuse=True, metric=get_scorer(params.language, params.normalizer).metric)


@dataclass(frozen=True)
class WerReport:
    run_path: Path
    arms: list[ArmScore]
    paired: list[Paired]
    history: list[HistoryCheck]
    asr: AsrProvenance
    normalizer: str
    gate: GateResult
    asr_load_s: float
    asr_wall_s: float
    history_written: str | None = None


def _transcribe_all(gen, run: RunDir, params: WerParams, factory, provenance) -> tuple[dict, AsrSession, float]:
    options = asr_options(params)
    provenance = provenance or describe_asr(options)
    cache_dir = Path(params.cache_dir) if params.cache_dir else cache_root() / "transcripts"
    # The real models decode `backend_parallelism` clips at once; an injected factory (tests)
    # is not known to be thread-safe, so it gets one.
    parallel = 1 if factory else backend_parallelism(options)
    session = AsrSession(options, provenance, factory or make_transcriber,
                         TranscriptCache(cache_dir, setup_key(provenance)), parallel=parallel)
    t0 = time.perf_counter()
    results = {}
    for arm, recs in gen.items():
        progress.task(f"transcribe {arm}", len(recs))
        results[arm] = transcribe_records(recs, run.path, session, progress=lambda _: progress.advance())
    return results, session, time.perf_counter() - t0


def evaluate(
    run: RunDir, params: WerParams, *, accept: bool = False,
    factory: Callable[[AsrOptions], Transcriber] | None = None,
    provenance: AsrProvenance | None = None,
) -> WerReport:
    """Phase 2: transcribe, score, pair, check history, judge; result merged into run.json.

    `factory` / `provenance` default to the real ASR (`make_transcriber`, `describe_asr`); tests
    pass fakes."""
    gen = read_generation(run)
    # Before any transcription: a --transcribe-only may bring a normalizer that empties a text.
    texts = {r.request_id: r.text for records in gen.values() for r in records}
    check_reference_texts([(rid, text, f"{run.path.name}/requests.jsonl") for rid, text in texts.items()],
                          params.normalizer, language=params.language)
    results, session, asr_wall = _transcribe_all(gen, run, params, factory, provenance)
    scorer = get_scorer(params.language, params.normalizer)
    arms = [score_arm(arm, res, scorer) for arm, res in results.items()]
    base = arms[0]
    paired = [compare_utterances(base.arm, base.utterances, a.arm, a.utterances, metric=scorer.metric)
              for a in arms[1:]]
    sel = run.doc["wer_selection"]
    hashes = {a: tts_config_hash(c, num_prompts=sel["num_prompts"], shuffle=sel["shuffle"])
              for a, c in run.doc["configs"].items()}
    asr_dict = session.provenance.to_dict()
    history = read_history(params.history_dir)  # again: a long run may see a newer record
    checks = []
    for a in arms:
        ref = find_reference(history, hashes[a.arm], asr_dict, params.normalizer, refuse=not accept,
                             metric=scorer.metric)
        if ref is not None:
            checks.append(check_history(a, ref))
    gate = judge(arms, paired, checks, params)
    written = None
    if accept and gate.verdict != "invalid":
        written = str(write_history(Path(params.history_dir), arms=arms, tts_hashes=hashes, asr=asr_dict,
                                    normalizer=params.normalizer, run_path=run.path.name,
                                    language=scorer.language,
                                    config_hashes=run.doc.get("config_hashes", {})))
    report = WerReport(run.path, arms, paired, checks, session.provenance, params.normalizer, gate,
                       session.load_seconds, asr_wall, written)
    run.update(status="done", wer=report_doc(report, include_utterances=True))
    return report
