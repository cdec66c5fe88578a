"""Launch accounting: how many device kernels (CUDA) or top-level operators (CPU) a call issues.

Used to check claims like "3B launches -> 3" by measurement instead of reasoning, and reusable
for any A/B (`tts-bench profile`). On CUDA we count kernel activities the profiler saw, with
memcpy/memset reported apart; on CPU there are no kernels, so we count top-level aten operators
(each is one dispatch, the CPU analogue of a launch). Views (slice, select, view, expand, ...:
their schema returns an alias of an input) and bare allocations launch no kernel on a device, so
on CPU they count zero; a view-like operator that does copy (`reshape` of a non-contiguous
tensor, `to` with a new dtype) counts what it dispatched underneath.

    counts = count_launches(lambda: split(cache), device=torch.device("cuda"), repeats=5)
    counts.per_call  # e.g. 3.0
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import torch

# Operators that only allocate or relabel storage: no kernel on CUDA, so no launch on CPU either.
_NO_LAUNCH = frozenset(
    f"aten::{n}"
    for n in ("empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided",
              "_unsafe_view", "resize_")
)  # fmt: skip


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


@lru_cache(maxsize=None)
def is_view_op(name: str) -> bool:
    """True when every tensor overload of `name` returns a read-only alias of its input.

    Read from the operator schema (`-> Tensor(a)`) rather than a hand list, so new view
    operators are recognised; an operator without a schema counts as a launch.
    """
    try:
        found = torch._C._jit_get_schemas_for_operator(name)
    except RuntimeError:
        return False
    schemas = [s for s in found if s.arguments and str(s.arguments[0].type) == "Tensor"]
    if not schemas:
        return False
    returns = [str(s).rsplit(" -> ", 1)[1] for s in schemas]
    return all(r.startswith("Tensor(") and "!" not in r for r in returns)


def _cpu_launches(event) -> Counter[str]:
    """Launch-equivalents of one CPU operator event, by operator name."""
    name = event.name
    if name in _NO_LAUNCH:
        return Counter()
    if not is_view_op(name):
        return Counter({name: 1})
    out: Counter[str] = Counter()
    for child in event.cpu_children:
        if child.name.startswith("aten::"):
            out += _cpu_launches(child)
    return out


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
        if not on_device:
            if event.cpu_parent is None and event.name.startswith("aten::"):
                names += _cpu_launches(event)
        elif event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        elif _is_copy(event.name):
            copies += 1
        else:
            names[event.name] += 1
    return LaunchCount(
        unit="kernels" if on_device else "operators",
        per_call=sum(names.values()) / repeats,
        copies_per_call=copies / repeats,
        repeats=repeats,
        by_name={name: n / repeats for name, n in names.most_common()},
    )
