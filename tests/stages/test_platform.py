"""The platform layer: device choice, dtypes, graph API, memory stats, Triton, the test override."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from stages.platform import (
    PlatformError,
    dtype_from_name,
    graph_api,
    is_cuda,
    memory_stats,
    platform_override,
    resolve_device,
    synchronize,
    synchronize_stream,
    tf32_enabled,
    tf32_scope,
    triton_unavailable_reason,
)


def test_auto_picks_cpu_when_no_accelerator_is_present():
    with platform_override(cuda=False, npu=False):
        assert resolve_device("auto") == torch.device("cpu")


def test_auto_on_this_machine_matches_what_torch_reports():
    device = resolve_device("auto")
    if torch.cuda.is_available():
        assert device.type == "cuda"
    elif device.type != "npu":
        assert device == torch.device("cpu")


def test_auto_prefers_cuda_over_npu_when_forced_available():
    with platform_override(cuda=True, npu=True):
        assert resolve_device("auto") == torch.device("cuda", 0)  # constructs no tensor


def test_asking_for_a_missing_device_is_an_error_not_a_silent_cpu():
    with platform_override(cuda=False, npu=False):
        with pytest.raises(PlatformError, match="no CUDA device"):
            resolve_device("cuda")
        with pytest.raises(PlatformError, match="no Ascend NPU"):
            resolve_device("npu")
    with pytest.raises(PlatformError, match="valid: auto, cuda, npu, cpu"):
        resolve_device("gpu")


def test_override_forces_is_cuda_and_restores_it():
    cuda0 = torch.device("cuda", 0)
    assert is_cuda(cuda0)
    with platform_override(cuda=False):
        assert not is_cuda(cuda0)
        with platform_override(triton=False):
            assert not is_cuda(cuda0) and triton_unavailable_reason(cuda0) is not None
    assert is_cuda(cuda0)
    assert not is_cuda(torch.device("cpu"))


def test_dtype_names():
    assert dtype_from_name("float32") is torch.float32
    assert dtype_from_name(" BF16 ") is torch.bfloat16
    assert dtype_from_name("float16") is torch.float16
    with pytest.raises(PlatformError, match="valid: float32, bfloat16, float16"):
        dtype_from_name("float64")


def test_cpu_has_no_graph_api_and_synchronize_is_a_no_op():
    cpu = torch.device("cpu")
    assert graph_api(cpu) is None
    synchronize(cpu)


def test_cpu_memory_stats_report_process_rss():
    stats = memory_stats(torch.device("cpu"))
    assert stats["source"] == "rss"
    assert stats["rss_bytes"] > 10 * 2**20
    assert stats["allocated_bytes"] == stats["reserved_bytes"] == stats["rss_bytes"]
    assert stats["peak_bytes"] >= stats["rss_bytes"]


def test_triton_on_cpu_only_under_the_interpreter(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert triton_unavailable_reason(cpu) is not None
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert (triton_unavailable_reason(cpu) is None) == (importlib.util.find_spec("triton") is not None)


def test_triton_reasons_name_what_is_missing(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert triton_unavailable_reason(torch.device("cpu")) == "CPU without TRITON_INTERPRET=1"
    assert triton_unavailable_reason(torch.device("meta")) == "no Triton for device type 'meta'"
    with platform_override(triton=True):
        assert triton_unavailable_reason(torch.device("cpu")) is None


def test_tf32_scope_is_a_no_op_off_cuda():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    with tf32_scope(torch.device("cpu"), not before[0]):
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
        assert not tf32_enabled(torch.device("cpu"))
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


@pytest.mark.gpu
def test_tf32_scope_sets_both_flags_and_restores_them():
    dev = resolve_device("cuda")
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    with tf32_scope(dev, True):
        assert tf32_enabled(dev) and torch.backends.cudnn.allow_tf32
    with tf32_scope(dev, False):
        assert not tf32_enabled(dev) and not torch.backends.cudnn.allow_tf32
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


def test_importing_the_platform_layer_needs_torch_alone():
    # The sampling prelude and the kernel scripts use the platform layer on machines with torch
    # and triton only: psutil is imported by the memory helpers when they are called.
    code = "import sys, stages.platform, stages.talker.prelude; print('psutil' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_importing_the_platform_layer_constructs_nothing_and_skips_torch_npu():
    code = (
        "import sys, stages.platform, stages.runner, stages.config;"
        "import torch;"
        "assert 'torch_npu' not in sys.modules;"
        "assert not torch.cuda.is_initialized();"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.gpu
def test_cuda_graph_api_captures_and_replays():
    device = resolve_device("cuda")
    api = graph_api(device)
    assert api is not None and api.platform == "cuda"
    x = torch.ones(8, device=device)
    side = api.stream()
    with api.use_stream(side):
        y = x * 2
    torch.cuda.current_stream().wait_stream(side)
    graph = api.graph()
    with api.capture(graph):
        y = x * 2
    x.fill_(3.0)
    graph.replay()
    synchronize(device)
    assert torch.equal(y, torch.full((8,), 6.0, device=device))
    stats = memory_stats(device)
    assert stats["source"] == "cuda-allocator" and stats["peak_bytes"] >= stats["allocated_bytes"]


@pytest.mark.npu
def test_npu_device_and_graph_api():
    device = resolve_device("npu")
    api = graph_api(device)
    assert api is not None and api.platform == "npu"
    assert memory_stats(device)["source"] == "npu-allocator"


def test_deterministic_kernels_without_the_nan_fill_of_new_tensors(monkeypatch):
    """Deterministic algorithms on, the fill of uninitialized memory off (one extra kernel per
    torch.empty in a launch-bound replica), and decoding stays run-to-run identical."""
    from stages.code2wav.streaming import Chunker
    from stages.code2wav.token2wav import Token2Wav
    from stages.platform import deterministic_kernels
    from tests.stages.code2wav_tiny import tiny_config

    def payloads(cfg):
        gen = torch.Generator().manual_seed(0)
        chunker = Chunker(cfg, "r0", seed=3)
        return [*chunker.push(torch.randint(0, cfg.flow.vocab_size, (130,), generator=gen).tolist()), chunker.finish()]

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory,
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    try:
        torch.backends.cudnn.benchmark = True
        deterministic_kernels()
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.utils.deterministic.fill_uninitialized_memory is False
        assert torch.backends.cudnn.deterministic is True and torch.backends.cudnn.benchmark is False
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        runs = []
        for _ in range(2):
            t2w = Token2Wav(tiny_config(), device=torch.device("cpu"), dtype=torch.float32, init_seed=0)
            runs.append([out.audio for p in payloads(t2w.cfg) for out in t2w.decode([p])])
        assert all(torch.equal(torch.from_numpy(a), torch.from_numpy(b)) for a, b in zip(*runs))
        assert len(runs[0]) == len(runs[1]) >= 5
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.utils.deterministic.fill_uninitialized_memory = before[1]
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2:]


@pytest.mark.gpu
def test_a_stream_sync_beside_another_threads_capture_leaves_the_capture_intact():
    """A replica thread times its voice setup with `synchronize_stream` while another replica
    thread may be capturing: the capture must survive it (a device-wide sync broke it on an H200)."""
    import threading

    device = resolve_device("cuda")
    api = graph_api(device)
    x = torch.ones(1024, device=device)
    capturing, synced = threading.Event(), threading.Event()
    errors: list = []

    def other_replica() -> None:
        with torch.cuda.stream(torch.cuda.Stream(device=device)):
            capturing.wait(30)
            try:
                (x * 3).sum()
                synchronize_stream(device)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
            synced.set()

    thread = threading.Thread(target=other_replica)
    thread.start()
    graph, side = api.graph(), api.stream()
    side.wait_stream(torch.cuda.current_stream(device))
    with api.capture(graph, pool=api.pool(), stream=side, **api.capture_options):
        y = x * 2
        capturing.set()
        assert synced.wait(30)
    thread.join(30)
    assert not errors
    graph.replay()
    torch.cuda.synchronize(device)
    assert torch.equal(y, torch.full_like(x, 2.0))


def test_a_host_tensor_for_the_cpu_is_not_copied():
    from stages.platform.device import host_to_device

    t = torch.arange(4)
    assert host_to_device(t, torch.device("cpu")) is t


@pytest.mark.gpu
def test_cuda_host_to_device_is_queued_in_stream_order_without_waiting():
    import time

    from stages.platform.device import host_to_device

    device, n = torch.device("cuda"), 1 << 20
    host_to_device(torch.full((n,), 2.0), device)  # the caching host allocator keeps the pinned block
    torch.cuda.synchronize()
    x = torch.zeros(n, device=device)
    torch.cuda._sleep(100_000_000)  # tens of ms of device work ahead of the copy
    x.fill_(1.0)
    t0 = time.perf_counter()
    y = host_to_device(torch.full((n,), 2.0), device)
    queued_s = time.perf_counter() - t0
    total = x + y  # after the fill and the copy, in stream order
    assert torch.equal(total.cpu(), torch.full((n,), 3.0))
    assert queued_s < 0.02, queued_s


def test_tf32_tensor_cores_is_false_off_cuda():
    from stages.platform import tf32_tensor_cores

    assert tf32_tensor_cores(torch.device("cpu")) is False
    assert tf32_tensor_cores("meta") is False


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_tf32_tensor_cores_follows_the_compute_capability():
    from stages.platform import tf32_tensor_cores

    assert tf32_tensor_cores(torch.device("cuda")) == (torch.cuda.get_device_capability() >= (8, 0))


def test_the_host_has_no_device_name_and_its_allocator_calls_are_no_ops():
    from stages.platform import describe_device, device_name, empty_cache, reset_peak_memory, timing_event

    cpu = torch.device("cpu")
    assert device_name(cpu) is None and describe_device(cpu).startswith("cpu (")
    assert timing_event(cpu) is None
    reset_peak_memory(cpu)
    empty_cache(cpu)
    assert memory_stats(cpu)["source"] == "rss"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_peak_memory_restarts_from_what_is_allocated_and_the_cache_empties():
    from stages.platform import describe_device, device_name, empty_cache, reset_peak_memory

    device = resolve_device("cuda")
    assert device_name(device) == torch.cuda.get_device_name(device)
    assert describe_device(device) == f"{device} ({device_name(device)})"
    big = torch.empty(64 * 2**20, dtype=torch.uint8, device=device)
    del big
    reset_peak_memory(device)
    stats = memory_stats(device)
    assert stats["peak_bytes"] == stats["allocated_bytes"]
    empty_cache(device)
    assert memory_stats(device)["reserved_bytes"] <= stats["reserved_bytes"]
