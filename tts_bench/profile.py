"""Launch accounting per A/B arm on a fixed small in-process workload (`tts-bench profile`).

For each arm the stages are built in this process from the arm's `stages` config (seeded random
weights, `runner.device` / `runner.dtype`); no runner processes, no load generator. At each
batch size B we count, with `stages.profiling.launches.count_launches` (device kernels on CUDA,
top-level non-view aten operators on CPU):

* `talker_step`: one talker decode step with B active rows (after prefill, warmed up);
* `code2wav_step`: one code2wav decode of B streams' steady 28-code payloads. Streams are fed
  their first chunks untimed until the flow caches reach the steady (trimmed) shape, so every
  profiled call sees the same payload and cache shapes; decode mutates per-stream state, so
  each profiled call decodes the *next* prepared chunk;
* `cache_split`: the part of the flow-cache split the two implementations differ in: storing a
  B-row chunk's conformer cnn/att and estimator cnn caches into the rows' pool slots (one
  `index_copy_` per row and tensor, 4 per row with the estimator's cond and uncond halves, or
  3 in all when batched);
* `cache_split_total`: that plus the estimator attention stores of all Euler steps (trimmed to
  prompt + keep frames), which both implementations share.

The split runs on B rows at the arm's steady cache shapes (the prompt's caches grown one chunk
past prompt + keep frames, so every store trims). The split mode is the arm's own
(`code2wav.extra.code2wav_batched_cache_split`).

The same profiler run also times named ranges (`stages.profiling.launches.measure`): the talker step
(`talker.decode_step`, wrapped here), the whole decode (`code2wav.decode`, wrapped here) and its
parts (`code2wav.flow_encoder`, `code2wav.cfm`, `code2wav.hift`, annotated in
stages/code2wav/token2wav.py): device ms on CUDA, host cpu_ms on CPU. With `tier=CxR` the talker
is also measured at B = C and code2wav at b = min(max_num_seqs, ceil(C / R)), and
`tts_bench.profile_split.TierSplit` turns those into time per second of audio per component.

Cost: each arm's stages are built once (talker slots = the largest B, cache positions = what
the workload needs, not runner.max_seq_len); each B then re-feeds fresh streams to the steady
cache shape. Phases log their wall time at INFO.

    arms = load_arms(Path("configs/ab/default.yaml"))
    result = profile_arms(arms, rows=(1, 4, 8), chunks=3, tier=parse_tier("128x8"))
    print(render(result.table(), "md"))
    print(render(result.split.table(), "md", title=result.split.title()))
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import pandas as pd
import torch
from torch.profiler import record_function

from stages.code2wav.config import Code2WavConfig
from stages.code2wav.chunk_decode import ChunkDecoder, PooledAttSteps
from stages.code2wav.flow import EncodedChunk
from stages.code2wav.flow_cache import trim_conformer_att
from stages.code2wav.options import Code2WavOptions
from stages.code2wav.streaming import Chunker, CodecPayload
from stages.code2wav.token2wav import Token2Wav
from stages.config import StageConfig
from stages.platform import dtype_from_name, resolve_device
from stages.profiling.launches import LaunchCount, Measured, RangeTimes, count_launches, measure
from stages.talker.engine import KV_LEN_BUCKET, TalkerEngine, TalkerRequest
from tts_bench.config import BenchConfig, Tier
from tts_bench.errors import ConfigError
from tts_bench.profile_split import DECODE_RANGE, RANGES, TALKER_RANGE, TierPlan, TierSplit

log = logging.getLogger(__name__)

STEPS = ("talker_step", "code2wav_step", "cache_split", "cache_split_total")
WARMUP = 1  # untimed calls before each profiled run (allocator, order-tensor caches)
PROFILE_TEXT = "Launch accounting runs the same words for every row of the batch."


@dataclass(frozen=True)
class ArmProfile:
    """One arm's launch counts at one batch size."""

    arm: str
    rows: int
    device: str
    split: str  # "batched" | "per-row"
    counts: dict[str, LaunchCount]  # by step name (STEPS)
    # Time inside the step's ranges (RANGES), from the same profiler run as the counts.
    times: dict[str, RangeTimes] = field(default_factory=dict)


@dataclass(frozen=True)
class StageTiming:
    """One arm's range times for one step at one B (tier runs at a B outside `rows` too)."""

    arm: str
    step: str  # "talker_step" | "code2wav_step"
    rows: int
    times: RangeTimes


