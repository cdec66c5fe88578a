"""Memory preflight: will the embedded stages fit, checked before any stage process starts.

A config that cannot fit used to be found out by the kernel's OOM killer, minutes in, possibly
taking other processes with it (the full-size model on a CPU grew past 18 GB). Here the bytes a
stage config implies (`stages.runner.budget`: weights, talker KV cache, code2wav request state
at the tier's concurrency, processes) are compared with what is free: the device's free memory
on CUDA (`torch.cuda.mem_get_info`, asked through `stages.platform`) and the host's available
RAM (psutil). Over budget is a ConfigError (exit 2) that names the bytes, the largest items and
the config keys that lower them. Commands call `check_arms` while planning, before the run
directory exists; the embedded backend calls `check_memory` again in `start()` (at the tier's
concurrency when a phase told it, else 1, the floor) for library callers.

The estimate is deliberately not an allocator model (see `stages.runner.budget`); when it is
wrong for a setup, `TTS_BENCH_SKIP_MEMORY_CHECK=1` skips the check (and says so in the log).

    check_arms(arms, [Tier(4, 2)])                     # ConfigError when an arm cannot fit
    check_memory(cfg, replicas=2, concurrency=4, label="arm base, tier 4x2")
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from stages.flags import FlagError, parse_bool_flag
from tts_bench.errors import ConfigError

if TYPE_CHECKING:
    from tts_bench.config import BenchConfig, Tier

log = logging.getLogger(__name__)

SKIP_ENV = "TTS_BENCH_SKIP_MEMORY_CHECK"
_GIB = 2**30
TINY_HINT = "--set stages=configs/stages/minicpmo45-tiny.yaml"


def skipped() -> bool:
    raw = os.environ.get(SKIP_ENV, "").strip()
    if not raw:
        return False
    try:
        return parse_bool_flag(raw, key=SKIP_ENV)
    except FlagError:
        raise ConfigError(
            f"error: environment variable {SKIP_ENV} must be true/false/1/0, got {raw!r} "
            f"(environment); set {SKIP_ENV}=1 to skip the memory check, or unset it"
        ) from None


def check_arms(arms: Mapping[str, BenchConfig], tiers: Iterable[Tier]) -> None:
    """Check every embedded arm at every tier (its R replicas, C in flight)."""
    for name, cfg in arms.items():
        for tier in tiers:
            check_memory(cfg, replicas=tier.replicas, concurrency=tier.concurrency,
                         label=f"arm {name!r} at tier {tier.label}")


def check_memory(cfg: BenchConfig, *, replicas: int, concurrency: int, label: str) -> None:
    """Raise ConfigError when `cfg`'s stages name a device (or `runner.devices` list) this host
    lacks, or need more memory than the host or device has free. Backends other than
    `embedded` run no stages here: nothing to check."""
    if cfg.backend != "embedded":
        return
    # lazy: stages.platform and stages.runner load torch, which only an embedded arm needs (piper,
    # http and every command's planning import this module)
    from stages.platform import (
        PlatformError,
        device_count,
        free_memory_bytes,
        host_available_bytes,
        is_cpu,
        resolve_device,
    )
    from stages.runner import estimate_stage_memory, resolve_devices, runs_expandable_segments  # lazy: as above

    runner = cfg.stages.runner
    try:
        device = resolve_device(runner.device)
        # The stage processes place themselves; a device list this host cannot honour must
        # fail here, before the run directory exists, not as a stage's start-up traceback.
        resolve_devices(runner.devices, device_count(runner.device))
    except PlatformError as exc:  # e.g. runner.device: cuda on a host without one
        raise ConfigError(str(exc)) from None
    except ValueError as exc:
        raise ConfigError(f"{exc} ({label})") from None
    if skipped():
        log.warning("memory preflight skipped (%s is set)", SKIP_ENV)
        return
    budget = estimate_stage_memory(cfg.stages, replicas=replicas, concurrency=concurrency,
                                   device_type=device.type,
                                   expandable_segments=runs_expandable_segments(os.environ))
    free = {"host": host_available_bytes()}
    if not is_cpu(device):
        free["device"] = free_memory_bytes(device)  # None on NPU: not checked
    for where, available in free.items():
        needed = budget.total(where)
        if available is not None and needed > available:
            raise ConfigError(_message(budget, where, needed, available, label, device.type))
        log.debug("memory preflight %s (%s): %.2f GiB needed, %.2f GiB free", label, where,
                  needed / _GIB, (available or 0) / _GIB)


def _message(budget, where: str, needed: int, available: int, label: str, device: str) -> str:
    top = budget.largest(where)
    items = ", ".join(f"{i.name} {i.bytes / _GIB:.1f} GiB" for i in top)
    keys: list[str] = []
    for item in top:
        keys += [k for k in item.keys if k not in keys and k != "stages (dims)"]
    memory = "host memory" if where == "host" or device == "cpu" else f"{device} device memory"
    return (
        f"error: the embedded stages of {label} need about {needed / _GIB:.1f} GiB "
        f"({needed:,} bytes) of {memory} but {available / _GIB:.1f} GiB ({available:,} bytes) "
        f"is free (memory preflight, before any stage process starts; largest: {items}); lower "
        f"{', '.join(keys)}, or run the tiny stages ({TINY_HINT}); {SKIP_ENV}=1 skips this check"
    )
