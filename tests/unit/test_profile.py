"""Launch accounting on the tiny stages (CPU operator counts): split scaling, talker stability."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stages.code2wav.token2wav import Token2Wav
from stages.config import StageConfig
from stages.profiling.launches import count_launches
from stages.talker.engine import TalkerEngine
from tests.stages.code2wav_tiny import single_thread, tiny_config  # noqa: F401
from tts_bench._dataclass_yaml import load_dataclass, load_yaml_file
from tts_bench.config import BenchConfig
from tts_bench.errors import ConfigError
from tts_bench.profile import (
    count_cache_split,
    measure_talker_step,
    profile_arms,
    steady_store_inputs,
    steady_start,
    with_split,
)

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = Path(__file__).resolve().parents[2] / "configs/stages/minicpmo45-tiny.yaml"
CPU = torch.device("cpu")


def _tiny_stages() -> StageConfig:
    return load_dataclass(StageConfig, load_yaml_file(TINY), source=str(TINY), base_dir=TINY.parent)


@pytest.fixture(scope="module")
def t2w():
    return Token2Wav(tiny_config(), device=CPU, dtype=torch.float32, init_seed=0)


def test_views_and_allocations_are_not_launches_on_cpu():
    x = torch.randn(6, 4)
    assert count_launches(lambda: x[1:3].clone(), device=CPU).by_name == {"aten::clone": 1.0}
    assert count_launches(lambda: x.new_empty(3).unsqueeze(0), device=CPU).per_call == 0.0
    # A view-like operator that has to copy counts the copy it dispatched.
    assert count_launches(lambda: x.t().contiguous(), device=CPU).per_call == 1.0


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
    cfg, keep = t2w.cfg, x.decoder.keep
    assert x.encoded.cnn_cache.shape[0] == 4 and x.estimator_cnn.shape[2] == 8
    # Caches arrive one chunk longer than the keep, so every store trims (2 segments).
    full = keep.prompt_len + cfg.prompt_keep_frames + cfg.chunk_mel_frames
    assert x.encoded.att_cache.shape[3] == x.step_buffer.shape[3] == full
    assert len(keep.ranges(full)) == 2
    assert steady_start(cfg) == 2  # 100 keep frames / 50 mel frames per chunk
    for s in x.slots.tolist():
        t2w.pool.release(s)


def test_talker_step_count_is_positive_and_repeatable():
    stages = _tiny_stages()
    engine = TalkerEngine(stages.talker, device=CPU, dtype=torch.float32, max_batch=2, max_seq_len=256)
    first = measure_talker_step(engine, 2, 2).launches
    second = measure_talker_step(engine, 2, 2).launches
    assert first.unit == "operators" and first.per_call > 0
    assert first.per_call == second.per_call and first.by_name == second.by_name
    assert not engine.has_work()  # the profiled requests are cancelled afterwards


def test_profile_arms_reports_both_arms_and_the_split_delta():
    stages = _tiny_stages()
    arms = {"base": BenchConfig(stages=with_split(stages, False)),
            "test": BenchConfig(stages=with_split(stages, True))}
    result = profile_arms(arms, rows=(1, 2), chunks=1)
    df = result.table()
    assert list(df["step"].unique()) == ["talker_step", "code2wav_step", "cache_split", "cache_split_total"]
    split = df[(df["B"] == 2) & (df["step"] == "cache_split")].iloc[0]
    assert (split["base"], split["test"], split["delta"], split["delta %"]) == ("8", "3", "-5", "-62.5%")
    # The talker does not depend on the split flag; the code2wav step carries its delta.
    talker = [result.get(a, 2).counts["talker_step"].per_call for a in ("base", "test")]
    assert talker[0] == talker[1]
    c2w = [result.get(a, 2).counts["code2wav_step"].per_call for a in ("base", "test")]
    assert c2w[0] - c2w[1] == 4 * 2 - 3  # per-row: 4 stores per row; batched: 3


@pytest.mark.parametrize("rows, chunks", [((0,), 1), ((), 1), ((2,), 0)])
def test_profile_arms_rejects_bad_workloads_before_building(rows, chunks):
    stages = _tiny_stages()
    arms = {"base": BenchConfig(stages=stages), "test": BenchConfig(stages=stages)}
    with pytest.raises(ConfigError, match="^error: "):
        profile_arms(arms, rows=rows, chunks=chunks)


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


def test_device_tables_show_memcpy_launches_beside_the_kernels():
    from stages.profiling.launches import LaunchCount
    from tts_bench.profile import STEPS, ArmProfile, ProfileResult

    def counts(kernels: float, copies: float) -> dict:
        return {step: LaunchCount("kernels", kernels, copies, 2) for step in STEPS}

    result = ProfileResult(("base", "test"), (8,), 2, [
        ArmProfile("base", 8, "cuda:0", "per-row", counts(24, 8)),
        ArmProfile("test", 8, "cuda:0", "batched", counts(1, 2)),
    ])  # fmt: skip
    row = result.table().iloc[2]
    assert (row["step"], row["base"], row["test"], row["copies base / test"]) == (
        "cache_split", "24", "1", "8 / 2")
