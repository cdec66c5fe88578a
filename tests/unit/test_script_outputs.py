"""The measuring scripts' committed results are what the scripts write: each markdown table
re-renders byte for byte from its committed JSON, and each JSON file is the one writer's form of
its own document, so rerunning a script changes figures, never the shape of the files."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from tts_bench.rundir.atomic_json import write_json_atomic

ROOT = Path(__file__).resolve().parents[2]


def script(name: str):
    return importlib.import_module(f"scripts.{name}")  # scripts/ is importable from the repository root


def committed(stem: str) -> tuple[dict, str]:
    return json.loads((ROOT / f"{stem}.json").read_text()), (ROOT / f"{stem}.md").read_text()


@pytest.mark.parametrize("name, stem", [
    ("aa_false_verdicts", "results/cpu/aa_false_verdicts"),
    ("aa_synthetic", "results/cpu/aa_false_verdicts_synthetic"),
])
def test_the_aa_tables_re_render_from_their_json(name, stem):
    doc, md = committed(stem)
    assert script(name).to_markdown(doc) == md


@pytest.mark.parametrize("stem", ["aa_sweep_duration", "aa_sweep_duration_open_loop"])
def test_the_aa_sweep_tables_re_render_from_their_json(stem):
    doc, md = committed(f"results/cpu/{stem}")
    assert script("aa_sweep").to_markdown(doc, stem) == md


def test_the_coverage_table_re_renders_from_its_json():
    cov = script("stats_coverage")
    doc, md = committed("results/stats/coverage")
    cells = [cov.Cell(**c) for c in doc["cells"]]
    scenarios = tuple(cov.Scenario(**s) for s in doc["scenarios"])
    assert cov.to_markdown(cells, scenarios, doc["runs_per_cell"], doc["wall_s"]) == md


@pytest.mark.parametrize("path", [
    "results/cpu/aa_false_verdicts.json", "results/cpu/aa_false_verdicts_synthetic.json",
    "results/cpu/aa_sweep_duration.json", "results/stats/coverage.json",
    "results/baselines/synthetic.cpu-2core.json", "results/baselines/synthetic.cpu-2core.calibration.json",
])
def test_committed_json_is_the_writers_form_of_its_document(path, tmp_path):
    text = (ROOT / path).read_text()
    assert write_json_atomic(tmp_path / "again.json", json.loads(text)).read_text() == text
