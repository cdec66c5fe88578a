"""The runner end to end on the tiny config with the real talker and token2wav (CPU).

Two fresh runners with the same seeds must produce byte-identical codec tokens and audio for
every request, with two requests in flight at once on two replicas (one each).

Why one request per replica: token2wav's audio for a chunk currently depends on what else that
replica decoded before and beside it (a per-process HiFT noise generator; batch composition), and
batch composition follows timing. Codes do not: the talker samples each row from its own
seeded generator. One request per replica keeps each replica's decode history fixed, so the
check is about the runner (routing, seeds, ordering), not about batch-invariant decoding.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from stages.config import StageConfig
from stages.runner import ChunkReady, RequestError, RunnerRequest, StageRunner
from tts_bench.config.loader import load_dataclass, load_yaml_file

TINY = Path(__file__).resolve().parents[2] / "configs/stages/minicpmo45-tiny.yaml"
TEXTS = {
    "e2e-0": ("A small boat drifted slowly across the calm grey lake.", 7),
    "e2e-1": ("Please close the window before the rain starts.", 11),
}


def tiny_cpu_config() -> StageConfig:
    cfg = load_dataclass(StageConfig, load_yaml_file(TINY), source=str(TINY), base_dir=TINY.parent)
    return dataclasses.replace(cfg, runner=dataclasses.replace(cfg.runner, device="cpu"))


def run_once(cfg: StageConfig) -> dict[str, tuple[list[int], bytes, int]]:
    """request id -> (codes, audio bytes, chunk count) from a fresh 1 + 2 process runner."""
    runner = StageRunner(cfg, replicas=2)
    runner.start()
    events: dict[str, list] = {rid: [] for rid in TEXTS}
    ended = {rid: threading.Event() for rid in TEXTS}

    def sink(rid):
        def on_event(event):
            events[rid].append(event)
            if isinstance(event, RequestError) or event.last_chunk:
                ended[rid].set()
        return on_event

    try:
        replicas = [runner.submit(RunnerRequest(rid, text, seed=seed), sink(rid))
                    for rid, (text, seed) in TEXTS.items()]
        assert replicas == [0, 1]
        for rid in TEXTS:
            assert ended[rid].wait(180), f"{rid} did not finish"
    finally:
        runner.stop()
    out = {}
    for rid, evs in events.items():
        assert all(isinstance(e, ChunkReady) for e in evs), evs[-1]
        codes = [c for e in evs for c in e.codes]
        audio = np.concatenate([e.audio for e in evs])
        assert audio.dtype == np.float32
        out[rid] = (codes, audio.tobytes(), len(evs))
    return out


@pytest.mark.slow
def test_runs_with_the_same_seed_are_byte_identical_as_processes_threads_or_one_process():
    cfg = tiny_cpu_config()
    # One intra-op thread everywhere: a CPU kernel's bits may depend on its thread count, and
    # the modes split the cores over different numbers of processes.
    cfg = dataclasses.replace(cfg, runner=dataclasses.replace(cfg.runner, torch_threads=1))
    t0 = time.perf_counter()
    first, *others = (run_once(dataclasses.replace(cfg, runner=dataclasses.replace(cfg.runner, execution=e)))
                      for e in ("processes", "threads", "single"))
    assert time.perf_counter() - t0 < 600
    for rid in TEXTS:
        codes, audio, chunks = first[rid]
        for other in others:
            assert codes == other[rid][0], rid
            assert audio == other[rid][1], rid
        # The length model gives 10 codes per word; a payload carries 25 of them.
        words = len(TEXTS[rid][0].split())
        assert len(codes) == max(cfg.talker.sampling.min_tokens, 10 * words)
        assert chunks == len(codes) // cfg.code2wav.codec_chunk_frames + 1
        assert len(audio) > 0
    # Different seeds give different codes.
    assert first["e2e-0"][0] != first["e2e-1"][0]


@pytest.mark.gpu
def test_tiny_runner_on_cuda_streams_audio_and_reports_allocator_memory():
    cfg = tiny_cpu_config()
    cfg = dataclasses.replace(cfg, runner=dataclasses.replace(cfg.runner, device="cuda"))
    runner = StageRunner(cfg, replicas=2)
    runner.start()
    try:
        done = threading.Event()
        events = []

        def on_event(event):
            events.append(event)
            if isinstance(event, RequestError) or event.last_chunk:
                done.set()

        runner.submit(RunnerRequest("gpu-0", TEXTS["e2e-0"][0], seed=7), on_event)
        assert done.wait(120)
        memory = runner.memory_snapshot()
    finally:
        runner.stop()
    assert all(isinstance(e, ChunkReady) for e in events), events[-1]
    assert sum(len(e.codes) for e in events) == 10 * len(TEXTS["e2e-0"][0].split())
    # talker + the replicas' process(es): 1 with replicas as threads, else one per replica
    assert [m["source"] for m in memory] == ["cuda-allocator"] * len(runner.pids())
    assert all(m["peak_bytes"] > 0 for m in memory)


@pytest.mark.gpu
@pytest.mark.parametrize("execution, talker_sms", [
    ("processes", 0), ("threads", 0), ("single", 0), ("single", 16)])
def test_graph_warmup_captures_before_ready_so_a_request_only_replays(execution, talker_sms):
    from stages.runner.work import work_delta

    cfg = tiny_cpu_config()
    code2wav = dataclasses.replace(cfg.code2wav, extra={**cfg.code2wav.extra, "code2wav_device_graph": True})
    cfg = dataclasses.replace(cfg, code2wav=code2wav, runner=dataclasses.replace(
        cfg.runner, device="cuda", execution=execution, talker_sms=talker_sms))
    runner = StageRunner(cfg, replicas=2)
    runner.start()
    try:
        warmups = {name: i["code2wav"].get("graph_warmup") for name, i in runner.replica_info().items()}
        assert set(warmups) == {"code2wav-0", "code2wav-1"}
        # 1..max_num_seqs rows, at least a first and a settled shape each
        assert all(w and w["captured"] >= 2 * cfg.runner.max_num_seqs for w in warmups.values()), warmups
        if talker_sms:  # the talker on its SMs, every replica on the SMs it leaves
            split = runner.info["stages"]["sm_partition"]
            assert split["reserved_sms"] >= talker_sms and split["partition_sms"] > 0
            assert all(i["partition_sms"] == split["partition_sms"] for i in runner.replica_info().values())
        before = runner.work_snapshot()
        done, events = threading.Event(), []

        def on_event(event):
            events.append(event)
            if isinstance(event, RequestError) or event.last_chunk:
                done.set()

        replica = runner.submit(RunnerRequest("warm-0", TEXTS["e2e-0"][0], seed=7), on_event)
        assert done.wait(120)
        # The replica counts its last decode after sending it: until it has counted every chunk
        # (a condition; a 0.5 s sleep could end first on a loaded machine).
        deadline = time.monotonic() + 120
        while True:
            work = {w["stage"]: w for w in work_delta(before, runner.work_snapshot())}
            if work[f"code2wav-{replica}"]["rows"] >= len(events) or time.monotonic() > deadline:
                break
            time.sleep(0.02)
    finally:
        runner.stop()
    assert all(isinstance(e, ChunkReady) for e in events), events[-1]
    served = work[f"code2wav-{replica}"]
    # one row a chunk, every shape seen at warmup: no capture, a replay per non-final chunk
    assert served["graph_captures"] == 0
    assert served["graph_replays"] == len(events) - 1 > 0


@pytest.mark.gpu
def test_the_talker_and_replicas_on_sm_partitions_give_the_same_codes_and_audio_as_on_the_whole_device():
    cfg = tiny_cpu_config()
    code2wav = dataclasses.replace(cfg.code2wav, extra={**cfg.code2wav.extra, "code2wav_device_graph": True})
    runner = dataclasses.replace(cfg.runner, device="cuda", execution="single", torch_threads=1)
    cfg = dataclasses.replace(cfg, code2wav=code2wav, runner=runner)
    whole = run_once(cfg)
    parted = run_once(dataclasses.replace(cfg, runner=dataclasses.replace(runner, talker_sms=16)))
    for rid in TEXTS:
        assert parted[rid][0] == whole[rid][0], rid  # codes
        assert parted[rid][1] == whole[rid][1], rid  # audio bytes
