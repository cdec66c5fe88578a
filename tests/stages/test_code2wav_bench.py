"""scripts/bench_code2wav.py: arms side by side on the same streams, paired ratios with an interval.

Run: python -m pytest tests/stages/test_code2wav_bench.py -q
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from scripts import bench_code2wav as bench
from stages.code2wav.token2wav import Token2Wav
from tests.stages.code2wav_tiny import single_thread, tiny_config  # noqa: F401

pytestmark = pytest.mark.usefixtures("single_thread")


def _arm(name: str) -> Token2Wav:
    cfg = tiny_config()
    t2w = Token2Wav(replace(cfg, extra={**cfg.extra, **bench.ARMS[name]}), device=torch.device("cpu"),
                    dtype=torch.float32, slots=2)
    t2w.prompt_setup()
    return t2w


def test_arms_decode_the_same_streams_and_report_paired_ratios():
    arms = {"eager": _arm("eager"), "eager-unfused": _arm("eager-unfused")}
    out = bench.bench_rows(arms, rows=2, reps=3)
    for name in arms:
        assert len(out[name]["times_ms"]) == 3 and all(t > 0 for t in out[name]["times_ms"])
        assert out[name]["kernels_per_chunk"] > 0
    # On the CPU both arms run the eager norm chain: the same audio, chunk for chunk.
    assert out["identical_chunks"] == {"eager-unfused": 3}
    center, lo, hi = out["over_first_ci95_pct"]["eager-unfused"]
    assert lo <= center <= hi
    assert "eager_over_graph_median" not in out  # no graph arm here


def test_unknown_or_single_arms_are_refused(monkeypatch, capsys):
    for arms in ("graph", "graph,graph", "graph,fast"):
        monkeypatch.setattr("sys.argv", ["bench_code2wav.py", "--arms", arms])
        with pytest.raises(SystemExit) as exc:
            bench.main()
        assert exc.value.code == 2
        assert "--arms takes two or more distinct names" in capsys.readouterr().err


def test_a_kernel_table_without_an_eager_arm_is_refused_before_any_model_is_built(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["bench_code2wav.py", "--arms", "graph-sdpa,graph-matmul", "--kernels", "1"])
    monkeypatch.setattr(bench, "Token2Wav", None)  # building one would fail with a TypeError
    with pytest.raises(SystemExit) as exc:
        bench.main()
    assert exc.value.code == 2
    assert "--kernels profiles an eager chunk" in capsys.readouterr().err


def test_every_arm_is_a_valid_set_of_stage_flags():
    from stages.code2wav.options import Code2WavOptions

    for name, extra in bench.ARMS.items():
        Code2WavOptions.from_extra(extra)  # a typo in an arm would raise FlagError here
