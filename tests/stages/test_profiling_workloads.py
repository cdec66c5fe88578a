"""The profiling workloads on the tiny stages (CPU operator counts): split scaling, steady
shapes, talker stability and cache sizing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stages.code2wav.token2wav import Token2Wav
from stages.config import StageConfig
from stages.profiling.cache_split import count_cache_split, steady_store_inputs
from stages.profiling.code2wav_step import prepare_streams, steady_start
from stages.profiling.ranges import TALKER_RANGE
from stages.profiling.talker_step import (
    measure_talker_step,
    profile_text,
    talker_cache_len,
    talker_positions,
)
from stages.talker.engine import TalkerEngine
from stages.talker.tokenizer import WordHashTokenizer
from tests.stages.code2wav_tiny import single_thread, tiny_config  # noqa: F401
from tts_bench.config.loader import load_dataclass, load_yaml_file

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = Path(__file__).resolve().parents[2] / "configs/stages/minicpmo45-tiny.yaml"
CPU = torch.device("cpu")


def _tiny_stages() -> StageConfig:
    return load_dataclass(StageConfig, load_yaml_file(TINY), source=str(TINY), base_dir=TINY.parent)


@pytest.fixture(scope="module")
def t2w():
    return Token2Wav(tiny_config(), device=CPU, dtype=torch.float32, init_seed=0)


def test_per_row_split_scales_with_rows_and_batched_split_does_not(t2w):
    per_row = {b: count_cache_split(t2w, b, 2, batched=False) for b in (1, 4, 8)}
    batched = {b: count_cache_split(t2w, b, 2, batched=True) for b in (1, 4, 8)}
    for b in (1, 4, 8):
        assert per_row[b]["cache_split"].per_call == 4 * b  # cond and uncond estimator rows apart
        assert batched[b]["cache_split"].per_call == 3
        assert batched[b]["cache_split"].by_name == {"aten::index_copy_": 3.0}
        # The estimator_att stores (2 trimmed segments x 10 steps) are batched in both: the whole
        # split differs by 4B - 3 and its shared part does not grow with B.
        delta = per_row[b]["cache_split_total"].per_call - batched[b]["cache_split_total"].per_call
        assert delta == 4 * b - 3
        assert batched[b]["cache_split_total"].per_call == batched[1]["cache_split_total"].per_call


def test_split_inputs_have_the_steady_shapes_and_trim(t2w):
    x = steady_store_inputs(t2w, 4, batched=True)
    cfg, keep = t2w.cfg, x.keep
    assert x.encoded.cnn_cache.shape[0] == 4 and x.estimator_cnn.shape[2] == 8
    # Caches arrive one chunk longer than the keep, so every store trims (2 segments).
    full = keep.prompt_len + cfg.prompt_keep_frames + cfg.chunk_mel_frames
    assert x.encoded.att_cache.shape[3] == x.step_buffer.shape[3] == full
    assert len(keep.ranges(full)) == 2
    assert steady_start(cfg) == 2  # 100 keep frames / 50 mel frames per chunk
    for s in x.slots.tolist():
        t2w.pool.release(s)


@pytest.mark.parametrize("initial", [0, 5, 10, 25])
def test_steady_start_is_the_chunk_after_which_a_streams_shape_repeats(initial):
    cfg = tiny_config(initial_codec_chunk_frames=initial)
    t2w = Token2Wav(cfg, device=CPU, dtype=torch.float32, init_seed=0)
    (stream,) = prepare_streams(cfg, 1, steady_start(cfg) + 2, f"steady-{initial}")
    shapes = []
    for payload in stream:
        t2w.decode([payload])
        shapes.append(t2w.stream_shape(payload.request_id))
    start = steady_start(cfg)  # chunks decoded before the shape stops changing
    assert shapes[start - 1] == shapes[start] == shapes[start + 1]
    assert start == 1 or shapes[start - 2] != shapes[start - 1]


def test_talker_step_count_is_positive_and_repeatable():
    stages = _tiny_stages()
    engine = TalkerEngine(stages.talker, device=CPU, dtype=torch.float32, max_batch=2, max_seq_len=256)
    first = measure_talker_step(engine, 2, 2).launches
    second = measure_talker_step(engine, 2, 2).launches
    assert first.unit == "operators" and first.per_call > 0
    assert first.per_call == second.per_call and first.by_name == second.by_name
    assert not engine.has_work()  # the profiled requests are cancelled afterwards


def test_talker_profiles_128_rows_with_a_cache_sized_to_the_workload():
    stages = _tiny_stages()
    text = profile_text(0)
    seq = talker_cache_len(talker_positions(text, chunks=1), stages.runner.max_seq_len)
    assert seq == 64 and seq < stages.runner.max_seq_len  # one kv_len bucket, not 1024 positions
    engine = TalkerEngine(stages.talker, device=CPU, dtype=torch.float32, max_batch=128, max_seq_len=seq)
    m = measure_talker_step(engine, 128, 1, text=text)
    assert m.times.occurrences == {TALKER_RANGE: 1.0} and m.times.per_call_ms[TALKER_RANGE] > 0
    assert not engine.has_work()


def test_the_profiled_talker_is_eager_and_keeps_the_arms_other_flags(talker_extras):
    """A replayed graph hides its kernels from the talker's range (torch 2.11), so the profile's
    talker runs its forwards eagerly; the flags an A/B compares (fused layers here) stay."""
    import dataclasses

    from stages.profiling import build

    built = talker_extras(build)
    stages = _tiny_stages()
    stages = dataclasses.replace(stages, talker=dataclasses.replace(
        stages.talker, extra={"talker_decode_graph": True, "talker_fused_layers": False}))
    engine = build.build_talker(stages, build.Placement(CPU, torch.float32), rows=2, text=profile_text(0), chunks=1)
    assert built == [{"talker_decode_graph": False, "talker_prefill_graph": False, "talker_fused_layers": False}]
    assert engine.graphs is None and engine.prefill_graphs is None


def test_talker_context_sets_the_condition_length():
    tok = WordHashTokenizer(151643)
    assert len(tok.encode(profile_text(256))) + 2 == 256  # + text_eos, audio_bos
    assert profile_text(0) == profile_text(10)  # short contexts keep the default sentence


@pytest.mark.gpu
def test_cuda_split_launches_are_4b_per_row_and_3_batched():
    # One index_copy_ kernel per store: per-row 4 per row (conformer cnn, conformer att, the
    # estimator cnn's cond and uncond rows), batched 3.
    device = torch.device("cuda", 0)
    t2w = Token2Wav(tiny_config(), device=device, dtype=torch.float32, init_seed=0)
    for b in (1, 4, 8):
        per_row = count_cache_split(t2w, b, 3, batched=False)["cache_split"]
        batched = count_cache_split(t2w, b, 3, batched=True)["cache_split"]
        assert per_row.unit == batched.unit == "kernels"
        totals = [c.per_call + c.copies_per_call for c in (per_row, batched)]
        assert totals == [4 * b, 3], (b, per_row, batched)
