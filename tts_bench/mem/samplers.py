"""Memory samplers: one small interface over npu-smi, NVML, the torch allocator and process RSS.

A sampler answers `sample() -> list[MemReading]`: one reading per device (npu-smi, nvml) or per
process (torch, rss), each with `used_bytes` and, where the source knows it, `total_bytes`. The
recorder (`tts_bench.mem.recorder`) sums the readings of one sample. `sample()` may raise
`SamplerError` (or anything else) mid-run; the recorder turns that into a gap, not a crash.

| name      | what `used` means                               | total            |
|-----------|-------------------------------------------------|------------------|
| `npu-smi` | HBM used on the card (`npu-smi info` table)     | HBM capacity     |
| `nvml`    | device memory used (nvmlDeviceGetMemoryInfo)    | device memory    |
| `torch`   | allocator `allocated` summed over stage processes (backend `memory_snapshot()`) | none |
| `rss`     | RSS of this process and all its children (host) | host RAM         |

`auto` picks npu-smi when the binary is on PATH and one probe reads a plausible table from it
(a binary that exists can still hang, flood, fail or print garbage), else NVML when it initialises
and sees the device, else rss, and logs which one it fell back to and why. npu-smi runs with a
time limit and a cap on its output (`tts_bench.mem.capped_run`). Nothing here imports torch: the
torch numbers come from the stage processes through the backend.

    sampler = make_sampler("auto", device_index=0)           # -> e.g. NvmlSampler
    sampler = make_sampler("torch", backend=embedded_backend)
    [r.used_bytes for r in sampler.sample()]
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any, Protocol

import psutil

from tts_bench.errors import ConfigError
from tts_bench.mem.capped_run import OutputTooLarge, run_capped
from tts_bench.mem.npu_smi import MIB, NpuSmiParseError, parse_info_table, parse_usages
from tts_bench.config.mem import SAMPLER_CHOICES

log = logging.getLogger(__name__)

SAMPLER_NAMES = SAMPLER_CHOICES
NPU_SMI_TIMEOUT_S = 5.0


class SamplerError(RuntimeError):
    """A sampler could not read memory this time (recorded as a gap) or cannot start at all."""


@dataclass(frozen=True)
class MemReading:
    """One device's or process's memory at one instant. `extra` holds source-specific bytes
    (torch: reserved_bytes, peak_bytes, rss_bytes)."""

    label: str
    used_bytes: int
    total_bytes: int | None = None
    extra: dict[str, int] = field(default_factory=dict)


class MemorySampler(Protocol):
    name: str

    def sample(self) -> list[MemReading]: ...

    def describe(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------- npu-smi


class NpuSmiSampler:
    """HBM of one Ascend card from `npu-smi info` (MiB resolution); falls back to
    `npu-smi info -t usages -i <card>` (1% resolution) when the table cannot be read."""

    name = "npu-smi"

    def __init__(self, card: int = 0, *, binary: str = "npu-smi", timeout_s: float | None = None,
                 run: Any = run_capped) -> None:
        self.card = card
        self.binary = binary
        self.timeout_s = NPU_SMI_TIMEOUT_S if timeout_s is None else timeout_s
        self._run = run  # injectable for tests: the signature of subprocess.run
        self.view = "info"

    def _text(self, *args: str) -> str:
        try:
            out = self._run([self.binary, *args], capture_output=True, text=True,
                            timeout=self.timeout_s, check=True)
        except subprocess.TimeoutExpired as exc:
            raise SamplerError(f"npu-smi {' '.join(args)} took longer than {self.timeout_s:g} s") from exc
        except (OSError, subprocess.CalledProcessError) as exc:
            raise SamplerError(f"npu-smi {' '.join(args)} failed: {exc}") from exc
        except OutputTooLarge as exc:
            raise SamplerError(f"npu-smi {' '.join(args)} {exc}; stopped") from exc
        return out.stdout

    def probe(self) -> NpuSmiSampler:
        """One sample now: a binary on PATH is not yet a working npu-smi (SamplerError if not)."""
        self.sample()
        return self

    def sample(self) -> list[MemReading]:
        try:
            cards = [c for c in parse_info_table(self._text("info")) if c.npu_id == self.card]
            problem = None if cards else f"no NPU {self.card} in the `npu-smi info` table"
        except NpuSmiParseError as exc:
            cards, problem = [], str(exc)
        if problem is None:
            self.view = "info"
        else:
            try:
                cards = [parse_usages(self._text("info", "-t", "usages", "-i", str(self.card)), npu_id=self.card)]
            except NpuSmiParseError as exc:
                raise SamplerError(f"npu-smi card {self.card}: {problem}, and {exc}") from exc
            if self.view == "info":  # said once, when the view changes
                log.warning("npu-smi info: %s; using `npu-smi info -t usages -i %d` (1%% resolution)",
                            problem, self.card)
            self.view = "usages"
        return [MemReading(c.label, c.hbm_used_mib * MIB, c.hbm_total_mib * MIB) for c in cards]

    def describe(self) -> dict[str, Any]:
        return {"sampler": self.name, "card": self.card, "view": self.view,
                "resolution_mib": 1 if self.view == "info" else "1% of capacity"}

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- NVML


def _nvml():
    import pynvml  # nvidia-ml-py; imported lazily so CPU-only paths never need it

    return pynvml


class NvmlSampler:
    """Device memory used/total of one GPU through NVML. Raises SamplerError on construction when
    NVML is missing or the device index does not exist."""

    name = "nvml"

    def __init__(self, device_index: int = 0) -> None:
        self.device_index = device_index
        try:
            nvml = _nvml()
            nvml.nvmlInit()
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, driver errors
            raise SamplerError(f"NVML unavailable: {exc or type(exc).__name__}") from exc
        self._nvml = nvml
        try:
            count = nvml.nvmlDeviceGetCount()
            if device_index >= count:
                raise SamplerError(f"NVML sees {count} GPU(s); device index {device_index} is out of range")
            self._handle = nvml.nvmlDeviceGetHandleByIndex(device_index)
            name = nvml.nvmlDeviceGetName(self._handle)
            self.device_name = name.decode() if isinstance(name, bytes) else str(name)
        except SamplerError:
            nvml.nvmlShutdown()
            raise
        except Exception as exc:
            nvml.nvmlShutdown()
            raise SamplerError(f"NVML device {device_index}: {exc}") from exc

    def sample(self) -> list[MemReading]:
        info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        return [MemReading(f"gpu{self.device_index}", int(info.used), int(info.total))]

    def describe(self) -> dict[str, Any]:
        return {"sampler": self.name, "device_index": self.device_index, "device": self.device_name,
                "note": "NVML indices ignore CUDA_VISIBLE_DEVICES"}

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # shutting down twice or after a driver fault: nothing to keep
            pass


# ---------------------------------------------------------------- torch allocator (via the backend)


class TorchSampler:
    """Allocator stats of every stage process, asked through the backend's `memory_snapshot()`.

    used = allocated bytes; reserved and the allocator's own peak are kept in `extra`. A snapshot
    in which fewer processes answered than in the first one is a gap: a partial sum would read as
    a drop in memory."""

    name = "torch"

    def __init__(self, backend: Any) -> None:
        if not callable(getattr(backend, "memory_snapshot", None)):
            raise SamplerError(
                f"backend {type(backend).__name__} does not report allocator memory (memory_snapshot)"
            )
        self.backend = backend
        self.processes = 0
        self.source = "unknown"  # cuda-allocator | npu-allocator | rss (CPU: no device allocator)

    def sample(self) -> list[MemReading]:
        snap = self.backend.memory_snapshot()
        if not snap:
            raise SamplerError("memory_snapshot() returned no process")
        if len(snap) < self.processes:
            raise SamplerError(f"only {len(snap)} of {self.processes} stage processes answered")
        self.processes = max(self.processes, len(snap))
        self.source = str(snap[0].get("source", self.source))
        return [
            MemReading(
                str(s.get("process", s.get("pid"))), int(s["allocated_bytes"]), None,
                {k: int(s[k]) for k in ("reserved_bytes", "peak_bytes", "rss_bytes", "prompt_cache_bytes") if k in s},
            )
            for s in snap
        ]

    def describe(self) -> dict[str, Any]:
        return {"sampler": self.name, "processes": self.processes, "used": "allocated_bytes",
                "source": self.source}

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- process-tree RSS


class RssSampler:
    """RSS of a process and all its descendants (the CPU fallback; host memory, not a device)."""

    name = "rss"

    def __init__(self, pid: int | None = None) -> None:
        self._psutil = psutil
        self.root = psutil.Process(pid or os.getpid())
        self.total_bytes = int(psutil.virtual_memory().total)

    def sample(self) -> list[MemReading]:
        readings = [MemReading(f"pid{self.root.pid}", int(self.root.memory_info().rss), self.total_bytes)]
        for child in self.root.children(recursive=True):
            try:
                rss = int(child.memory_info().rss)
            except (self._psutil.NoSuchProcess, self._psutil.AccessDenied):
                continue  # a child that exited between listing and reading
            readings.append(MemReading(f"pid{child.pid}", rss, self.total_bytes))
        return readings

    def describe(self) -> dict[str, Any]:
        return {"sampler": self.name, "root_pid": self.root.pid, "scope": "process tree, host RAM"}

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- choosing


def parse_sampler_names(text: str) -> tuple[str, ...]:
    """`"nvml,torch"` -> ("nvml", "torch"); unknown names raise ConfigError listing the valid ones."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in SAMPLER_NAMES]
    if not names or bad:
        raise ConfigError(
            f"error: unknown sampler {(bad or [text])[0]!r} (--sampler / mem.sampler); "
            f"valid: {', '.join(SAMPLER_NAMES)}, comma-separated for several"
        )
    return names


