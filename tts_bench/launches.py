"""Launch accounting: how many device kernels (CUDA) or top-level operators (CPU) a call issues.

Used to check claims like "3B launches -> 3" by measurement instead of reasoning, and reusable
for any A/B (`tts-bench profile`). On CUDA we count kernel activities the profiler saw, with
memcpy/memset reported apart; on CPU there are no kernels, so we count top-level aten operators
(each is one dispatch, the CPU analogue of a launch).

    counts = count_launches(lambda: split(cache), device=torch.device("cuda"), repeats=5)
    counts.per_call  # e.g. 3.0
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class LaunchCount:
    """Launches of one call, averaged over `repeats` calls (all calls issue the same work)."""

    unit: str  # "kernels" on CUDA/NPU, "operators" on CPU
    per_call: float
    copies_per_call: float
    repeats: int
    by_name: dict[str, float] = field(default_factory=dict)


def _is_copy(name: str) -> bool:
    return name.startswith(("Memcpy", "Memset", "cudaMemcpy", "cudaMemset"))


def count_launches(
    fn: Callable[[], object], *, device: torch.device, repeats: int = 3, warmup: int = 1
) -> LaunchCount:
    """Profile `fn` `repeats` times after `warmup` calls; return launches per call."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    on_device = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_device else [])
    if on_device:
        torch.cuda.synchronize(device)
    with profile(activities=activities) as prof:
        for _ in range(repeats):
            fn()
        if on_device:
            torch.cuda.synchronize(device)
    names: Counter[str] = Counter()
    copies = 0
    for event in prof.events():
        if on_device:
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            if _is_copy(event.name):
                copies += 1
                continue
        elif event.cpu_parent is not None or not event.name.startswith("aten::"):
            continue
        names[event.name] += 1
    return LaunchCount(
        unit="kernels" if on_device else "operators",
        per_call=sum(names.values()) / repeats,
        copies_per_call=copies / repeats,
        repeats=repeats,
        by_name={name: n / repeats for name, n in names.most_common()},
    )
