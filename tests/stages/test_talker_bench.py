"""scripts/bench_talker.py: preludes alternate window by window on one prefill.

Run: python -m pytest tests/stages/test_talker_bench.py -q
"""

from __future__ import annotations

import json

import pytest
import torch

from scripts import bench_talker as bench
from stages.talker.engine import TalkerEngine
from stages.talker.prelude import penalty_temperature_eager


def recording(name: str, log: list[str]):
    def prelude(logits, *args, out=None):
        log.append(name)
        return penalty_temperature_eager(logits, *args, out=out)

    prelude.__name__ = f"recording_{name}"
    return prelude


def test_preludes_alternate_a_b_then_b_a_on_the_same_requests():
    log: list[str] = []
    engine = TalkerEngine(bench.tiny_config(), device=torch.device("cpu"), dtype=torch.float32,
                          max_batch=2, max_seq_len=256)  # fmt: skip
    preludes = {"eager": recording("a", log), "selected": recording("b", log)}
    cells = bench.measure(engine, torch.device("cpu"), preludes, batch=2, steps=2, warmup=2,
                          reps=3)  # fmt: skip
    # prefill (engine's own prelude), warmup 1 step each, windows A B | B A | A B of 2 steps,
    # then one profiled step per prelude for the kernel count.
    assert log == ["a", "b"] + ["a"] * 2 + ["b"] * 4 + ["a"] * 4 + ["b"] * 2 + ["a", "b"]
    assert [(c.prelude, c.impl, len(c.windows_ms)) for c in cells] == [
        ("eager", "recording_a", 3), ("selected", "recording_b", 3)]  # fmt: skip
    assert cells[0].prefill_ms == cells[1].prefill_ms  # one shared prefill
    assert not engine.has_work()  # the requests were cancelled afterwards


def test_ratio_is_the_median_of_per_repetition_pairs():
    def cell(graph, prelude, ms, kernels):
        return bench.Cell(decode_graph=graph, prelude=prelude, impl=prelude, batch=8,
                          prefill_ms=1.0, windows_ms=ms, kernels_per_step=kernels)  # fmt: skip

    # A slow drift along the run (both preludes +2 ms per repetition) and one outlier window:
    # pairs are 0.9, 0.95, 3.0 -> median 0.95; the ratio of medians (14 / 12) would say slower.
    cells = [cell(False, "eager", [10.0, 12.0, 14.0], 900),
             cell(False, "selected", [9.0, 11.4, 42.0], 887),
             cell(True, "eager", [4.0, 4.0], 900),
             cell(True, "selected", [5.0, 5.0], 887)]  # fmt: skip
    first, second = bench.ratios(cells)
    assert (first["decode_graph"], first["step_ratio_vs_eager"]) == (False, 0.95)
    assert (first["pair_ratio_min"], first["pair_ratio_max"]) == (0.9, 3.0)
    assert first["ratio_of_medians"] == round(11.4 / 12.0, 4) and first["kernels_saved"] == 13
    assert (second["decode_graph"], second["step_ratio_vs_eager"]) == (True, 1.25)


def test_cpu_run_writes_one_json_document(tmp_path, capsys):
    bench.main(["--device", "cpu", "--tiny", "--dtype", "float32", "--batches", "1,2",
                "--steps", "1", "--reps", "2", "--warmup", "2", "--out", str(tmp_path)])  # fmt: skip
    last = capsys.readouterr().out.strip().splitlines()[-1]
    doc = json.loads(last)
    assert doc == json.loads((tmp_path / "talker_bench.json").read_text())
    assert doc["schema"] == "talker-bench/2" and doc["timing"] == "round_robin"
    assert [(r["batch"], r["prelude"]) for r in doc["rows"]] == [
        (1, "eager"), (1, "selected"), (2, "eager"), (2, "selected")]  # CPU: no graph pass
    assert all(len(r["windows_ms"]) == 2 for r in doc["rows"])
    assert [r["batch"] for r in doc["ratios"]] == [1, 2]
    # Where the step's launches go: the most frequent operators, with their counts.
    assert all(sum(r["kernels_by_name"].values()) <= r["kernels_per_step"] for r in doc["rows"])
    assert all("aten::linear" in r["kernels_by_name"] for r in doc["rows"])


def test_extras_reach_the_engines_and_the_record(tmp_path, capsys, talker_extras):
    seen = talker_extras(bench)
    bench.main(["--device", "cpu", "--tiny", "--dtype", "float32", "--batches", "1", "--steps", "1",
                "--reps", "1", "--warmup", "1", "--extra", "talker_fused_layers=false", "--out", str(tmp_path)])
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["extra"] == {"talker_fused_layers": "false"}
    assert seen and all(extra["talker_fused_layers"] == "false" for extra in seen)


def test_a_malformed_extra_is_refused():
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        bench.parse_extras(["talker_fused_layers"])
