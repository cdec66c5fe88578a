"""Launch accounting per A/B arm on a fixed small in-process workload (`tts-bench profile`).

For each arm the stages are built in this process from the arm's `stages` config (seeded random
weights, `runner.device` / `runner.dtype`); no runner processes, no load generator. At each
batch size B we count, with `tts_bench.launches.count_launches` (device kernels on CUDA,
top-level non-view aten operators on CPU):

* `talker_step`: one talker decode step with B active rows (after prefill, warmed up);
* `code2wav_step`: one code2wav decode of B streams' steady 28-code payloads. Streams are fed
  their first chunks untimed until the flow caches reach the steady (trimmed) shape, so every
  profiled call sees the same payload and cache shapes; decode mutates per-stream state, so
  each profiled call decodes the *next* prepared chunk;
* `cache_split`: the part of the flow-cache split the two implementations differ in
  (`split_small_caches`: conformer cnn/att + estimator cnn; per-row 3B aten ops on CPU and 4B
  kernels on CUDA, where the estimator cnn cat launches two copies; batched 3 on both);
* `cache_split_total`: the whole `split_flow_cache`, including the per-request estimator_att
  copy with its trim, which both implementations share.

The split runs on a B-row batch at the arm's steady cache shapes (the prompt's caches, grown
to prompt + keep frames for the conformer and prompt + keep + one chunk for the estimator). The
split mode is the arm's own (`code2wav.extra.code2wav_batched_cache_split`).

    arms = load_arms(Path("configs/ab/default.yaml"))
    result = profile_arms(arms, rows=(1, 4, 8), chunks=3)
    print(render(result.table(), "md"))
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import pandas as pd
import torch

from stages.code2wav.config import Code2WavConfig
from stages.code2wav.flow_cache import (
    AttKeep,
    FlowCache,
    split_flow_cache,
    split_small_caches,
    stack_flow_cache,
)
from stages.code2wav.options import Code2WavOptions
from stages.code2wav.streaming import Chunker, CodecPayload
from stages.code2wav.token2wav import Token2Wav
from stages.config import StageConfig
from stages.platform import dtype_from_name, resolve_device
from stages.talker.engine import TalkerEngine, TalkerRequest
from tts_bench.config import BenchConfig
from tts_bench.errors import ConfigError
from tts_bench.launches import LaunchCount, count_launches

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


@dataclass(frozen=True)
class ProfileResult:
    arms: tuple[str, str]  # (base, test)
    rows: tuple[int, ...]
    chunks: int
    profiles: list[ArmProfile]

    def get(self, arm: str, rows: int) -> ArmProfile:
        return next(p for p in self.profiles if p.arm == arm and p.rows == rows)

    def table(self) -> pd.DataFrame:
        """One row per (B, step): unit, both arms' launches per call, and the delta."""
        base, test = self.arms
        records = []
        for b in self.rows:
            pa, pb = self.get(base, b), self.get(test, b)
            for step in STEPS:
                ca, cb = pa.counts[step], pb.counts[step]
                records.append({
                    "B": b, "step": step, "unit": ca.unit,
                    base: _num(ca.per_call), test: _num(cb.per_call),
                    "delta": _signed(cb.per_call - ca.per_call), "delta %": _pct(ca.per_call, cb.per_call),
                })  # fmt: skip
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
                 "counts": {k: asdict(v) for k, v in p.counts.items()}}
                for p in self.profiles
            ],  # fmt: skip
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
    arms: Mapping[str, BenchConfig], rows: int | Sequence[int] = 8, chunks: int = 3
) -> ProfileResult:
    """Count launches per step for both arms at each B in `rows`, `chunks` profiled calls each."""
    rows = (rows,) if isinstance(rows, int) else tuple(rows)
    if len(arms) != 2:
        raise ConfigError(
            f"error: profile needs exactly two arms, got {len(arms)} (arms); give base and test"
        )
    if not rows or min(rows) < 1:
        raise ConfigError(f"error: rows must be >= 1, got {list(rows)} (--rows); e.g. --rows 1,4,8")
    if chunks < 1:
        raise ConfigError(f"error: chunks must be >= 1, got {chunks} (--chunks); e.g. --chunks 3")
    profiles = []
    for name, cfg in arms.items():
        profiles += profile_stages(cfg.stages, rows=rows, chunks=chunks, arm=name)
    names = tuple(arms)
    return ProfileResult((names[0], names[1]), rows, chunks, profiles)


