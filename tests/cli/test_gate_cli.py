"""`tts-bench gate` and `tts-bench baseline update` end to end on the synthetic backend.

Each run is a fresh synthetic backend (10 ms per chunk, 16 requests): well under a second.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer

from tts_bench.errors import ExitStatus
from tests.cli.gate_cases import record_baseline, synthetic_case
from tests.cli.in_process import invoke_app

ROOT = Path(__file__).resolve().parents[2]


def _app() -> typer.Typer:
    """The real CLI once gate/baseline are registered there; until then the same registration."""
    from tts_bench import cli
    from tts_bench.commands import baseline, gate

    names = {c.name for c in cli.app.registered_commands} | {g.name for g in cli.app.registered_groups}
    if {"gate", "baseline"} <= names:
        return cli.app
    app = typer.Typer()
    app.callback()(lambda: None)
    app.command("gate")(gate.gate)
    app.add_typer(baseline.app, name="baseline")
    return app


def invoke(*args: str):
    return invoke_app(_app(), *args, columns=140)


@pytest.fixture
def case(tmp_path: Path, virtual_clock) -> Path:
    """A synthetic case on virtual time: its TTFP and RTF are what its delays imply, however
    loaded the machine (a loaded one once pushed an unchanged run's TTFP past the 20 %)."""
    return synthetic_case(tmp_path / "synth.yaml", bench="{tiers: [4x1], num_prompts: 16, repeats: 1, warmup: 2}",
                          extra="thresholds: {audio_rtf: 10, audio_ttfp_ms: 20, audio_throughput: 10}\n"
                                "alpha: 0.01\nmin_samples: 8\n")


@pytest.fixture
def baseline(case: Path, tmp_path: Path) -> Path:
    return record_baseline(invoke, case, tmp_path / "synth.cpu-2core.json", run=2, result_dir=tmp_path / "runs")


def gate(case: Path, baseline: Path, tmp_path: Path, *extra: str):
    return invoke("gate", "--run-case", str(case), "--baseline", str(baseline), "--profile", "cpu-2core",
                  "--result-dir", str(tmp_path / "runs"), *extra)


def test_baseline_records_provenance_and_pooled_samples(baseline):
    doc = json.loads(baseline.read_text())
    assert (doc["case"], doc["profile"], doc["backend"], doc["n_runs"]) == ("synth", "cpu-2core", "synthetic", 2)
    rtf = doc["tiers"]["4x1"]["audio_rtf"]
    assert rtf["n"] == 32 and len(rtf["samples"]) == 32 and len(rtf["per_run"]) == 2


def test_unchanged_run_passes_with_a_table(case, baseline, tmp_path):
    result, status = gate(case, baseline, tmp_path, "--format", "md")
    assert status == ExitStatus.OK, result.output
    lines = result.stdout.splitlines()
    header = [c.strip() for c in lines[2].strip("|").split("|")]
    assert header == ["tier", "metric", "baseline", "current", "delta", "threshold", "p-value", "mark"]
    assert lines[0] == "**perf gate**"
    marks = [c.strip() for c in lines[4].strip("|").split("|")]
    assert marks[:2] == ["4x1", "audio_rtf (lower is better)"] and marks[-1] == "="
    assert "verdict: pass" in result.stdout


def test_slowed_arm_exits_perf_regression(case, baseline, tmp_path):
    result, status = gate(case, baseline, tmp_path, "--set", "synthetic.delay_scale=1.2", "--format", "json")
    assert status == ExitStatus.PERF_REGRESSION, result.output
    doc = json.loads(result.stdout)
    rtf = next(r for r in doc["rows"] if r["metric"] == "audio_rtf")
    assert rtf["mark"] == "worse" and rtf["delta_pct"] > 10 and rtf["p_value"] < 0.01
    assert any("delay_scale=1.2" in n for n in doc["notes"])


def test_report_only_reports_the_regression_and_exits_zero(case, baseline, tmp_path):
    result, status = gate(case, baseline, tmp_path, "--set", "synthetic.delay_scale=1.2", "--report-only")
    assert status == ExitStatus.OK
    assert "verdict: perf regression (report only)" in result.stdout


def test_all_requests_failing_exits_invalid_not_perf(case, baseline, tmp_path):
    result, status = gate(case, baseline, tmp_path, "--set", "synthetic.fail_every=1", "--format", "json",
                          "--report-only")
    assert status == ExitStatus.INVALID_RUN
    doc = json.loads(result.stdout)
    assert doc["rows"] == [] and any("all 16 requests failed" in r for r in doc["invalid_reasons"])


def test_hardware_profile_mismatch_exits_invalid(case, baseline, tmp_path):
    result, status = invoke("gate", "--run-case", str(case), "--baseline", str(baseline), "--profile", "h200",
                            "--result-dir", str(tmp_path / "runs"), "--format", "json")
    assert status == ExitStatus.INVALID_RUN
    assert any("hardware profile" in r for r in json.loads(result.stdout)["invalid_reasons"])


def test_current_run_dir_is_gated_with_the_case_it_recorded(case, baseline, tmp_path):
    _, status = gate(case, baseline, tmp_path)
    run = max((tmp_path / "runs").iterdir())
    result, status = invoke("gate", "--current", str(run), "--baseline", str(baseline),
                            "--profile", "cpu-2core", "--format", "csv")
    assert status == ExitStatus.OK, result.output
    assert result.stdout.splitlines()[0] == "tier,metric,baseline,current,delta,threshold,p-value,mark"


def test_baseline_update_refuses_failed_and_perturbed_runs(case, tmp_path):
    runs = tmp_path / "runs"
    gate_args = ("--baseline", str(tmp_path / "none.json"))
    assert invoke("gate", "--run-case", str(case), *gate_args)[1] == ExitStatus.USAGE  # no baseline yet
    from tts_bench.gate.bench import run_case
    from tts_bench.gate.case import load_case, resolve_case

    loaded = load_case(case)
    failed = run_case(resolve_case(loaded, ["synthetic.fail_every=4"]), profile="cpu-2core", result_dir=runs)
    clean = run_case(resolve_case(loaded), profile="cpu-2core", result_dir=runs)
    out = str(tmp_path / "b.json")
    result, status = invoke("baseline", "update", "--case", str(case), "--profile", "cpu-2core",
                            "--from", str(clean.path), str(failed.path), "--out", out)
    assert status == ExitStatus.INVALID_RUN and not Path(out).exists()
    slowed = run_case(resolve_case(loaded, ["synthetic.delay_scale=1.2"]), profile="cpu-2core", result_dir=runs)
    result, status = invoke("baseline", "update", "--case", str(case), "--profile", "cpu-2core",
                            "--from", str(clean.path), "--from", str(slowed.path), "--out", out)
    assert status == ExitStatus.INVALID_RUN and not Path(out).exists()


def test_a_regressed_wer_run_exits_accuracy_regression(case, baseline, tmp_path):
    from tts_bench.rundir.results import RunDir

    wer = RunDir.create(tmp_path / "runs", "wer", command_line="tts-bench wer", configs={})
    wer.update(wer={"verdict": "regression", "exit_status": 4, "reasons": ["test vs base: ΔWER +4.10 points"]})
    before = set((tmp_path / "runs").glob("*-case-*"))  # the baseline's own runs
    result, status = gate(case, baseline, tmp_path, "--wer-run", str(wer.path), "--format", "md")
    assert status == ExitStatus.ACCURACY_REGRESSION, result.output
    assert "accuracy: wer: test vs base: ΔWER +4.10 points" in result.stdout
    # Run names sort by second, then by a random suffix: find the gate's run by difference.
    (made,) = set((tmp_path / "runs").glob("*-case-*")) - before
    gated = json.loads((made / "run.json").read_text())
    assert gated["gate"]["verdict"] == "accuracy regression"


def test_memory_is_gated_when_the_case_samples_it(tmp_path):
    path = tmp_path / "mem.yaml"
    path.write_text(
        f"name: memsynth\nconfig: {ROOT / 'configs/ab/synthetic.yaml'}\n"
        "overrides: [mem.interval_s=0.05, mem.sampler=rss]\n"
        "bench: {tiers: [4x1], num_prompts: 16, warmup: 2, mem: true}\nmin_samples: 8\n"
    )
    out = tmp_path / "memsynth.cpu-2core.json"
    _, status = invoke("baseline", "update", "--case", str(path), "--run", "1", "--profile", "cpu-2core",
                       "--result-dir", str(tmp_path / "runs"), "--out", str(out))
    assert status == ExitStatus.OK
    assert {"steady_mem_mib", "peak_mem_mib"} <= set(json.loads(out.read_text())["tiers"]["4x1"])
    result, status = gate(path, out, tmp_path, "--format", "json")
    rows = {r["metric"]: r for r in json.loads(result.stdout)["rows"]}
    assert rows["peak_mem_mib"]["better"] == "lower" and rows["steady_mem_mib"]["n_current"] > 0


def test_a_gate_run_set_to_duration_mode_runs_duration_phases_not_a_silent_count(case, baseline, tmp_path):
    from tts_bench.rundir.records import read_records
    from tts_bench.rundir.results import RunDir

    before = set((tmp_path / "runs").iterdir())
    gate(case, baseline, tmp_path, "--set", "bench.duration_s=0.3", "--set", "bench.window_s=0.1",
         "--set", "bench.ramp_s=0.05", "--report-only")
    (run,) = set((tmp_path / "runs").iterdir()) - before
    records = read_records(RunDir.open(run))
    measured = [r for r in records if not r.warmup]
    assert measured and all(r.window == "window" for r in measured)  # sent inside the measured window