@dataclass(frozen=True)
class ProfileResult:
    arms: tuple[str, str]  # (base, test)
    rows: tuple[int, ...]
    chunks: int
    profiles: list[ArmProfile]
    timings: list[StageTiming] = field(default_factory=list)
    split: TierSplit | None = None  # with profile_arms(..., tier=...)

    def get(self, arm: str, rows: int) -> ArmProfile:
        return next(p for p in self.profiles if p.arm == arm and p.rows == rows)

    def table(self) -> pd.DataFrame:
        """One row per (B, step): unit, both arms' launches per call, and the delta. On a device
        the memcpy/memset launches (a contiguous clone is a memcpy, not a kernel) get their own
        column, `copies base / test`, so kernels + copies is every launch the step issued."""
        base, test = self.arms
        with_copies = any(c.copies_per_call for p in self.profiles for c in p.counts.values())
        records = []
        for b in self.rows:
            pa, pb = self.get(base, b), self.get(test, b)
            for step in STEPS:
                ca, cb = pa.counts[step], pb.counts[step]
                record = {
                    "B": b, "step": step, "unit": ca.unit,
                    base: _num(ca.per_call), test: _num(cb.per_call),
                    "delta": _signed(cb.per_call - ca.per_call), "delta %": _pct(ca.per_call, cb.per_call),
                }  # fmt: skip
                if with_copies:
                    record["copies base / test"] = f"{_num(ca.copies_per_call)} / {_num(cb.copies_per_call)}"
                records.append(record)
        return pd.DataFrame.from_records(records)

    def title(self) -> str:
        """What the table counts: device, calls per count, each arm's cache split."""
        splits = ", ".join(f"{arm} {self.get(arm, self.rows[0]).split}" for arm in self.arms)
        device = self.profiles[0].device
        return f"launches per call on {device} ({self.chunks} profiled calls each; cache split: {splits})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "profile",
            "arms": list(self.arms),
            "rows": list(self.rows),
            "chunks": self.chunks,
            "profiles": [
                {"arm": p.arm, "rows": p.rows, "device": p.device, "split": p.split,
                 "counts": {k: asdict(v) for k, v in p.counts.items()},
                 "times": {k: asdict(v) for k, v in p.times.items()}}
                for p in self.profiles
            ],  # fmt: skip
            "timings": [asdict(t) for t in self.timings],
            "tier_split": None if self.split is None else self.split.to_dict(),
        }


def _num(x: float) -> str:
    return f"{x:g}" if x == int(x) else f"{x:.2f}"


def _signed(x: float) -> str:
    return "0" if x == 0 else ("+" if x > 0 else "-") + _num(abs(x))


def _pct(a: float, b: float) -> str:
    if a == 0 or a == b:
        return "" if a == 0 else "0.0%"
    return ("+" if b > a else "-") + f"{abs(b - a) / a * 100:.1f}%"


# ---------------------------------------------------------------- the library call


def profile_arms(
    arms: Mapping[str, BenchConfig], rows: int | Sequence[int] = 8, chunks: int = 3, *,
    tier: Tier | None = None, talker_context: int = 0,
) -> ProfileResult:
    """Count launches per step for both arms at each B in `rows`, `chunks` profiled calls each.

    With `tier` (C x R), also time the talker step at B = C and the code2wav decode at
    B = min(max_num_seqs, ceil(C / R)) and derive the per-second-of-audio split (TierSplit).
    `talker_context`: cache positions each talker row holds before the profiled steps (its
    condition length); attention reads the cache up to the longest row, so this sets kv_len.
    """
    rows = (rows,) if isinstance(rows, int) else tuple(rows)
    _check_args(arms, rows, chunks, talker_context)
    profiles: list[ArmProfile] = []
    timings: list[StageTiming] = []
    for name, cfg in arms.items():
        p, t = profile_stages(
            cfg.stages, rows=rows, chunks=chunks, arm=name, tier=tier, talker_context=talker_context
        )
        profiles += p
        timings += t
    names = (*arms,)
    split = None
    if tier is not None:  # the base arm's max_num_seqs and rates (arms differ in flags, not dims)
        base = arms[names[0]].stages
        plan = TierPlan.of(tier, base.runner.max_num_seqs, base.code2wav)
        split = TierSplit.build(plan, (names[0], names[1]), timings)
    return ProfileResult((names[0], names[1]), rows, chunks, profiles, timings, split)


