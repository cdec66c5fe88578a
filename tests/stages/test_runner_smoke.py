"""scripts/runner_smoke.py with `--fake-talker`: stage 2 alone, real code2wav replicas in real
processes, fed by the tests' fake talker (the isolation used to look for the replica faults of
code2wav device graphs on an H200)."""

from __future__ import annotations

from functools import partial

from scripts._stages import prompt_voices, tiny_stages
from scripts.runner_smoke import run_tier
from stages.runner.factories import StageFactories
from stages.runner.fakes import FakeTalker, FakeTalkerRequest


def test_fake_talker_feeds_real_replicas_with_voices():
    cfg = tiny_stages()
    voices = prompt_voices()
    assert len(voices) >= 2
    factories = StageFactories(talker=partial(FakeTalker, step_s=0.0), talker_request=FakeTalkerRequest)
    res = run_tier(cfg, 3, 2, 4, factories=factories, voices=voices, max_codes=(30, 60))
    assert res["completed"] == 4 and res["failed"] == 0, res["errors"]
    # the fake talker's 30-60 codes a request all came back, as at least 1/25 s of audio each
    assert 4 * 30 <= res["codes"] <= 4 * 60
    assert res["audio_seconds"] >= res["codes"] / cfg.code2wav.token_rate_hz
    replicas = [m for m in res["memory"] if m["process"].startswith("code2wav")]
    assert len(replicas) == 2
    # the default voice plus the request voices each replica saw (built from their audio)
    assert sum(m["prompt_cache_entries"] for m in replicas) >= 2 + min(len(voices), 4)
    assert res["processes"]["code2wav-0"]["code2wav"]["device_graph"] is False  # CPU: eager
    work = {w["stage"]: w for w in res["work"]}
    assert list(work) == ["talker", "code2wav-0", "code2wav-1"]
    stage2 = [work["code2wav-0"], work["code2wav-1"]]
    # every payload decoded, one row each: per request n // 25 full payloads and the final flush
    rows = sum(w["rows"] for w in stage2)
    assert 4 + (res["codes"] - 4 * 24) // 25 <= rows <= 4 + res["codes"] // 25
    for w in stage2:  # the real engine's counters: a chunk group per batch shape, no graphs
        assert w["groups"] >= w["steps"] > 0 and w["graph_captures"] == w["graph_replays"] == 0
        assert 0 < w["busy"] <= 1


def test_a_tier_with_a_trace_window_keeps_its_summary_and_writes_the_trace(tmp_path):
    from scripts.runner_smoke import TraceWindow

    factories = StageFactories(talker=partial(FakeTalker, step_s=0.01), talker_request=FakeTalkerRequest)
    window = TraceWindow(after_s=0.2, seconds=0.3, path=tmp_path / "trace_2x1.json.gz")
    res = run_tier(tiny_stages(), 2, 1, 2, factories=factories, max_codes=(60, 80), trace=window)
    assert res["completed"] == 2, res["errors"]
    assert res["trace"]["steps"] > 0 and res["trace"]["trace"] == str(window.path)
    assert window.path.stat().st_size > 0


def test_out_none_means_stdout_only_as_the_measuring_scripts_say(monkeypatch, tmp_path, capsys):
    import argparse

    from scripts._report import add_out, emit

    monkeypatch.chdir(tmp_path)
    for argv, env in ((["--out", "none"], None), ([], "none"), ([], ""), (["--out", "NONE"], str(tmp_path / "x"))):
        if env is None:
            monkeypatch.delenv("OUT", raising=False)
        else:
            monkeypatch.setenv("OUT", env)
        ap = argparse.ArgumentParser()
        add_out(ap)
        out = ap.parse_args(argv).out
        assert out is None, (argv, env)
        emit({"figure": 1}, out, "bench")
        assert capsys.readouterr().out.strip() == '{"figure": 1}'
    assert list(tmp_path.iterdir()) == []  # no folder called "none" (or anything else) was made
    monkeypatch.setenv("OUT", str(tmp_path / "res"))
    ap = argparse.ArgumentParser()
    add_out(ap)
    emit({"figure": 2}, ap.parse_args([]).out, "bench")
    assert (tmp_path / "res" / "bench.json").read_text().startswith("{")
