"""Request-level faults stay request-level: a request the talker cannot take, or whose admission
fails inside a step, fails alone; the engine and the talker process keep serving the others.

(`tts-bench serve` with `{"input": "hello", "seed": 1180591620717411303424}` used to overflow
`manual_seed` inside the talker's step: the process died and every later request got a 500.)"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest
import torch

from stages.config import StageConfig
from stages.runner import ChunkReady, RequestError, RunnerRequest, StageRunner
from stages.talker.config import TalkerConfig
from stages.talker.engine import TalkerEngine, TalkerRequest, TalkerRequestError
from stages.talker.length import cache_positions
from tts_bench.config.loader import load_dataclass, load_yaml_file

TINY = Path(__file__).resolve().parents[2] / "configs/stages/minicpmo45-tiny.yaml"
TEXT = "A small boat drifted slowly across the calm grey lake."


def tiny_talker() -> TalkerConfig:
    return TalkerConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4,
                        intermediate_size=128, llm_dim=64)


def engine(**kw) -> TalkerEngine:
    kw = {"max_batch": 4, "max_seq_len": 256, **kw}
    return TalkerEngine(tiny_talker(), device=torch.device("cpu"), dtype=torch.float32, **kw)


def run(eng: TalkerEngine) -> dict[str, list]:
    outputs: dict[str, list] = {}
    while eng.has_work():
        for out in eng.step():
            outputs.setdefault(out.request_id, []).append(out)
    return outputs


@pytest.mark.parametrize("seed", [2**63, 1180591620717411303424, -1])
def test_a_seed_a_generator_cannot_take_is_refused_at_add_as_the_requests_fault(seed):
    eng = engine()
    with pytest.raises(TalkerRequestError, match=r"seed must be an integer in \[0, 2\*\*63\)") as info:
        eng.add(TalkerRequest("bad", TEXT, seed=seed, max_codes=5))
    assert info.value.request_fault
    eng.add(TalkerRequest("good", TEXT, seed=2**63 - 1, max_codes=5))
    assert len([o for o in run(eng)["good"] if not o.finished]) == 5


def test_an_admission_that_fails_inside_step_fails_that_request_alone(monkeypatch):
    eng = engine()
    prefill = eng._prefill

    def flaky(slot, prep):
        if prep.request.request_id == "bad":
            raise RuntimeError("prefill blew up")
        return prefill(slot, prep)

    monkeypatch.setattr(eng, "_prefill", flaky)
    for rid in ("a", "bad", "b"):
        eng.add(TalkerRequest(rid, TEXT, seed=3, max_codes=8))
    outputs = run(eng)
    (failed,) = outputs["bad"]
    assert failed.finished and failed.code is None and "RuntimeError: prefill blew up" in failed.error
    for rid in ("a", "b"):
        assert [o.error for o in outputs[rid]] == [None] * 9 and outputs[rid][-1].finished
    assert not any(s is not None for s in eng._slots)  # every slot free again


def test_cache_positions_agree_with_what_the_engine_refuses():
    eng = engine(max_seq_len=128)
    for words in (1, 5, 11, 12, 30):
        text = " ".join(["word"] * words)
        needed = cache_positions(text, eng.cfg)
        if needed > 128:
            with pytest.raises(TalkerRequestError, match="max_seq_len"):
                eng.add(TalkerRequest(f"w{words}", text))
        else:
            eng.add(TalkerRequest(f"w{words}", text))


def test_the_real_talker_process_survives_a_seed_that_overflows():
    cfg = load_dataclass(StageConfig, load_yaml_file(TINY), source=str(TINY), base_dir=TINY.parent)
    cfg = dataclasses.replace(cfg, runner=dataclasses.replace(cfg.runner, device="cpu", torch_threads=1))
    runner = StageRunner(cfg, replicas=1)
    runner.start()
    try:
        events: dict[str, list] = {"bad": [], "good": []}
        done = {rid: threading.Event() for rid in events}

        def collect(rid):
            def on_event(event):
                events[rid].append(event)
                if isinstance(event, RequestError) or event.last_chunk:
                    done[rid].set()
            return on_event

        runner.submit(RunnerRequest("bad", "hello", seed=1180591620717411303424), collect("bad"))
        assert done["bad"].wait(60)
        (err,) = events["bad"]
        assert isinstance(err, RequestError) and err.kind == "invalid_request"
        assert "seed must be" in err.message
        runner.submit(RunnerRequest("good", TEXT, seed=1, max_codes=30), collect("good"))
        assert done["good"].wait(60)
        assert isinstance(events["good"][-1], ChunkReady) and events["good"][-1].last_chunk
        assert runner.broken is None and set(runner.alive()) == {"talker", "code2wav-0"}
    finally:
        runner.stop()