def _check_args(
    arms: Mapping[str, BenchConfig], rows: tuple[int, ...], chunks: int, context: int
) -> None:
    if len(arms) != 2:
        raise ConfigError(
            f"error: profile needs exactly two arms, got {len(arms)} (arms); give base and test"
        )
    if not rows or min(rows) < 1:
        raise ConfigError(f"error: rows must be >= 1, got {list(rows)} (--rows); e.g. --rows 1,4,8")
    if chunks < 1:
        raise ConfigError(f"error: chunks must be >= 1, got {chunks} (--chunks); e.g. --chunks 3")
    if context < 0:
        raise ConfigError(
            f"error: talker context must be >= 0, got {context} (--talker-context); e.g. 256"
        )


def profile_stages(
    stages: StageConfig, *, rows: Sequence[int], chunks: int, arm: str,
    tier: Tier | None = None, talker_context: int = 0,
) -> tuple[list[ArmProfile], list[StageTiming]]:
    """One arm: build talker + code2wav once (the largest B needed), then measure at each B.

    Phases are logged with their wall time (stderr), so a run cut short by a timeout still
    shows where its time went.
    """
    runner = stages.runner
    device, dtype = resolve_device(runner.device), dtype_from_name(runner.dtype)
    split = "batched" if Code2WavOptions.from_extra(stages.code2wav.extra).batched_cache_split else "per-row"
    plan = None if tier is None else TierPlan.of(tier, runner.max_num_seqs, stages.code2wav)
    talker_rows = max(rows) if plan is None else max(*rows, plan.talker_rows)
    text = profile_text(talker_context)
    with _phase(f"profile {arm}: build talker ({talker_rows} slots) on {device} ({runner.dtype})"):
        talker = TalkerEngine(
            stages.talker, device=device, dtype=dtype, max_batch=talker_rows,
            max_seq_len=_talker_seq_len(stages, text, chunks), init_seed=runner.seed,
        )  # fmt: skip
    with _phase(f"profile {arm}: build code2wav (split {split})"):
        t2w = Token2Wav(stages.code2wav, device=device, dtype=dtype, init_seed=runner.seed)
        # Eager chunks: a replayed device graph is one launch with no profiler ranges inside,
        # and what this accounts for is the launches and the components' device time.
        t2w.graphs = None
    with _phase(f"profile {arm}: prompt setup"):
        t2w.prompt_setup()
    profiles, timings = [], []
    for b in rows:
        with _phase(f"profile {arm}: B={b}"):
            talk = measure_talker_step(talker, b, chunks, text=text)
            dec = measure_code2wav_step(t2w, b, chunks, tag=arm)
            counts = {"talker_step": talk.launches, "code2wav_step": dec.launches,
                      **count_cache_split(t2w, b, chunks)}  # fmt: skip
        times = {"talker_step": talk.times, "code2wav_step": dec.times}
        profiles.append(ArmProfile(arm, b, str(device), split, counts, times))
        timings += [StageTiming(arm, step, b, t) for step, t in times.items()]
    if plan is not None:
        timings += _tier_timings(plan, talker, t2w, chunks, arm=arm, rows=rows, text=text)
    return profiles, timings


def _tier_timings(
    plan: TierPlan, talker: TalkerEngine, t2w: Token2Wav, chunks: int, *, arm: str,
    rows: Sequence[int], text: str,
) -> list[StageTiming]:
    """Range times at the tier's B for the steps the `rows` loop did not already measure."""
    out = []
    if plan.talker_rows not in rows:
        with _phase(f"profile {arm}: tier talker B={plan.talker_rows}"):
            m = measure_talker_step(talker, plan.talker_rows, chunks, text=text)
        out.append(StageTiming(arm, "talker_step", plan.talker_rows, m.times))
    if plan.code2wav_rows not in rows:
        with _phase(f"profile {arm}: tier code2wav B={plan.code2wav_rows}"):
            m = measure_code2wav_step(t2w, plan.code2wav_rows, chunks, tag=arm)
        out.append(StageTiming(arm, "code2wav_step", plan.code2wav_rows, m.times))
    return out


