"""Sampler choice and the rss / nvml / torch samplers (GPU parts skip without CUDA)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tts_bench.errors import ConfigError
from tts_bench.mem import samplers as mod
from tts_bench.config.mem import MemParams
from tts_bench.mem.samplers import (
    RssSampler,
    SamplerError,
    TorchSampler,
    make_sampler,
    parse_sampler_names,
    resolve_auto,
)


def test_rss_sampler_counts_this_process_and_its_children():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        readings = RssSampler().sample()
    finally:
        child.kill()
        child.wait()
    labels = [r.label for r in readings]
    assert labels[0] == f"pid{os.getpid()}"
    assert f"pid{child.pid}" in labels
    assert all(r.used_bytes > 0 for r in readings)
    assert all(r.total_bytes and r.total_bytes > r.used_bytes for r in readings)


def _no_npu_smi(monkeypatch):
    monkeypatch.setattr(mod.shutil, "which", lambda name: None)


def _nvml_missing(monkeypatch):
    class FakeNvml:
        @staticmethod
        def nvmlInit():
            raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setattr(mod, "_nvml", lambda: FakeNvml)


def test_auto_without_npu_smi_or_nvml_falls_back_to_rss_and_says_so(monkeypatch, caplog):
    _no_npu_smi(monkeypatch)
    _nvml_missing(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="tts_bench.mem.samplers"):
        sampler = resolve_auto(0)
    assert sampler.name == "rss"
    text = caplog.text
    assert "npu-smi not on PATH" in text
    assert "NVML Shared Library Not Found" in text
    assert "falling back to rss" in text


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "npu_smi"
TABLE = (FIXTURES / "info_910b4_single.txt").read_text()


def fake_npu_smi(tmp_path: Path, monkeypatch, script: str) -> None:
    """An executable `npu-smi` (a shell script, whatever its arguments) first on PATH."""
    (tmp_path / "table.txt").write_text(TABLE)
    (tmp_path / "partial.txt").write_text("\n".join(TABLE.splitlines()[:7]) + "\n")  # NPU row, no chip row
    (tmp_path / "zero.txt").write_text(TABLE.replace("2871 / 32768", "3318 / 0    "))
    (tmp_path / "over.txt").write_text(TABLE.replace("2871 / 32768", "40000 / 32768"))
    binary = tmp_path / "npu-smi"
    binary.write_text(f"#!/bin/sh\ncd {tmp_path}\n{script}\n")
    binary.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(mod, "NPU_SMI_TIMEOUT_S", 1.0)


def test_auto_picks_an_npu_smi_that_reads_a_real_table(tmp_path, monkeypatch):
    fake_npu_smi(tmp_path, monkeypatch, "cat table.txt")
    sampler = make_sampler("auto", device_index=0)
    assert sampler.name == "npu-smi"
    assert [(r.used_bytes, r.total_bytes) for r in sampler.sample()] == [(2871 * 2**20, 32768 * 2**20)]


BROKEN = {  # what the script does: the reason the fallback must give
    "garbage": ("echo 'lorem | ipsum 12/34 |'", "no NPU rows"),
    "partial table": ("cat partial.txt", "no NPU rows"),
    "empty output": (":", "no NPU rows"),
    "exit 1": ("cat table.txt; exit 1", "returned non-zero exit status 1"),
    "hang": ("sleep 30", "took longer than 1 s"),
    "flood": ("yes '| 0     910B4               | OK            |' | head -c 50000000", "printed more than 1,048,576 bytes"),
    "zero total": ("cat zero.txt", "reports HBM 3318 / 0 MB"),
    "used above total": ("cat over.txt", "reports HBM 40000 / 32768 MB"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_auto_probes_a_broken_npu_smi_once_and_falls_back_saying_why(tmp_path, monkeypatch, caplog, case):
    script, why = BROKEN[case]
    fake_npu_smi(tmp_path, monkeypatch, script)
    _nvml_missing(monkeypatch)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="tts_bench.mem.samplers"):
        sampler = make_sampler("auto", device_index=0)
    # The hang is cut at its 1 s timeout (uncut it sleeps 30 s), the flood at the cap: 20 s is
    # far from both, so a loaded machine cannot flip it.
    assert time.monotonic() - started < 20
    assert sampler.name == "rss"
    assert "npu-smi is on PATH but unusable (" in caplog.text and why in caplog.text, caplog.text
    assert "NVML Shared Library Not Found; falling back to rss" in caplog.text


def test_an_explicit_broken_npu_smi_is_a_usage_error_naming_why(tmp_path, monkeypatch):
    fake_npu_smi(tmp_path, monkeypatch, "cat zero.txt")
    with pytest.raises(ConfigError, match=r"mem sampler 'npu-smi' cannot start: .*3318 / 0 MB"):
        make_sampler("npu-smi")


def test_auto_uses_nvml_when_it_initialises(monkeypatch):
    _no_npu_smi(monkeypatch)

    class Info:
        used, total = 5 * 2**30, 80 * 2**30

    class FakeNvml:
        nvmlInit = nvmlShutdown = staticmethod(lambda: None)
        nvmlDeviceGetCount = staticmethod(lambda: 2)
        nvmlDeviceGetHandleByIndex = staticmethod(lambda i: ("h", i))
        nvmlDeviceGetName = staticmethod(lambda h: b"NVIDIA H200")
        nvmlDeviceGetMemoryInfo = staticmethod(lambda h: Info)

    monkeypatch.setattr(mod, "_nvml", lambda: FakeNvml)
    sampler = make_sampler("auto", device_index=1)
    assert sampler.name == "nvml"
    (r,) = sampler.sample()
    assert (r.label, r.used_bytes, r.total_bytes) == ("gpu1", 5 * 2**30, 80 * 2**30)
    assert sampler.describe()["device"] == "NVIDIA H200"


def test_asking_for_nvml_explicitly_without_it_is_a_config_error_naming_auto(monkeypatch):
    _nvml_missing(monkeypatch)
    with pytest.raises(ConfigError, match=r"error: mem sampler 'nvml' cannot start: NVML unavailable.*--sampler auto"):
        make_sampler("nvml")


def test_npu_smi_explicitly_without_the_binary_is_a_config_error(monkeypatch):
    _no_npu_smi(monkeypatch)
    with pytest.raises(ConfigError, match="npu-smi is not on PATH"):
        make_sampler("npu-smi")


class FakeBackend:
    def __init__(self, snapshots):
        self.snapshots = list(snapshots)

    def memory_snapshot(self):
        return self.snapshots.pop(0)


def _proc(name, alloc, reserved):
    return {"process": name, "pid": 1, "allocated_bytes": alloc, "reserved_bytes": reserved,
            "peak_bytes": alloc + 1, "rss_bytes": 7, "source": "cuda-allocator"}


def test_torch_sampler_reads_every_stage_process_and_flags_a_partial_snapshot():
    backend = FakeBackend([
        [_proc("talker", 100, 200), _proc("code2wav0", 10, 20)],
        [_proc("talker", 100, 200)],  # code2wav0 busy past the snapshot timeout
    ])
    sampler = make_sampler("torch", backend=backend)
    first = sampler.sample()
    assert [(r.label, r.used_bytes, r.extra["reserved_bytes"]) for r in first] == [
        ("talker", 100, 200), ("code2wav0", 10, 20)]
    with pytest.raises(SamplerError, match="only 1 of 2"):
        sampler.sample()


def test_torch_sampler_needs_a_backend_that_reports_memory():
    with pytest.raises(ConfigError, match="memory_snapshot"):
        make_sampler("torch", backend=object())
    assert isinstance(TorchSampler(FakeBackend([])), TorchSampler)


def test_sampler_names_and_params_validate():
    assert parse_sampler_names("nvml, torch") == ("nvml", "torch")
    with pytest.raises(ConfigError, match="valid: auto, nvml, npu-smi, torch, rss"):
        parse_sampler_names("nvidia-smi")
    assert MemParams(sampler="rss,torch").sampler_names == ("rss", "torch")
    with pytest.raises(ValueError, match="mem.sampler"):
        MemParams(sampler="gpu")
    with pytest.raises(ValueError, match="mem.interval_s"):
        MemParams(interval_s=0)


@pytest.mark.gpu
def test_nvml_sees_an_allocation_on_the_gpu():
    import torch

    sampler = make_sampler("nvml", device_index=0)
    try:
        device = torch.device("cuda", 0)
        torch.zeros(1, device=device)  # context first, so the delta below is the tensor alone
        torch.cuda.synchronize(device)
        # Blocks cached by earlier tests in this process would serve the tensor below without a
        # new device allocation, invisible to NVML: hand them back first.
        torch.cuda.empty_cache()
        (before,) = sampler.sample()
        x = torch.empty(512 * 2**20, dtype=torch.uint8, device=device)  # 512 MiB
        torch.cuda.synchronize(device)
        (after,) = sampler.sample()
        assert 0 < before.used_bytes < before.total_bytes
        # NVML indices ignore CUDA_VISIBLE_DEVICES: only meaningful when GPU 0 is cuda:0.
        if os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] in ("0", ""):
            assert after.used_bytes - before.used_bytes >= 500 * 2**20
        del x
    finally:
        sampler.close()


def test_resolve_names_checks_before_any_tier_and_resolves_auto_once(monkeypatch, caplog):
    from tts_bench.mem.samplers import resolve_names

    _no_npu_smi(monkeypatch)
    _nvml_missing(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="tts_bench.mem.samplers"):
        assert resolve_names(("auto", "torch", "rss")) == ("rss", "torch")
    assert caplog.text.count("falling back to rss") == 1
    with pytest.raises(ConfigError, match="'nvml' cannot start"):
        resolve_names(("rss", "nvml"))
