"""`tts-bench wer` on a Chinese set: CER end to end with the text-code fakes (milliseconds), the
history and advice kept apart from English WER, and one real run of configs/wer/seed-tts-zh.yaml
(tiny embedded runner + Whisper base in Chinese; slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_wer_cli import ROOT, _invoke, _wer
from tts_bench.errors import ConfigError, InvalidRunError
from tts_bench.wer import runner
from tts_bench.wer.advice import prompt_advice
from tts_bench.wer.gate import HistoryEntry, find_reference, load_history, write_history
from tts_bench.config.wer import WerParams
from tts_bench.wer.testing import TextCodeBackend, TextCodeTranscriber, fake_provenance

TEXTS = ["清晨的雾气慢慢散去。", "请把窗户关好，好吗？", "吃葡萄不吐葡萄皮。", "大家早上好！"]


@pytest.fixture
def zh_world(tmp_path, monkeypatch):
    """A Chinese meta.lst + config; the backend speaks traditional characters (as Whisper often
    writes Mandarin), so a CER scored as seed-tts-eval does is 0 unless an arm is degraded."""
    pytest.importorskip("zhconv")
    (tmp_path / "ref.wav").write_bytes((ROOT / "tts_bench/data/seed-tts-en/prompts/ref_0.wav").read_bytes())
    meta = tmp_path / "meta.lst"
    meta.write_text("".join(f"zh_{i:04d}|ref|ref.wav|{t}\n" for i, t in enumerate(TEXTS, 1)), encoding="utf-8")
    cfg = tmp_path / "wer.yaml"
    cfg.write_text(
        f"backend: synthetic\nprompts:\n  meta: {meta}\nbench:\n  disable_shuffle: true\n"
        f"wer:\n  language: zh\n  asr_model: base\n  num_prompts: 4\n"
        f"  history_dir: {tmp_path / 'history'}\n  cache_dir: {tmp_path / 'cache'}\n"
    )

    def backend(cfg):  # piper.length_scale != 1 drops each text's last ideograph
        return TextCodeBackend(traditional=True, drop_last_word=cfg.piper.length_scale != 1.0)

    monkeypatch.setattr("tts_bench.backends.make_backend", backend)
    monkeypatch.setattr(runner, "make_transcriber", TextCodeTranscriber)
    monkeypatch.setattr(runner, "describe_asr", fake_provenance)
    return tmp_path, cfg


def test_a_chinese_set_is_scored_as_cer_with_traditional_transcripts_simplified(zh_world):
    tmp_path, cfg = zh_world
    result = _wer(["--config", str(cfg)], tmp_path)
    assert result.return_value == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["metric"], doc["language"]) == ("cer", "zh")
    base = doc["arms"]["base"]
    assert base["metric"] == "cer" and base["completed"] == 4 and base["mean_wer"] == 0.0
    assert base["mean_wer_seedtts_ci95"] == [0.0, 0.0]
    assert doc["paired"]["metric"] == "cer" and doc["verdict"] == "pass"


def test_a_degraded_chinese_arm_shows_cer_and_delta_cer(zh_world):
    tmp_path, cfg = zh_world
    result = _invoke(["wer", "--config", str(cfg), "--test-set", "piper.length_scale=1.2",
                      "--result-dir", str(tmp_path / "runs"), "--format", "md"])
    assert result.return_value == 4, result.output
    out = result.stdout
    assert "seed-tts CER (zh)" in out and "mean CER" in out and "CER (empty = 1)" in out
    assert "ΔCER" in out and "WER" not in out
    # each text lost one of its 9, 8, 8 and 5 ideographs: mean CER (1/9 + 1/8 + 1/8 + 1/5) / 4
    assert f"{100 * (1 / 9 + 1 / 8 + 1 / 8 + 1 / 5) / 4:.2f}%" in out


def test_an_english_only_asr_model_is_refused_for_a_chinese_set(zh_world):
    tmp_path, cfg = zh_world
    result = _wer(["--config", str(cfg), "--asr-model", "tiny.en"], tmp_path)
    assert isinstance(result.exception, ConfigError) and "English-only" in str(result.exception)


def test_wer_params_refuse_english_only_choices_for_chinese():
    with pytest.raises(ValueError, match="use wer.asr_model: base"):
        WerParams(language="zh")  # the default asr_model is tiny.en
    with pytest.raises(ValueError, match="use wer.normalizer: seed-tts"):
        WerParams(language="zh", asr_model="base", normalizer="whisper")
    assert WerParams(language="zh", asr_model="base").language == "zh"


def _entry(metric: str, language: str) -> HistoryEntry:
    return HistoryEntry("h.json", "2026-12-04", "base", "abc", {"backend": "x"}, "seed-tts",
                        [{"request_id": "u1", "wer": 0.5}], metric, language)


def test_history_keeps_cer_and_wer_apart():
    assert find_reference([_entry("cer", "zh")], "abc", {"backend": "x"}, "seed-tts", metric="cer") is not None
    with pytest.raises(InvalidRunError, match="recorded as CER"):
        find_reference([_entry("cer", "zh")], "abc", {"backend": "x"}, "seed-tts", metric="wer")
    assert find_reference([_entry("wer", "en")], "abc", {"backend": "x"}, "seed-tts", metric="cer",
                          refuse=False) is None


def test_an_accepted_chinese_run_records_its_metric_and_is_its_own_reference(zh_world):
    tmp_path, cfg = zh_world
    assert _wer(["--config", str(cfg), "--accept"], tmp_path).return_value == 0
    (record,) = (tmp_path / "history").glob("*.json")
    doc = json.loads(record.read_text(encoding="utf-8"))
    assert (doc["metric"], doc["language"]) == ("cer", "zh")
    assert {h.metric for h in load_history(tmp_path / "history")} == {"cer"}
    again = json.loads(_wer(["--config", str(cfg)], tmp_path).stdout)
    assert [h["metric"] for h in again["history"]] == ["cer", "cer"]


def test_old_history_records_read_as_english_wer(tmp_path):
    from tts_bench.wer.score import ArmScore

    arm = ArmScore("base", 1, 1, {}, 0.0, 0.0, 0.0, 0.0, 0, 0, 1.0, 0.0, [])
    path = write_history(tmp_path, arms=[arm], tts_hashes={"base": "abc"}, asr={}, normalizer="seed-tts",
                         run_path="r", config_hashes={})
    doc = json.loads(path.read_text())
    assert doc["metric"] == "wer"
    doc.pop("metric"), doc.pop("language")
    path.write_text(json.dumps(doc))
    assert [(h.metric, h.language) for h in load_history(tmp_path)] == [("wer", "en")]


def test_prompt_advice_ignores_history_of_the_other_metric(tmp_path):
    rows = [{"request_id": f"u{i}", "wer": 0.9 * (i % 2)} for i in range(20)]
    wer_history = [HistoryEntry(f"{k}.json", "t", "base", "abc", {}, "seed-tts", rows) for k in (2, 1)]
    params = WerParams(language="zh", asr_model="base", history_dir=str(tmp_path))
    advice = prompt_advice(params, 40, available=50, history=wer_history)
    assert "ΔCER" in advice.line() and "no CER history yet" in advice.source
    english = prompt_advice(WerParams(history_dir=str(tmp_path)), 40, available=50, history=wer_history)
    assert "history 2.json" in english.source  # the English run reads the WER history


def test_the_perf_gate_labels_a_folded_in_run_by_its_metric():
    from tts_bench.gate.judge import _accuracy

    cer = {"verdict": "regression", "reasons": ["test vs base: non-inferiority: ΔCER +4.00 points"], "metric": "cer"}
    assert _accuracy(cer, []) == ["cer: test vs base: non-inferiority: ΔCER +4.00 points"]
    invalid: list[str] = []
    _accuracy({"verdict": "invalid", "reasons": [], "metric": "cer"}, invalid)
    assert invalid == ["cer: invalid CER run"]
    assert _accuracy({"verdict": "regression", "reasons": ["x"]}, []) == ["wer: x"]  # older runs: WER


@pytest.mark.slow
def test_shipped_zh_config_runs_end_to_end_on_cpu(tmp_path):
    """configs/wer/seed-tts-zh.yaml as shipped: the tiny embedded runner speaks two Chinese
    prompts, Whisper base transcribes them in Chinese, CER per arm with its interval (~100%:
    random weights do not speak)."""
    pytest.importorskip("faster_whisper")
    pytest.importorskip("zhconv")
    result = _invoke(["wer", "--config", str(ROOT / "configs/wer/seed-tts-zh.yaml"), "--num-prompts", "2",
                      "--set", f"wer.cache_dir={tmp_path / 'cache'}",
                      "--result-dir", str(tmp_path / "runs"), "--format", "json"])
    assert result.return_value == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["metric"], doc["language"]) == ("cer", "zh")
    assert doc["asr"]["model"] == "base" and doc["asr"]["language"] == "zh"
    for arm in doc["arms"].values():
        assert arm["total"] == 2 and arm["failures"]["request_failed"] == 0 and arm["failures"]["no_audio"] == 0
        assert arm["mean_wer_seedtts"] is not None and arm["mean_wer_seedtts_ci95"] is not None
    assert Path(doc["run"]).is_dir()