@contextmanager
def _phase(what: str) -> Iterator[None]:
    """Log a phase's wall time at INFO when it ends (also when it raises)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        log.info("%s: %.1f s", what, time.perf_counter() - t0)


def profile_text(context: int) -> str:
    """The profile request's text: PROFILE_TEXT, or its words repeated so the condition holds
    about `context` rows (the stand-in tokenizer gives one id per word, plus text_eos and
    audio_bos)."""
    words = PROFILE_TEXT.rstrip(".").split()
    if context <= len(words) + 3:
        return PROFILE_TEXT
    return " ".join(words[i % len(words)] for i in range(context - 2))


def _talker_seq_len(stages: StageConfig, text: str, chunks: int) -> int:
    """KV positions the profile needs (condition + every step), rounded up to the decode's
    kv_len bucket so the profiled attention reads what a full-length cache would read. Far
    fewer than runner.max_seq_len: at 128 slots the full cache is 15 GiB fp32 (CPU RAM too)."""
    need = len(text.split()) + 8 + _talker_budget(chunks)  # + text_eos, audio_bos, punctuation
    padded = -(-need // KV_LEN_BUCKET) * KV_LEN_BUCKET
    limit = stages.runner.max_seq_len
    if need > limit:
        raise ConfigError(
            f"error: talker context needs {need} positions but max_seq_len is {limit} "
            "(--talker-context / runner.max_seq_len); lower --talker-context"
        )
    return min(padded, limit)


def _talker_budget(chunks: int) -> int:
    return 1 + WARMUP + chunks + 1  # prefill step + warmup + profiled steps, never finishing


# ---------------------------------------------------------------- the three workloads


def measure_talker_step(
    engine: TalkerEngine, rows: int, chunks: int, *, text: str = PROFILE_TEXT
) -> Measured:
    """Launches and TALKER_RANGE time of one steady talker decode step with `rows` active rows."""
    budget = _talker_budget(chunks)
    ids = [f"profile-talker-{rows}-{r}" for r in range(rows)]
    for r, rid in enumerate(ids):
        engine.add(TalkerRequest(rid, text, seed=r, max_codes=budget))
    engine.step()  # admission: every row prefilled, code #0 sampled

    def step() -> None:
        with record_function(TALKER_RANGE):
            engine.step()

    try:
        return measure(step, device=engine.device, repeats=chunks, warmup=WARMUP,
                       ranges=RANGES["talker_step"])  # fmt: skip
    finally:
        for rid in ids:
            engine.cancel(rid)


def steady_start(cfg: Code2WavConfig) -> int:
    """Chunks fed before the cache shapes stop changing: the estimator/conformer caches grow by
    one chunk of mel frames per chunk until they hold prompt + keep frames, then get trimmed."""
    return max(1, math.ceil(cfg.prompt_keep_frames / cfg.chunk_mel_frames))


def prepare_streams(cfg: Code2WavConfig, rows: int, chunks: int, tag: str) -> list[list[CodecPayload]]:
    """`rows` streams of `chunks` full payloads each, from seeded random codes."""
    gen = torch.Generator().manual_seed(rows)
    streams = []
    for r in range(rows):
        chunker = Chunker(cfg, f"profile-{tag}-{rows}-{r}", seed=r)
        codes = torch.randint(0, cfg.flow.vocab_size, (chunks * cfg.codec_chunk_frames,), generator=gen)
        payloads = chunker.push(codes.tolist())
        assert len(payloads) == chunks, "one payload per codec_chunk_frames codes"
        streams.append(payloads)
    return streams


def measure_code2wav_step(t2w: Token2Wav, rows: int, chunks: int, *, tag: str = "") -> Measured:
    """Launches and range times (DECODE_RANGE + COMPONENT_RANGES) of one code2wav decode of
    `rows` streams' steady payloads."""
    start = steady_start(t2w.cfg)
    streams = prepare_streams(t2w.cfg, rows, start + WARMUP + chunks, tag)
    step = iter(range(len(streams[0])))

    def decode_next() -> None:
        i = next(step)
        with record_function(DECODE_RANGE):
            t2w.decode([s[i] for s in streams])

    for _ in range(start):
        decode_next()
    try:
        return measure(decode_next, device=t2w.device, repeats=chunks, warmup=WARMUP,
                       ranges=RANGES["code2wav_step"])  # fmt: skip
    finally:
        for s in streams:
            t2w.drop(s[0].request_id)


