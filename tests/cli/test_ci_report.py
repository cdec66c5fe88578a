"""`--junit` and GITHUB_STEP_SUMMARY on `ab` and `gate` (synthetic backend, about a second a run).

The JUnit checks are the common schema's shape (the one Jenkins, GitLab and GitHub reporters
read), written here with xml.etree: <testsuites> > <testsuite> > <testcase> > <failure|error|
skipped>, with the count attributes agreeing with the elements.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.cli.gate_cases import record_baseline, synthetic_case
from tests.cli.in_process import invoke_app
from tts_bench.report.ci import append_step_summary
from tts_bench.cli import app
from tts_bench.errors import ExitStatus

ROOT = Path(__file__).resolve().parents[2]
SYNTH = str(ROOT / "configs/ab/synthetic.yaml")
COUNTS = ("tests", "failures", "errors", "skipped")


def check_junit_schema(path: Path) -> ET.Element:
    """The common JUnit shape; returns the root. Fails the test on the first deviation."""
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    suites = list(root)
    assert suites and all(s.tag == "testsuite" for s in suites)
    totals = dict.fromkeys(COUNTS, 0)
    for suite in suites:
        assert suite.get("name")
        float(suite.get("time"))
        cases = suite.findall("testcase")
        assert [c.tag for c in suite] == ["testcase"] * len(cases)
        outcomes = {k: 0 for k in COUNTS}
        outcomes["tests"] = len(cases)
        for case in cases:
            assert case.get("name") and case.get("classname")
            float(case.get("time"))
            kinds = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
            assert len(kinds) <= 1
            assert set(c.tag for c in case) <= {"failure", "error", "skipped", "system-out", "system-err"}
            for kind in kinds:
                outcomes[{"failure": "failures", "error": "errors", "skipped": "skipped"}[kind]] += 1
                assert case.find(kind).get("message")
        for key in COUNTS:
            assert int(suite.get(key)) == outcomes[key], key
            totals[key] += outcomes[key]
    for key in COUNTS:
        assert int(root.get(key)) == totals[key], key
    return root


def run_ab(tmp_path: Path, *extra: str):
    return invoke_app(app, "ab", "--config", SYNTH, "--tiers", "4x1", "--num-prompts", "8", "--repeats", "2",
                      "--format", "md", "--result-dir", str(tmp_path / "runs"), *extra)


def test_ab_junit_has_one_case_per_tier_and_metric_and_slower_passes_by_default(tmp_path, monkeypatch, virtual_clock):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    junit = tmp_path / "ab.xml"
    result, status = run_ab(tmp_path, "--junit", str(junit), "--test-set", "synthetic.delay_scale=1.5")
    assert status == ExitStatus.OK, result.output
    root = check_junit_schema(junit)
    cases = root.findall("testsuite/testcase")
    assert sorted(c.get("name") for c in cases) == ["4x1.audio_rtf", "4x1.audio_throughput", "4x1.audio_ttfp_ms"]
    rtf = next(c for c in cases if c.get("name") == "4x1.audio_rtf")
    assert rtf.find("failure") is None and rtf.findtext("system-out").startswith("slower: +")


def test_ab_fail_on_slower_makes_a_failure_with_the_verdict_text_and_exit_3(tmp_path, monkeypatch, virtual_clock):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    junit = tmp_path / "ab.xml"
    result, status = run_ab(tmp_path, "--junit", str(junit), "--fail-on-slower",
                            "--test-set", "synthetic.delay_scale=1.5")
    assert status == ExitStatus.PERF_REGRESSION, result.output
    failure = check_junit_schema(junit).find("testsuite/testcase[@name='4x1.audio_rtf']/failure")
    assert failure is not None
    assert failure.get("message").startswith("slower: +") and "MDE" in failure.get("message")


def test_ab_step_summary_is_appended_only_when_the_variable_is_set(tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    run_ab(tmp_path)
    assert not summary.exists()
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result, status = run_ab(tmp_path)
    assert status == ExitStatus.OK, result.output
    text = summary.read_text()
    assert text.startswith("earlier step\n") and "audio RTF" in text and "| Tier (conc x repl)" in text


def test_step_summary_helper_ignores_an_empty_variable(tmp_path):
    assert append_step_summary("x", {"GITHUB_STEP_SUMMARY": ""}) is None
    assert append_step_summary("x", {}) is None
    out = tmp_path / "s.md"
    assert append_step_summary("| a |", {"GITHUB_STEP_SUMMARY": str(out)}) == out
    assert out.read_text() == "| a |\n"


@pytest.fixture
def case(tmp_path: Path, virtual_clock) -> Path:
    """On virtual time (tests/virtual_clock.py): the 1.5x arm is 1.5x, however loaded the machine."""
    return synthetic_case(tmp_path / "synth.yaml", bench="{tiers: [4x1], num_prompts: 16, repeats: 1, warmup: 2}",
                          extra="thresholds: {audio_rtf: 10, audio_ttfp_ms: 20, audio_throughput: 10}\n"
                                "alpha: 0.01\nmin_samples: 8\n")


def test_gate_junit_failures_are_its_worse_rows_and_summary_has_its_table(case, tmp_path, monkeypatch):
    base = record_baseline(lambda *a: invoke_app(app, *a), case, tmp_path / "synth.cpu-2core.json",
                           run=1, result_dir=tmp_path / "runs")
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    junit = tmp_path / "gate.xml"
    result, status = invoke_app(app, "gate", "--run-case", str(case), "--baseline", str(base), "--profile",
                                "cpu-2core", "--result-dir", str(tmp_path / "runs"), "--format", "md",
                                "--set", "synthetic.delay_scale=1.5", "--junit", str(junit), "--plot")
    assert status == ExitStatus.PERF_REGRESSION, result.output
    root = check_junit_schema(junit)
    failed = {c.get("name") for c in root.iter("testcase") if c.find("failure") is not None}
    assert "4x1.audio_rtf" in failed
    assert root.find("testsuite/testcase[@name='4x1.audio_rtf']/failure").get("message").startswith("worse: +")
    assert "perf gate" in summary.read_text() and "verdict: perf regression" in summary.read_text()
    gated = next(p for p in (tmp_path / "runs").iterdir() if (p / "report.html").exists())  # --plot
    assert (gated / "ecdf_audio_rtf.png").stat().st_size > 1000
