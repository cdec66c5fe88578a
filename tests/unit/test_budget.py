"""The memory preflight: the stage budget from the config alone, checked before any stage
process starts (`stages.runner.budget`, `tts_bench.preflight`)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stages.runner.budget import code2wav_params, estimate_stage_memory, talker_params
from tts_bench.config import BenchConfig, Tier, load_config
from tts_bench.errors import ConfigError, ExitStatus
from tts_bench.preflight import check_arms, check_memory

ROOT = Path(__file__).resolve().parents[2]
GIB = 2**30
TINY, FULL = "configs/stages/minicpmo45-tiny.yaml", "configs/stages/minicpmo45.yaml"


def stages(path: str, *sets: str):
    return load_config(None, [f"stages={path}", *sets]).stages


def built_params(cfg) -> tuple[int, int]:
    from stages.code2wav.campplus import CAMPPlus
    from stages.code2wav.flow import FlowModel
    from stages.code2wav.hift import HiFTGenerator
    from stages.talker.model import TalkerModel

    def count(m):
        return sum(p.numel() for p in m.parameters())

    with torch.device("meta"):  # shapes only: the full model costs no memory here
        talker = TalkerModel(cfg.talker)
        c2w = [FlowModel(cfg.code2wav), HiFTGenerator(cfg.code2wav.hift), CAMPPlus(cfg.code2wav.speaker)]
    return count(talker), sum(count(m) for m in c2w)


@pytest.mark.parametrize("path", [TINY, FULL])
def test_parameter_counts_match_the_built_modules(path):
    cfg = stages(path)
    talker, c2w = built_params(cfg)
    assert talker_params(cfg.talker) == talker  # exact
    assert code2wav_params(cfg.code2wav) == pytest.approx(c2w, rel=0.05)  # dominant terms


def test_the_full_default_kv_cache_on_a_cpu_is_what_the_oom_killer_saw():
    budget = estimate_stage_memory(BenchConfig().stages, replicas=2, concurrency=4, device_type="cpu")
    kv = next(i for i in budget.items if i.name == "talker KV cache")
    assert kv.bytes == 2 * 20 * 128 * 4096 * 768 * 4  # 20 layers x 128 slots x 4096 positions, fp32
    assert budget.total("host") == budget.total("device") > 60 * GIB
    tiny = estimate_stage_memory(stages(TINY), replicas=2, concurrency=4, device_type="cpu")
    assert 0.5 * GIB < tiny.total("host") < 2 * GIB  # measured: ~0.3 GiB RSS per stage process


def test_full_size_128x8_fits_an_h200_as_measured():
    # D-BUDGET-1: the default (replica processes, chunk graphs,
    # expandable segments) ran 128x8 there; torch-allocated peak summed over the 9 processes
    # 102.6 GiB, reserved 115.0 GiB plus 9 device contexts, of 139.8 GiB. With the final-chunk
    # graphs too (D-GRAPH-6) NVML read 121.6 GiB in use, and the H200 had 139.3 GiB free before the
    # run. The estimate must sit above the allocated peak and below what a fresh H200 has free.
    budget = estimate_stage_memory(stages(FULL), replicas=8, concurrency=128, device_type="cuda")
    assert 103 * GIB < budget.total("device") < 138 * GIB
    assert budget.total("host") < 20 * GIB  # only processes and the fp32 build on the host
    # Without the graphs it is below the eager runner's NVML reading there (~131 GiB in use).
    eager = estimate_stage_memory(stages(FULL, "code2wav.extra.code2wav_device_graph=false"), replicas=8,
                                  concurrency=128, device_type="cuda")
    assert 88 * GIB < eager.total("device") < 131 * GIB


def test_more_concurrency_and_longer_caches_need_more():
    cfg = stages(FULL)
    small = estimate_stage_memory(cfg, replicas=1, concurrency=2, device_type="cuda").total("device")
    more_c = estimate_stage_memory(cfg, replicas=1, concurrency=64, device_type="cuda").total("device")
    longer = estimate_stage_memory(stages(FULL, "runner.max_seq_len=4096"), replicas=1, concurrency=2,
                                   device_type="cuda").total("device")
    bf16 = estimate_stage_memory(stages(FULL, "runner.dtype=bfloat16"), replicas=1, concurrency=2,
                                 device_type="cuda").total("device")
    assert more_c > small and longer > small and bf16 < small


def test_over_budget_is_an_exit_2_error_naming_bytes_and_keys(monkeypatch):
    import stages.platform

    monkeypatch.setattr(stages.platform, "host_available_bytes", lambda: 4 * GIB)
    cfg = load_config(None, [f"stages={FULL}", "runner.device=cpu"])
    with pytest.raises(ConfigError) as info:
        check_memory(cfg, replicas=2, concurrency=4, label="arm 'base' at tier 4x2")
    msg = str(info.value)
    assert info.value.exit_status == ExitStatus.USAGE
    assert "arm 'base' at tier 4x2" in msg and "of host memory" in msg and "bytes" in msg
    assert "4.0 GiB (4,294,967,296 bytes) is free" in msg
    assert "talker KV cache" in msg and "runner.talker_max_batch" in msg and "runner.max_seq_len" in msg
    assert "minicpmo45-tiny.yaml" in msg and "TTS_BENCH_SKIP_MEMORY_CHECK=1" in msg
    check_memory(load_config(None, [f"stages={TINY}", "runner.device=cpu"]), replicas=2,
                 concurrency=4, label="tiny")  # fits in 4 GiB
    monkeypatch.setenv("TTS_BENCH_SKIP_MEMORY_CHECK", "1")
    check_memory(cfg, replicas=2, concurrency=4, label="skipped")


def test_on_cuda_the_device_free_memory_is_checked(monkeypatch):
    import stages.platform

    monkeypatch.setattr(stages.platform, "resolve_device", lambda kind: torch.device("cuda", 0))
    monkeypatch.setattr(stages.platform, "free_memory_bytes", lambda device: 80 * GIB)
    monkeypatch.setattr(stages.platform, "host_available_bytes", lambda: 500 * GIB)
    cfg = load_config(None, [f"stages={FULL}"])
    check_arms({"base": cfg}, [Tier(32, 1)])
    with pytest.raises(ConfigError, match=r"arm 'base' at tier 128x8 need about .* of cuda device memory"):
        check_arms({"base": cfg}, [Tier(32, 1), Tier(128, 8)])


def test_the_device_check_counts_the_graph_pool_of_the_allocator_in_force(monkeypatch):
    # The estimate at 128x8 with expandable segments (the runner's choice) and with a user's own
    # allocator setting without them; a card with free memory between the two runs the first only.
    import stages.platform

    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    cfg = load_config(None, [f"stages={FULL}"])
    ours, theirs = (estimate_stage_memory(cfg.stages, replicas=8, concurrency=128, device_type="cuda",
                                          expandable_segments=e).total("device") for e in (True, False))
    assert theirs > ours
    monkeypatch.setattr(stages.platform, "resolve_device", lambda kind: torch.device("cuda", 0))
    monkeypatch.setattr(stages.platform, "free_memory_bytes", lambda device: (ours + theirs) // 2)
    monkeypatch.setattr(stages.platform, "host_available_bytes", lambda: 500 * GIB)
    check_arms({"base": cfg}, [Tier(128, 8)])
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # theirs, the same
    check_arms({"base": cfg}, [Tier(128, 8)])
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.8")
    with pytest.raises(ConfigError, match="code2wav device graphs"):
        check_arms({"base": cfg}, [Tier(128, 8)])


def test_other_backends_are_not_checked(monkeypatch):
    import stages.platform

    monkeypatch.setattr(stages.platform, "host_available_bytes", lambda: 0)
    check_memory(load_config(None, ["backend=synthetic"]), replicas=64, concurrency=4096, label="x")


def test_the_embedded_backend_refuses_to_start_what_cannot_fit():
    from tts_bench.backends.embedded import EmbeddedBackend

    cfg = load_config(None, [f"stages={TINY}", "runner.device=cpu", "runner.talker_max_batch=10000000"])
    with pytest.raises(ConfigError, match="talker KV cache"):
        asyncio.run(EmbeddedBackend(cfg).start(1))


def test_ab_over_budget_exits_2_before_the_run_directory_exists(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "tts_bench.cli", "ab", "--set", "runner.talker_max_batch=10000000",
         "--tiers", "1x1", "--result-dir", str(tmp_path / "runs")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "memory preflight" in proc.stderr and "runner.talker_max_batch" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()


def test_code2wav_device_graphs_count_their_pool_on_a_gpu_only():
    # D-BUDGET-1: with expandable segments each replica held 1.90-2.09 GB
    # reserved beyond its allocated memory at 8 rows a decode (graph pool and eager transient);
    # the two estimates together must cover that, and the graphs are 0.25 of a request's state a row.
    cfg_on = stages(FULL, "code2wav.extra.code2wav_device_graph=true")
    on = estimate_stage_memory(cfg_on, replicas=1, concurrency=16, device_type="cuda")
    off = estimate_stage_memory(stages(FULL, "code2wav.extra.code2wav_device_graph=false"), replicas=1,
                                concurrency=16, device_type="cuda")
    graphs = next(i for i in on.items if i.name == "code2wav device graphs")
    transient = next(i for i in on.items if i.name == "code2wav decode transient")
    assert 2.09e9 < graphs.bytes + transient.bytes < 3.0e9
    assert 1000 * 2**20 < graphs.bytes < 1400 * 2**20
    # A user's own allocator setting without expandable segments gets the pool measured with the
    # default segments back (2,192 MiB at 8 rows on an H200).
    default_segments = estimate_stage_memory(cfg_on, replicas=1, concurrency=16, device_type="cuda",
                                             expandable_segments=False)
    pool = next(i for i in default_segments.items if i.name == "code2wav device graphs")
    assert 2192 * 2**20 < pool.bytes < 2600 * 2**20
    finals = next(i for i in on.items if i.name == "code2wav final-chunk graphs")  # graphs too (D-GRAPH-6)
    assert on.total("device") - off.total("device") == graphs.bytes + finals.bytes
    assert all(i.name != "code2wav device graphs" for i in off.items)
    cpu = estimate_stage_memory(cfg_on, replicas=1, concurrency=16, device_type="cpu")
    assert all(i.name != "code2wav device graphs" for i in cpu.items)
    eight = estimate_stage_memory(cfg_on, replicas=8, concurrency=128, device_type="cuda")
    assert next(i for i in eight.items if i.name == "code2wav device graphs").bytes == 8 * graphs.bytes


def test_final_chunk_graphs_count_per_replica_on_a_gpu_when_warmed():
    """75 one-row final graphs a replica at full size (3 stages x 25 counts of new codes, what
    the warmup captures; one stage more after a shorter first chunk), 4 MiB each (3.0 MiB
    measured, D-GRAPH-6), only where they are captured: a GPU, graphs and their warmup on."""
    from stages.runner.budget import FINAL_GRAPH_BYTES, final_graphs

    name = "code2wav final-chunk graphs"
    eight = estimate_stage_memory(stages(FULL), replicas=8, concurrency=128, device_type="cuda")
    item = next(i for i in eight.items if i.name == name)  # on by default
    assert final_graphs(stages(FULL).code2wav) == 75 and item.bytes == 8 * 75 * FINAL_GRAPH_BYTES
    # NVML at 128x8 on an H200: 124,521 MiB with them, 122,717 without (1,804 MiB for 600)
    assert 1804 * 2**20 < item.bytes < 3 * GIB
    assert "code2wav.extra.code2wav_final_chunk_graphs=false" in item.keys
    shorter = stages(FULL, "code2wav.initial_codec_chunk_frames=10")
    assert final_graphs(shorter.code2wav) == 100
    off = "code2wav.extra.code2wav_final_chunk_graphs=false"
    without = estimate_stage_memory(stages(FULL, off), replicas=8, concurrency=128, device_type="cuda")
    assert eight.total("device") - without.total("device") == item.bytes
    assert all(i.name != name for i in without.items)
    for cfg, device in ((stages(FULL), "cpu"), (stages(FULL, "code2wav.extra.code2wav_graph_warmup=false"), "cuda"),
                        (stages(FULL, "code2wav.extra.code2wav_device_graph=false"), "cuda")):
        budget = estimate_stage_memory(cfg, replicas=8, concurrency=128, device_type=device)
        assert all(i.name != name for i in budget.items), device


def test_a_replica_pool_holds_its_share_of_the_tier_not_two_batches():
    from stages.runner.budget import pool_slots

    assert pool_slots(16, 16) == 16  # 128x8 with 16-row batches: 16 requests live a replica
    assert pool_slots(8, 32) == 32 and pool_slots(8, 1) == 1
    assert pool_slots(8, 0) == 16  # concurrency unknown (serve): two batches up front
    # The estimate follows: more rows a batch at the same tier adds no request state.
    m8, m16 = (estimate_stage_memory(stages(FULL, f"runner.max_num_seqs={m}"), replicas=8, concurrency=128,
                                     device_type="cuda") for m in (8, 16))
    state = [next(i.bytes for i in b.items if i.name == "code2wav request state") for b in (m8, m16)]
    assert state[0] == state[1]
    # A request stays on its replica after the talker has finished generating it, so the
    # replica's share comes from C, not from what runner.talker_max_batch admits at a time.
    capped = estimate_stage_memory(stages(FULL, "runner.talker_max_batch=32"), replicas=8, concurrency=128,
                                   device_type="cuda")
    assert next(i.bytes for i in capped.items if i.name == "code2wav request state") == state[0]


def test_replica_hosts_share_modules_and_device_contexts_per_process():
    from stages.config import replica_groups

    assert replica_groups("processes", 8, 1) == [(r,) for r in range(8)]
    assert replica_groups("processes", 8, 2) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert replica_groups("processes", 5, 2) == [(0, 1), (2, 3), (4,)]
    assert replica_groups("processes", 2, 4) == [(0, 1)]
    assert replica_groups("threads", 8, 1) == [tuple(range(8))]
    assert replica_groups("single", 8, 1) == []

    def items(*sets, replicas=8):
        budget = estimate_stage_memory(stages(FULL, *sets), replicas=replicas, concurrency=128, device_type="cuda")
        return {i.name: i.bytes for i in budget.items}

    one, two, four = (items(f"runner.replicas_per_process={k}") for k in (1, 2, 4))
    weights = one["code2wav weights"] // 8  # one copy of the code2wav modules
    assert [x["code2wav weights"] for x in (one, two, four)] == [8 * weights, 4 * weights, 2 * weights]
    assert [x["device contexts"] for x in (one, two, four)] == [9 * one["device contexts"] // 9,
                                                                  5 * one["device contexts"] // 9,
                                                                  3 * one["device contexts"] // 9]
    assert two["code2wav request state"] == one["code2wav request state"]  # state is per request
    # Hosts keep to one device: over [0, 1], 2 a process is 4 hosts of one device each, one copy
    # of the modules and one context each (replicas 0 and 2 share a host, not 0 and 1).
    spread = items("runner.replicas_per_process=2", "runner.devices=[0,1]")
    assert spread["code2wav weights"] == 4 * weights
    assert spread["device contexts"] == two["device contexts"]


def test_replica_hosts_group_replicas_device_by_device():
    from stages.config import replica_groups

    over_two = (0, 1) * 4  # 8 replicas round-robin over devices 0 and 1
    assert replica_groups("processes", 8, 2, over_two) == [(0, 2), (4, 6), (1, 3), (5, 7)]
    assert replica_groups("processes", 8, 4, over_two) == [(0, 2, 4, 6), (1, 3, 5, 7)]
    assert replica_groups("processes", 8, 3, over_two) == [(0, 2, 4), (6,), (1, 3, 5), (7,)]
    assert replica_groups("processes", 3, 2, (5, 2, 5)) == [(0, 2), (1,)]  # devices in order of first use
    assert replica_groups("processes", 4, 2, (0, 0, 0, 0)) == replica_groups("processes", 4, 2)
    assert replica_groups("threads", 4, 1, (0, 1, 0, 1)) == [(0, 1, 2, 3)]  # one host: the threads'
    with pytest.raises(ValueError, match="2 devices for 3 replicas"):
        replica_groups("processes", 3, 2, (0, 1))