@dataclass
class _StoreInputs:
    """A steady B-row chunk's new caches, as the flow and CFM hand them to the slot pool."""

    decoder: ChunkDecoder
    slots: torch.Tensor  # [B] pool slots (taken for the measurement, released after)
    pairs: torch.Tensor  # [2B] estimator rows of those slots
    encoded: EncodedChunk  # conformer caches, one chunk longer than the keep (so they trim)
    estimator_cnn: torch.Tensor  # [n_t, depth, 2B, 2*hidden, 2]
    step_buffer: torch.Tensor  # [depth, 2B, H, prompt + keep + chunk, 2D]: one Euler step's


def steady_store_inputs(t2w: Token2Wav, rows: int, *, batched: bool) -> _StoreInputs:
    """The inputs of the cache split at the steady shapes, from the prompt's caches grown by
    one chunk past prompt + keep frames (so the stores trim to two segments, as in steady
    state). The split mode is `batched`."""
    setup = t2w.prompt_setup()
    cfg, one = t2w.cfg, setup.cache
    full = setup.prompt_len + cfg.prompt_keep_frames + cfg.chunk_mel_frames
    pool = t2w.pool
    slot_list = [pool.acquire() for _ in range(rows)]
    slots = torch.tensor(slot_list, device=t2w.device)
    att = _grow(one.conformer_att, 3, full).expand(-1, rows, -1, -1, -1).contiguous()
    cnn = one.conformer_cnn.expand(rows, -1, -1).contiguous()
    ecnn = one.estimator_cnn.repeat_interleave(rows, dim=2)  # [cond x B | uncond x B]
    step = _grow(one.estimator_att[0], 3, full).repeat_interleave(rows, dim=1)
    options = replace(t2w.options, batched_cache_split=batched)
    decoder = ChunkDecoder(t2w.flow, t2w.hift, pool, cfg, options, prompt_len=setup.prompt_len)
    return _StoreInputs(decoder, slots, pool.pair_index(slots), EncodedChunk(None, cnn, att), ecnn, step)


def _grow(t: torch.Tensor, dim: int, length: int) -> torch.Tensor:
    """`t` with axis `dim` extended to `length` (zeros after the original frames)."""
    shape = list(t.shape)
    if shape[dim] >= length:
        return t
    shape[dim] = length
    out = t.new_zeros(shape)
    out.narrow(dim, 0, t.shape[dim]).copy_(t)
    return out


def count_cache_split(
    t2w: Token2Wav, rows: int, chunks: int, *, batched: bool | None = None
) -> dict[str, LaunchCount]:
    """Launches of the flow-cache split of `rows` rows into the slot pool (`batched=None`: the
    arm's split mode): `cache_split` = the part the two modes differ in (conformer cnn/att and
    estimator cnn: 4 per row, or 3 in all), `cache_split_total` = that plus the estimator
    attention stores of every Euler step, which both modes share."""
    batched = t2w.options.batched_cache_split if batched is None else batched
    x = steady_store_inputs(t2w, rows, batched=batched)
    att = PooledAttSteps(t2w.pool["estimator_att"], x.pairs, x.step_buffer.shape[3] - t2w.cfg.chunk_mel_frames,
                         x.decoder.keep, store=True)

    f = t2w.cfg.flow
    trimmed = trim_conformer_att(x.encoded.att_cache, x.decoder.keep, f.up_rate, f.num_blocks)

    def small() -> None:
        x.decoder.store_small_caches(x.slots, x.pairs, x.encoded.cnn_cache, trimmed, x.estimator_cnn)

    def total() -> None:
        small()
        for i in range(t2w.cfg.n_timesteps):
            att.store(i, x.step_buffer)

    try:
        return {
            "cache_split": count_launches(_inference(small), device=t2w.device, repeats=chunks, warmup=WARMUP),
            "cache_split_total": count_launches(_inference(total), device=t2w.device, repeats=chunks, warmup=WARMUP),
        }
    finally:
        for s in x.slots.tolist():
            t2w.pool.release(s)


def _inference(fn: Callable[[], object]) -> Callable[[], object]:
    # Token2Wav splits under inference mode; profiling outside it would add autograd bookkeeping.
    def run() -> object:
        with torch.inference_mode():
            return fn()

    return run


def with_split(stages: StageConfig, batched: bool) -> StageConfig:
    """`stages` with the cache-split flag set (for tests and ad-hoc A/Bs)."""
    extra = {**stages.code2wav.extra, "code2wav_batched_cache_split": batched}
    return replace(stages, code2wav=replace(stages.code2wav, extra=extra))
