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

`measure` does the same and also sums the time inside named `torch.profiler.record_function`
ranges (device time on CUDA, host time on CPU) from the same profiler run:

    m = measure(step, device=dev, repeats=3, ranges=("code2wav.cfm",))
    m.times.per_call_ms["code2wav.cfm"]
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from stages.platform import is_cuda, synchronize

# Untimed calls before each profiled run: the first call pays for the allocator's growth and
# for caches built on first use (row-order tensors), which a steady step never pays again.
WARMUP = 1

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
    # Launch calls the host made (CUDA runtime/driver: kernel launches, graph launches, async
    # copies and memsets). Equal to per_call + copies_per_call when nothing is graphed; a
    # replayed graph is one host launch however many kernels it runs. None on CPU.
    host_per_call: float | None = None


# Host-side calls that put work on a CUDA stream (runtime and driver API names).
_HOST_LAUNCHES = frozenset({
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
    "cudaGraphLaunch", "cuGraphLaunch", "cudaMemcpyAsync", "cudaMemsetAsync", "cudaMemcpy",
    "cudaMemset",
})  # fmt: skip


def is_copy(name: str) -> bool:
    """Whether a device activity is a copy or a fill (memcpy / memset), not a kernel."""
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


def _under_aten(event) -> bool:
    """True when an enclosing event is an aten operator (its dispatches are counted there);
    user ranges (record_function) around an operator do not make it a child."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


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
    fn: Callable[[], object], *, device: torch.device, repeats: int = 3, warmup: int = WARMUP
) -> LaunchCount:
    """Profile `fn` `repeats` times after `warmup` calls; return launches per call."""
    return measure(fn, device=device, repeats=repeats, warmup=warmup).launches


@dataclass(frozen=True)
class RangeTimes:
    """Time inside named `record_function` ranges, per call of the profiled function.

    On CUDA: device time (the device activities launched inside the range, summed; idle gaps
    between them do not count; see `range_times`). On CPU there is no device, so it is the
    range's wall time on the host thread, profiler overhead included: compare CPU numbers with
    each other, never with device times.
    """

    unit: str  # "device_ms" on CUDA, "cpu_ms" on CPU
    per_call_ms: dict[str, float]  # by range name; 0.0 for a range that never ran
    occurrences: dict[str, float]  # how often each range ran per call (0 = name not seen)
    repeats: int


@dataclass(frozen=True)
class Measured:
    launches: LaunchCount
    times: RangeTimes


def measure(
    fn: Callable[[], object], *, device: torch.device, repeats: int = 3, warmup: int = WARMUP,
    ranges: tuple[str, ...] = (),
) -> Measured:
    """Profile `fn` `repeats` times after `warmup` calls, once: launches per call and the time
    per call inside each of `ranges` (record_function names)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    on_device = is_cuda(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_device else [])
    if on_device:
        synchronize(device)
    # No shapes, stacks or memory: they cost host time per operator and we read none of them.
    with profile(activities=activities, record_shapes=False, with_stack=False,
                 profile_memory=False) as prof:  # fmt: skip
        for _ in range(repeats):
            fn()
        if on_device:
            synchronize(device)
    events = prof.events()
    return Measured(
        _launches(events, on_device, repeats), range_times(events, ranges, on_device, repeats)
    )


def _launches(events, on_device: bool, repeats: int) -> LaunchCount:
    names: Counter[str] = Counter()
    copies = host = 0
    for event in events:
        if on_device and event.device_type == torch.autograd.DeviceType.CPU and event.name in _HOST_LAUNCHES:
            host += 1
            continue
        if not on_device:
            if event.name.startswith("aten::") and not _under_aten(event):
                names += _cpu_launches(event)
        elif event.device_type != torch.autograd.DeviceType.CUDA or event.is_user_annotation:
            continue  # gpu_user_annotation: the device-side span of a record_function range
        elif is_copy(event.name):
            copies += 1
        else:
            names[event.name] += 1
    return LaunchCount(
        unit="kernels" if on_device else "operators",
        per_call=sum(names.values()) / repeats,
        copies_per_call=copies / repeats,
        repeats=repeats,
        by_name={name: n / repeats for name, n in names.most_common()},
        host_per_call=host / repeats if on_device else None,
    )


def range_times(events, ranges: tuple[str, ...], on_device: bool, repeats: int) -> RangeTimes:
    """Sum each named range's time over `events` (a profiler's `events()`), per call.

    Each range is read from its CPU-side event (device_type CPU): with CUDA activity kineto also
    emits a `gpu_user_annotation` event of the same name on the device timeline, which is not a
    range occurrence and never counted. On CUDA the range's time is the sum of the durations of
    the device activities (kernels, memcpy, memset) launched from inside it, each counted once:
    a device event's `linked_correlation_id` names the CPU event that launched it, so we sum the
    device events linked to any CPU event in the range's subtree (the range itself included:
    graph replays and Triton launches outside any aten op link to the innermost range). We do
    not sum `FunctionEvent.device_time_total` (torch/autograd/profiler_util.py: the kernels
    appended to an event plus its children's totals) because two kinds of copies get appended
    too: a range's own gpu_user_annotation span (device_type CUDA, linked to the CPU range;
    pytorch#130730) and profiler OVERHEAD records that inherit their op's correlation id and
    so claim its kernels again (pytorch#193392). On CPU it is the range's host wall time.
    """
    total = dict.fromkeys(ranges, 0.0)
    seen = dict.fromkeys(ranges, 0)
    device_us = _device_us_by_launcher(events) if on_device else {}
    for event in events:
        if event.name not in total or event.device_type != torch.autograd.DeviceType.CPU:
            continue
        if on_device:
            ids = {e.id for e in _subtree(event)}
            us = sum(device_us.get(i, 0.0) for i in ids)
        else:
            us = event.cpu_time_total
        total[event.name] += us / 1000.0
        seen[event.name] += 1
    return RangeTimes(
        unit="device_ms" if on_device else "cpu_ms",
        per_call_ms={k: v / repeats for k, v in total.items()},
        occurrences={k: n / repeats for k, n in seen.items()},
        repeats=repeats,
    )


def _device_us_by_launcher(events) -> dict[int, float]:
    """Device busy time (us) by the id of the CPU event that launched it; user annotations on
    the device timeline are spans, not work, and are skipped."""
    if events and not hasattr(events[0], "linked_correlation_id"):
        return _device_us_from_kernel_lists(events)
    out: dict[int, float] = {}
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.is_user_annotation:
            key = e.linked_correlation_id
            out[key] = out.get(key, 0.0) + e.time_range.elapsed_us()
    return out


def _device_us_from_kernel_lists(events) -> dict[int, float]:
    """The same sums where FunctionEvent keeps no `linked_correlation_id` (torch before 2.13,
    e.g. the 2.11 of our H200 runs): there the profiler appends each device event to the CPU
    event that launched it (`FunctionEvent.kernels`: name, device, duration). Each CPU event id
    is read once (an OVERHEAD record sharing its op's id got the same kernels appended), and a
    range's own gpu_user_annotation span, appended to the range under the range's name, is
    skipped (no kernel carries a range's name)."""
    out: dict[int, float] = {}
    for e in events:
        if e.device_type != torch.autograd.DeviceType.CPU or e.id in out:
            continue
        out[e.id] = sum(k.duration for k in e.kernels if k.name != e.name)
    return out


def _subtree(event):
    stack = [event]
    while stack:
        e = stack.pop()
        yield e
        stack.extend(e.cpu_children)