def profile_stages(stages: StageConfig, *, rows: Sequence[int], chunks: int, arm: str) -> list[ArmProfile]:
    """One arm: build talker + code2wav once (max B rows), then count at each B."""
    runner = stages.runner
    device, dtype = resolve_device(runner.device), dtype_from_name(runner.dtype)
    split = "batched" if Code2WavOptions.from_extra(stages.code2wav.extra).batched_cache_split else "per-row"
    log.info("profile %s: building stages on %s (%s), split %s", arm, device, runner.dtype, split)
    talker = TalkerEngine(
        stages.talker, device=device, dtype=dtype, max_batch=max(rows),
        max_seq_len=runner.max_seq_len, init_seed=runner.seed,
    )  # fmt: skip
    t2w = Token2Wav(stages.code2wav, device=device, dtype=dtype, init_seed=runner.seed)
    out = []
    for b in rows:
        counts = {
            "talker_step": count_talker_step(talker, b, chunks),
            "code2wav_step": count_code2wav_step(t2w, b, chunks, tag=arm),
            **count_cache_split(t2w, b, chunks),
        }
        out.append(ArmProfile(arm, b, str(device), split, counts))
    return out


# ---------------------------------------------------------------- the three workloads


def count_talker_step(engine: TalkerEngine, rows: int, chunks: int) -> LaunchCount:
    """Launches of one steady talker decode step with `rows` active rows."""
    budget = 1 + WARMUP + chunks + 1  # prefill step + warmup + profiled steps, never finishing
    ids = [f"profile-talker-{rows}-{r}" for r in range(rows)]
    for r, rid in enumerate(ids):
        engine.add(TalkerRequest(rid, PROFILE_TEXT, seed=r, max_codes=budget))
    engine.step()  # admission: every row prefilled, code #0 sampled
    try:
        return count_launches(engine.step, device=engine.device, repeats=chunks, warmup=WARMUP)
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


def count_code2wav_step(t2w: Token2Wav, rows: int, chunks: int, *, tag: str = "") -> LaunchCount:
    """Launches of one code2wav decode of `rows` streams' steady payloads."""
    start = steady_start(t2w.cfg)
    streams = prepare_streams(t2w.cfg, rows, start + WARMUP + chunks, tag)
    step = iter(range(len(streams[0])))

    def decode_next() -> None:
        i = next(step)
        t2w.decode([s[i] for s in streams])

    for _ in range(start):
        decode_next()
    try:
        return count_launches(decode_next, device=t2w.device, repeats=chunks, warmup=WARMUP)
    finally:
        for s in streams:
            t2w.drop(s[0].request_id)


def steady_split_batch(t2w: Token2Wav, rows: int) -> tuple[FlowCache, AttKeep]:
    """A `rows`-row batch at the steady split shapes, and the trim the split applies."""
    setup = t2w.prompt_setup()
    cfg, one = t2w.cfg, setup.cache
    keep = AttKeep(setup.prompt_len, cfg.prompt_keep_frames)
    grown = FlowCache(
        conformer_cnn=one.conformer_cnn,
        conformer_att=_grow(one.conformer_att, 3, setup.prompt_len + keep.keep_frames),
        estimator_cnn=one.estimator_cnn,
        estimator_att=_grow(one.estimator_att, 4, setup.prompt_len + keep.keep_frames + cfg.chunk_mel_frames),
    )
    return stack_flow_cache([grown] * rows), keep


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
    """Launches of the flow-cache split of `rows` rows; `batched=None`: the arm's split mode."""
    batch, keep = steady_split_batch(t2w, rows)
    batched = t2w.options.batched_cache_split if batched is None else batched
    small = _inference(lambda: split_small_caches(batch, rows, batched=batched))
    total = _inference(lambda: split_flow_cache(batch, rows, batched=batched, att_keep=keep))
    return {
        "cache_split": count_launches(small, device=t2w.device, repeats=chunks, warmup=WARMUP),
        "cache_split_total": count_launches(total, device=t2w.device, repeats=chunks, warmup=WARMUP),
    }


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