def resolve_auto(device_index: int = 0) -> MemorySampler:
    """npu-smi if on PATH and one probe reads it, else NVML if it initialises, else rss; logs
    the fallback and why."""
    no_npu = "npu-smi not on PATH"
    if shutil.which("npu-smi"):
        try:
            sampler = NpuSmiSampler(device_index).probe()
        except SamplerError as exc:
            no_npu = f"npu-smi is on PATH but unusable ({exc})"
        else:
            log.info("mem sampler: npu-smi (card %d)", device_index)
            return sampler
    try:
        nvml = NvmlSampler(device_index)
    except SamplerError as exc:
        log.warning("mem sampler: %s and %s; falling back to rss "
                    "(process-tree RSS: host memory of the harness and its children, not device memory)",
                    no_npu, exc)
        return RssSampler()
    say = log.info if no_npu == "npu-smi not on PATH" else log.warning
    say("mem sampler: nvml (%s), GPU %d %s", no_npu, device_index, nvml.device_name)
    return nvml


def make_sampler(name: str, *, device_index: int = 0, backend: Any = None) -> MemorySampler:
    """Build a sampler by name. An explicit device sampler that cannot start is a ConfigError
    (the user asked for it); only `auto` falls back."""
    try:
        if name == "auto":
            return resolve_auto(device_index)
        if name == "npu-smi":
            if shutil.which("npu-smi") is None:
                raise SamplerError("npu-smi is not on PATH")
            return NpuSmiSampler(device_index).probe()
        if name == "nvml":
            return NvmlSampler(device_index)
        if name == "torch":
            return TorchSampler(backend)
        if name == "rss":
            return RssSampler()
    except SamplerError as exc:
        raise ConfigError(
            f"error: mem sampler {name!r} cannot start: {exc} (--sampler); "
            f"use --sampler auto (falls back to rss) or another of {', '.join(SAMPLER_NAMES)}"
        ) from exc
    raise ConfigError(f"error: unknown sampler {name!r} (--sampler); valid: {', '.join(SAMPLER_NAMES)}")


def resolve_names(names: tuple[str, ...], *, device_index: int = 0) -> tuple[str, ...]:
    """Check every sampler can start before any backend does, and resolve `auto` once (so its
    fallback message is logged once, not per arm). `torch` needs the backend and is checked when
    the backend exists. Duplicates after resolution are dropped, order kept."""
    out: list[str] = []
    for name in names:
        if name != "torch":
            sampler = make_sampler(name, device_index=device_index)
            sampler.close()
            name = sampler.name
        if name not in out:
            out.append(name)
    return tuple(out)
