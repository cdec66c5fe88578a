"""The gate's judgement (marks, direction, invalid runs), baselines and the config hash."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tts_bench.config import BenchConfig, apply_overrides, config_to_dict
from tts_bench.errors import ConfigError, ExitStatus, InvalidRunError
from tts_bench.gate.baseline import build_baseline, is_faster, load_baseline, write_baseline
from tts_bench.gate.case import CaseThresholds
from tts_bench.gate.judge import compare_metric, judge, mark_for
from tts_bench.config.sut import sut_hash
from tts_bench.gate.samples import Provenance, RunSamples, TierSamples

THR = CaseThresholds(audio_rtf=10.0, audio_ttfp_ms=20.0, audio_throughput=10.0)


def _prov(**kw) -> Provenance:
    base = dict(case="c", profile="cpu-2core", backend="synthetic", sut_hash="abc", run_sut_hash="abc",
                extra_sets=(), git_sha="deadbeef", git_dirty=False, created="2026-11-29T20:00:00",
                cpu_count=2)
    return Provenance(**{**base, **kw})


def _run(rtf_scale: float = 1.0, *, n: int = 40, seed: int = 0, failed: int = 0, completed: int | None = None,
         path: str | None = None, **prov) -> RunSamples:
    rng = np.random.default_rng(seed)
    path = f"run{seed}" if path is None else path  # a baseline refuses one run given twice
    completed = n - failed if completed is None else completed
    rtf = list(0.04 * rtf_scale * (1 + 0.02 * rng.standard_normal(completed)))
    ttfp = list(10.0 * rtf_scale * (1 + 0.02 * rng.standard_normal(completed)))
    tier = TierSamples(expected=n, completed=completed, failed=failed,
                       failed_by_kind={"backend_error": failed} if failed else {},
                       samples={"audio_rtf": rtf, "audio_ttfp_ms": ttfp,
                                "audio_throughput": [90.0 / rtf_scale]} if completed else {})
    return RunSamples(path, "base", _prov(**prov), {"4x1": tier})


def _baseline(*runs: RunSamples) -> dict:
    return build_baseline(list(runs) or [_run(seed=1), _run(seed=2)], case="c", profile="cpu-2core", sut="abc")


def test_lower_is_better_metric_rising_is_worse_and_throughput_rising_is_better():
    assert mark_for(15.0, 10.0, 1e-6, 0.01) == "worse"
    assert mark_for(-15.0, 10.0, 1e-6, 0.01) == "better"
    base = {"center": 100.0, "samples": [100.0] * 20}
    row = compare_metric("4x1", "audio_throughput", base, [120.0] * 20, threshold=10.0, alpha=0.01)
    assert row.delta_pct == pytest.approx(20.0) and row.mark == "better"
    row = compare_metric("4x1", "audio_rtf", {"center": 1.0, "samples": [1.0] * 20}, [1.2] * 20,
                         threshold=10.0, alpha=0.01)
    assert row.mark == "worse"


def test_a_whole_run_shift_within_the_calibrated_run_to_run_sd_is_tilde_not_worse():
    # tiny-embedded on a shared CPU: one run 30% slower, every request with it (U test p ~ 0),
    # while whole runs move with a calibrated SD of 25%: not evidence of a regression.
    from tts_bench.gate.judge import RunLevel, run_p_value

    base = {"center": 1.0, "samples": list(np.linspace(0.95, 1.05, 40)), "per_run": [1.0, 1.0, 1.0]}
    cur = list(np.linspace(1.25, 1.35, 40))
    noisy = RunLevel(phase_sd=0.25, df=80, current_phases=1, baseline_phases=3)
    row = compare_metric("2x1", "audio_rtf", base, cur, threshold=25.0, alpha=0.01, run_level=noisy)
    assert row.p_value < 1e-6 and row.run_p_value > 0.01 and row.mark == "~"
    quiet = RunLevel(phase_sd=0.02, df=80, current_phases=1, baseline_phases=3)
    row = compare_metric("2x1", "audio_rtf", base, cur, threshold=25.0, alpha=0.01, run_level=quiet)
    assert row.run_p_value < 1e-6 and row.mark == "worse"
    # z = ln(1.3) / (0.25 * sqrt(1 + 1/3)), two-sided t with 80 df
    from scipy import stats

    z = np.log(1.3) / (0.25 * np.sqrt(4 / 3))
    assert run_p_value(np.log(1.3), noisy) == pytest.approx(2 * stats.t.sf(z, 80))


def test_beyond_threshold_but_not_significant_is_tilde():
    # Three samples a side cannot reach p < 0.01 however far apart they are.
    base = {"center": 1.0, "samples": [0.9, 1.0, 1.1]}
    row = compare_metric("4x1", "audio_rtf", base, [1.4, 1.5, 1.6], threshold=10.0, alpha=0.01)
    assert row.delta_pct == pytest.approx(50.0)
    assert row.p_value >= 0.01 and row.mark == "~"


def test_within_threshold_is_equal_even_when_significant():
    assert mark_for(3.0, 10.0, 1e-9, 0.01) == "="
    assert mark_for(30.0, None, 1e-9, 0.01) == "not gated"


def test_a_slower_current_run_exits_perf_regression():
    report = judge(_baseline(), _run(1.2, seed=3), THR, alpha=0.01)
    marks = {r.metric: r.mark for r in report.rows}
    # One throughput value per run cannot be significant: beyond the threshold, marked `~`.
    assert marks["audio_rtf"] == "worse" and marks["audio_throughput"] == "~"
    assert report.exit_status() == ExitStatus.PERF_REGRESSION
    assert report.exit_status(report_only=True) == ExitStatus.OK


def test_an_unchanged_run_passes():
    report = judge(_baseline(), _run(seed=4), THR, alpha=0.01)
    assert {r.mark for r in report.rows} == {"="}
    assert report.exit_status() == ExitStatus.OK


def test_all_requests_failing_is_invalid_not_a_throughput_regression():
    report = judge(_baseline(), _run(n=40, failed=40), THR, alpha=0.01)
    assert report.exit_status() == ExitStatus.INVALID_RUN
    assert report.rows == []
    assert any("all 40 requests failed" in r for r in report.invalid_reasons)


@pytest.mark.parametrize("field,value,word", [("profile", "h200", "hardware profile"),
                                              ("backend", "piper", "backend"),
                                              ("sut_hash", "fff", "config hash"),
                                              ("case", "other", "case")])
def test_provenance_mismatch_is_invalid(field, value, word):
    report = judge(_baseline(), _run(**{field: value}), THR, alpha=0.01)
    assert report.exit_status() == ExitStatus.INVALID_RUN
    assert any(word in r for r in report.invalid_reasons)


def test_missing_samples_and_failures_are_invalid():
    cut_short = judge(_baseline(), _run(n=40, completed=20), THR, alpha=0.01)
    assert any("20 of 40 planned" in r for r in cut_short.invalid_reasons)
    one_failed = judge(_baseline(), _run(n=40, failed=1), THR, alpha=0.01)
    assert one_failed.exit_status() == ExitStatus.INVALID_RUN
    no_tier = RunSamples("r", "base", _prov(), {})
    assert judge(_baseline(), no_tier, THR, alpha=0.01).exit_status() == ExitStatus.INVALID_RUN


def test_a_wer_regression_exits_accuracy_and_invalid_beats_it():
    wer = {"verdict": "regression", "reasons": ["test vs base: ΔWER +3 points"]}
    assert judge(_baseline(), _run(seed=5), THR, alpha=0.01, wer_doc=wer).exit_status() == ExitStatus.ACCURACY_REGRESSION
    both = judge(_baseline(), _run(profile="h200"), THR, alpha=0.01, wer_doc=wer)
    assert both.exit_status() == ExitStatus.INVALID_RUN


def test_baseline_pools_samples_and_records_dispersion():
    doc = _baseline(_run(seed=1, path="a"), _run(1.01, seed=2, path="b"))
    rtf = doc["tiers"]["4x1"]["audio_rtf"]
    assert doc["n_runs"] == 2 and rtf["n"] == 80 and len(rtf["per_run"]) == 2
    assert rtf["per_run_std"] == pytest.approx(np.std(rtf["per_run"], ddof=1))
    assert doc["commit"] == "deadbeef" and doc["sut_hash"] == "abc"


def test_baseline_refuses_failed_runs_and_mixed_provenance():
    with pytest.raises(InvalidRunError, match="failed requests"):
        _baseline(_run(seed=1), _run(failed=2, seed=2))
    with pytest.raises(InvalidRunError, match="config hash"):
        _baseline(_run(seed=1), _run(seed=2, sut_hash="zzz", run_sut_hash="zzz"))
    with pytest.raises(InvalidRunError, match="extra overrides"):
        _baseline(_run(seed=1), _run(seed=2, extra_sets=("synthetic.delay_scale=1.2",), run_sut_hash="q"))


def test_tighten_only_keeps_the_old_baseline_unless_the_new_one_is_faster(tmp_path):
    path = tmp_path / "c.cpu-2core.json"
    old = _baseline(_run(seed=1), _run(seed=2))
    assert write_baseline(old, path).written
    slower = json.loads(json.dumps(old))
    slower["tiers"]["4x1"]["audio_rtf"]["center"] *= 1.05
    assert not is_faster(slower, old)
    kept = write_baseline(slower, path, tighten_only=True)
    assert not kept.written and load_baseline(path)["tiers"] == old["tiers"]
    faster = json.loads(json.dumps(old))
    faster["tiers"]["4x1"]["audio_rtf"]["center"] *= 0.95
    assert write_baseline(faster, path, tighten_only=True).written
    assert load_baseline(path)["tiers"]["4x1"]["audio_rtf"]["center"] == faster["tiers"]["4x1"]["audio_rtf"]["center"]
    other = {**faster, "sut_hash": "other"}
    with pytest.raises(ConfigError, match="another config"):
        write_baseline(other, path, tighten_only=True)


def test_sut_hash_follows_the_system_not_the_judging_or_schema_defaults():
    cfg = apply_overrides(BenchConfig(), ["backend=synthetic", "synthetic.chunk_delay_s=0.01"])
    d = config_to_dict(cfg)
    h = sut_hash(d)
    assert sut_hash(config_to_dict(apply_overrides(cfg, ["bench.min_effect_pct=5", "wer.num_prompts=3"]))) == h
    assert sut_hash(config_to_dict(apply_overrides(cfg, ["synthetic.delay_scale=1.2"]))) != h
    assert sut_hash(config_to_dict(apply_overrides(cfg, ["bench.num_prompts=99"]))) != h
    # A field at its default value (e.g. one a newer schema added) does not change the hash.
    dropped = json.loads(json.dumps(d))
    del dropped["synthetic"]["fail_every"]
    assert sut_hash(dropped) == h


def test_baseline_refuses_a_run_given_twice_and_non_finite_samples():
    with pytest.raises(ConfigError, match="more than once"):
        _baseline(_run(seed=1, path="a"), _run(seed=2, path="a"))
    damaged = _run(seed=2)
    damaged.tiers["4x1"].samples["audio_rtf"][3] = float("nan")
    with pytest.raises(InvalidRunError, match="1 non-finite audio_rtf"):
        _baseline(_run(seed=1), damaged)


def test_a_current_run_with_non_finite_samples_is_invalid_not_a_crash():
    damaged = _run(seed=3)
    damaged.tiers["4x1"].samples["audio_ttfp_ms"][0] = float("inf")
    report = judge(_baseline(), damaged, THR, alpha=0.01)
    assert report.exit_status() == ExitStatus.INVALID_RUN
    assert any("non-finite audio_ttfp_ms" in r for r in report.invalid_reasons)


@pytest.mark.parametrize(("edit", "why"), [
    (lambda d: d.update(tiers={}), "no tiers"),
    (lambda d: d["tiers"].update({"4x1": {}}), "no metrics"),
    (lambda d: d["tiers"]["4x1"]["audio_rtf"].update(center=0.0), "not a positive number"),
    (lambda d: d["tiers"]["4x1"]["audio_rtf"].update(center=float("nan")), "not a positive number"),
    (lambda d: d["tiers"]["4x1"]["audio_rtf"].update(samples=[]), "non-empty list"),
    (lambda d: d["tiers"]["4x1"]["audio_rtf"].update(better="faster"), "not lower or higher"),
])
def test_a_degenerate_baseline_is_refused_before_it_can_pass_a_gate(tmp_path, edit, why):
    doc = _baseline()
    edit(doc)
    path = tmp_path / "b.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=why):
        load_baseline(path)


@pytest.mark.parametrize("content", ["[]", "3", "\"text\""])
def test_a_baseline_file_that_is_not_an_object_or_not_a_file_is_a_config_error(tmp_path, content):
    path = tmp_path / "b.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match="not a baseline"):
        load_baseline(path)
    with pytest.raises(ConfigError, match="cannot read baseline"):
        load_baseline(tmp_path)
    with pytest.raises(ConfigError, match="is a directory"):
        write_baseline(_baseline(), tmp_path)
