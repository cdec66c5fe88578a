"""`tts-bench mem` through typer's CliRunner: synthetic backend, rss sampler, 0.05 s interval."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tts_bench.cli import app
from tts_bench.errors import ConfigError, ExitStatus
from tts_bench.rundir.results import RunDir

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--config", str(ROOT / "configs/ab/synthetic.yaml"), "--sampler", "rss", "--interval", "0.05",
        "--tier", "4x1", "--warm-tier", "2x1", "--num-prompts", "8",
        "--set", "synthetic.chunk_seconds=0.1", "--set", "synthetic.seconds_per_word=0.1",
        "--set", "synthetic.first_chunk_delay_s=0.01", "--set", "synthetic.chunk_delay_s=0.01",
        "--set", "bench.warmup=2"]


def _app():
    assert any(c.name == "mem" for c in app.registered_commands), "mem is registered in cli.py"
    return app


def invoke(tmp_path: Path, *args: str):
    result = CliRunner().invoke(_app(), ["mem", *FAST, "--result-dir", str(tmp_path), *args],
                                env={"NO_COLOR": "1", "COLUMNS": "120"}, standalone_mode=False)
    if result.exception is not None:
        raise result.exception
    return result


def test_json_has_the_documented_keys_and_the_run_is_recorded(tmp_path):
    result = invoke(tmp_path, "--format", "json")
    assert result.return_value == ExitStatus.OK
    doc = json.loads(result.stdout)
    assert doc["sampler"] == "rss" and doc["interval_s"] == 0.05 and doc["tier"] == "4x1"
    assert list(doc["arms"]) == ["base", "test"]
    for arm in doc["arms"].values():
        assert arm["steady_median_mib"] > 0 and arm["peak_mib"] >= arm["steady_median_mib"]
        assert arm["total_mib"] > arm["peak_mib"]
        assert arm["headroom_mib"] == pytest.approx(arm["total_mib"] - arm["peak_mib"])
        assert {s["phase"] for s in arm["samples"]} == {"warmup", "measure"}
        assert arm["sample_ms_mean"] > 0
    assert doc["arms"]["base"]["delta_mib"] == 0.0
    run = RunDir.open(doc["run_dir"])
    assert run.doc["status"] == "complete"
    assert run.doc["mem"]["series"]["rss"]["test"]["samples"][0]["readings"]
    assert run.doc["configs"]["base"]["mem"]["sampler"] == "rss"  # flags land in the config
    tiers = {r["tier"] for r in run.read_requests()}
    assert tiers == {"warm-2x1", "4x1"}
    (png,) = doc["timelines"]
    assert Path(png).parent == run.path and Path(png).read_bytes()[:4] == b"\x89PNG"


def test_markdown_table_is_shaped_like_the_seed(tmp_path):
    result = invoke(tmp_path, "--format", "md", "--warm-tier", "none")
    lines = result.stdout.splitlines()
    assert lines[0].startswith("**memory at 4x1 (rss, every 0.05 s")
    assert [c.strip() for c in lines[2].strip("|").split("|")] == [
        "arm", "steady-state median MiB", "peak MiB", "delta (steady)", "headroom MiB", "samples"]
    base = [c.strip() for c in lines[4].strip("|").split("|")]
    test = [c.strip() for c in lines[5].strip("|").split("|")]
    assert base[0] == "base" and base[3] == "(base)"
    assert test[0] == "test" and test[3].endswith("%)") and " MiB (" in test[3]
    assert any(line.startswith("timeline: ") and line.endswith(".png") for line in lines)
    assert "\x1b[" not in result.stdout


@pytest.mark.usefixtures("virtual_clock")
def test_duration_mode_samples_a_window_of_requests_that_has_no_fixed_count(tmp_path):
    # The measured jobs of --duration are a function of position (requests cycle until the
    # window ends): the progress task and the arm runs must not ask them for a length.
    result = invoke(tmp_path, "--format", "json", "--warm-tier", "none", "--duration", "0.6",
                    "--set", "bench.ramp_s=0.2", "--set", "bench.warmup_phase=false")
    assert result.return_value == ExitStatus.OK
    doc = json.loads(result.stdout)
    for arm in doc["arms"].values():
        assert arm["steady_median_mib"] > 0
    run = RunDir.open(doc["run_dir"])
    assert run.doc["status"] == "complete"
    measured = [r for r in run.read_requests() if r["tier"] == "4x1" and not r.get("warmup")]
    assert len(measured) > 8  # more than --num-prompts: the window, not the prompt count, ended it


def test_unknown_sampler_is_a_usage_error(tmp_path):
    with pytest.raises(ConfigError) as err:
        invoke(tmp_path, "--sampler", "nvidia-smi")
    assert err.value.exit_status == ExitStatus.USAGE
    assert "valid: auto, nvml, npu-smi, torch, rss" in str(err.value)


def test_torch_sampler_on_a_backend_without_allocator_stats_fails_before_any_tier(tmp_path):
    with pytest.raises(ConfigError, match="does not report allocator memory"):
        invoke(tmp_path, "--sampler", "rss,torch")
    assert list(tmp_path.iterdir()) == []  # no run record for a run that never started


@pytest.mark.gpu
def test_embedded_tiny_on_cuda_with_nvml_and_torch(tmp_path):
    args = ["mem", "--config", str(ROOT / "configs/ab/default.yaml"), "--set", "runner.device=cuda",
            "--tier", "4x2", "--warm-tier", "2x1", "--num-prompts", "8", "--interval", "0.2",
            "--sampler", "nvml,torch", "--result-dir", str(tmp_path), "--format", "json"]
    result = CliRunner().invoke(_app(), args, standalone_mode=False)
    if result.exception is not None:
        raise result.exception
    doc = json.loads(result.stdout)
    assert doc["sampler"] == "nvml" and set(doc["samplers"]) == {"nvml", "torch"}
    for arm in doc["arms"].values():
        assert 0 < arm["peak_mib"] < arm["total_mib"] and arm["headroom_mib"] > 0
    for arm in doc["samplers"]["torch"]["arms"].values():
        assert arm["steady_median_mib"] > 0 and arm["reserved_peak_mib"] >= arm["peak_mib"]


def test_the_backend_is_sized_for_the_warm_tier_when_it_runs_more_requests_at_once(tmp_path, monkeypatch):
    # The warm tier runs first on the same replicas: a backend sized for the sampled tier alone
    # would grow its per-request state (the embedded slot pools, dropping their graphs) in it.
    from tts_bench.load import phases

    told: list[int] = []
    make = phases.make_backend

    def sized(cfg):
        backend = make(cfg)
        backend.expect_concurrency = told.append  # the synthetic backend sizes nothing itself
        return backend

    monkeypatch.setattr(phases, "make_backend", sized)
    invoke(tmp_path, "--format", "json", "--tier", "2x1", "--warm-tier", "4x1")
    assert told == [4, 4]  # both arms, the warm tier's 4 over the sampled 2
    told.clear()
    invoke(tmp_path, "--format", "json", "--tier", "4x1", "--warm-tier", "2x1")
    assert told == [4, 4]


def test_auto_with_a_broken_npu_smi_on_path_measures_with_the_fallback(tmp_path, monkeypatch, caplog):
    from tests.unit.test_mem_samplers import _nvml_missing, fake_npu_smi

    (tmp_path / "bin").mkdir()
    fake_npu_smi(tmp_path / "bin", monkeypatch, "cat zero.txt")
    _nvml_missing(monkeypatch)
    result = invoke(tmp_path / "runs", "--sampler", "auto", "--format", "json")
    assert result.return_value == ExitStatus.OK, result.output
    assert json.loads(result.stdout)["sampler"] == "rss"  # not npu-smi: every sample would have failed
    assert "npu-smi is on PATH but unusable" in caplog.text + result.stderr
