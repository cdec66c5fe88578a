"""`tts-bench profile` as a library call on the tiny stages: both arms, the split delta, bad
workloads rejected before building, and the table's copy column. The workloads themselves are
tested in tests/stages/test_profiling_workloads.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from stages.config import StageConfig
from stages.profiling.cache_split import with_split
from tests.stages.code2wav_tiny import single_thread  # noqa: F401
from tts_bench.config.loader import load_dataclass, load_yaml_file
from tts_bench.config import BenchConfig
from tts_bench.errors import ConfigError
from tts_bench.profile.run import profile_arms

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = Path(__file__).resolve().parents[2] / "configs/stages/minicpmo45-tiny.yaml"


def _tiny_stages() -> StageConfig:
    return load_dataclass(StageConfig, load_yaml_file(TINY), source=str(TINY), base_dir=TINY.parent)


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


def test_device_tables_show_memcpy_launches_beside_the_kernels():
    from stages.profiling.launches import LaunchCount
    from tts_bench.profile.run import STEPS, ArmProfile, ProfileResult

    def counts(kernels: float, copies: float) -> dict:
        return {step: LaunchCount("kernels", kernels, copies, 2) for step in STEPS}

    result = ProfileResult(("base", "test"), (8,), 2, [
        ArmProfile("base", 8, "cuda:0", "per-row", counts(24, 8)),
        ArmProfile("test", 8, "cuda:0", "batched", counts(1, 2)),
    ])  # fmt: skip
    row = result.table().iloc[2]
    assert (row["step"], row["base"], row["test"], row["copies base / test"]) == (
        "cache_split", "24", "1", "8 / 2")
