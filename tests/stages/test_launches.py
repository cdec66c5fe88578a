"""Launch accounting counts what a call dispatches, per call, and the time inside named ranges.

On CPU with real operators; the device-side range arithmetic on stand-in profiler events (both
the torch >= 2.13 correlation links and the older per-event kernel lists); on CUDA for real.
"""

from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import record_function

from stages.profiling.launches import count_launches, measure, range_times

CPU = torch.device("cpu")


def test_cpu_counts_top_level_operators_per_call():
    x = torch.randn(4, 16)

    def three_ops():
        return (x * 2 + 1).neg()

    counts = count_launches(three_ops, device=torch.device("cpu"), repeats=4)
    assert counts.unit == "operators"
    assert counts.per_call == 3.0
    assert counts.by_name == {"aten::mul": 1.0, "aten::add": 1.0, "aten::neg": 1.0}


def test_per_row_loop_scales_with_rows_and_batched_call_does_not():
    x = torch.randn(8, 2, 5)
    order = torch.arange(8)

    def per_row():
        return [x[r : r + 1].clone() for r in range(8)]

    def batched():
        return x.index_select(0, order)

    cpu = torch.device("cpu")
    rows = count_launches(per_row, device=cpu).by_name
    assert rows["aten::clone"] == 8.0
    assert count_launches(batched, device=cpu).per_call == 1.0


def test_views_and_allocations_are_not_launches_on_cpu():
    x = torch.randn(6, 4)
    assert count_launches(lambda: x[1:3].clone(), device=CPU).by_name == {"aten::clone": 1.0}
    assert count_launches(lambda: x.new_empty(3).unsqueeze(0), device=CPU).per_call == 0.0
    # A view-like operator that has to copy counts the copy it dispatched.
    assert count_launches(lambda: x.t().contiguous(), device=CPU).per_call == 1.0


def test_operators_inside_a_user_range_still_count_as_launches():
    x = torch.arange(6.0)

    def ranged() -> None:
        with record_function("outer"):
            x[1:3].clone()

    assert count_launches(ranged, device=CPU).by_name == {"aten::clone": 1.0}
    m = measure(ranged, device=CPU, repeats=2, ranges=("outer", "missing"))
    assert m.times.unit == "cpu_ms" and m.times.occurrences == {"outer": 1.0, "missing": 0.0}
    assert m.times.per_call_ms["outer"] > 0 and m.times.per_call_ms["missing"] == 0.0


def _event(eid, name, device, *, children=(), linked=0, us=0.0, annotation=False):
    span = SimpleNamespace(elapsed_us=lambda: us)
    return SimpleNamespace(id=eid, name=name, device_type=device, cpu_children=list(children),
                           linked_correlation_id=linked, time_range=span,
                           is_user_annotation=annotation, cpu_time_total=0.0)  # fmt: skip


def test_device_range_time_counts_each_kernel_once():
    # A range with one op (2 kernels) plus a profiler OVERHEAD record that shares the op's
    # correlation id, a graph-replay kernel linked to the range itself, and the range's
    # gpu_user_annotation twin on the device timeline: 10 + 5 + 7 us of work, nothing else.
    op = _event(2, "aten::mm", DeviceType.CPU)
    overhead = _event(2, "Lazy Function Loading", DeviceType.CPU)
    rng = _event(1, "code2wav.cfm", DeviceType.CPU, children=[op, overhead])
    events = [
        rng, op, overhead,
        _event(10, "gemm", DeviceType.CUDA, linked=2, us=10.0),
        _event(11, "add", DeviceType.CUDA, linked=2, us=5.0),
        _event(12, "graph_kernel", DeviceType.CUDA, linked=1, us=7.0),
        _event(13, "code2wav.cfm", DeviceType.CUDA, linked=1, us=40.0, annotation=True),
        _event(14, "outside", DeviceType.CUDA, linked=99, us=100.0),
    ]  # fmt: skip
    times = range_times(events, ("code2wav.cfm",), on_device=True, repeats=2)
    assert times.unit == "device_ms"
    assert times.per_call_ms["code2wav.cfm"] == pytest.approx(22.0 / 1000 / 2)
    assert times.occurrences["code2wav.cfm"] == 0.5  # the device-side twin is not an occurrence


def _legacy_event(eid, name, device, *, children=(), kernels=()):
    # torch < 2.13: no linked_correlation_id; device events hang off their launcher's `kernels`
    return SimpleNamespace(id=eid, name=name, device_type=device, cpu_children=list(children),
                           kernels=[SimpleNamespace(name=n, duration=us) for n, us in kernels],
                           is_user_annotation=False, cpu_time_total=0.0)  # fmt: skip


def test_device_range_time_counts_each_kernel_once_without_correlation_links():
    # The same scene as above as torch 2.11 reports it: the op's kernels appended to the op AND
    # to the overhead record sharing its id, the graph kernel and the annotation twin appended
    # to the range itself.
    kernels = (("gemm", 10.0), ("add", 5.0))
    op = _legacy_event(2, "aten::mm", DeviceType.CPU, kernels=kernels)
    overhead = _legacy_event(2, "Lazy Function Loading", DeviceType.CPU, kernels=kernels)
    rng = _legacy_event(1, "code2wav.cfm", DeviceType.CPU, children=[op, overhead],
                        kernels=(("graph_kernel", 7.0), ("code2wav.cfm", 40.0)))  # fmt: skip
    outside = _legacy_event(99, "aten::add", DeviceType.CPU, kernels=(("outside", 100.0),))
    events = [rng, op, overhead, outside]
    times = range_times(events, ("code2wav.cfm",), on_device=True, repeats=2)
    assert times.per_call_ms["code2wav.cfm"] == pytest.approx(22.0 / 1000 / 2)
    assert times.occurrences["code2wav.cfm"] == 0.5


@pytest.fixture
def dev() -> torch.device:
    if not torch.cuda.is_available():  # also skipped at collection (conftest); direct runs too
        pytest.skip("requires a CUDA device")
    return torch.device("cuda")


@pytest.mark.gpu
def test_cuda_range_time_is_the_kernels_inside_it_once(dev):
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(512, 512, device=dev)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("work"):
            (a @ a).relu_()
        torch.cuda.synchronize(dev)
    events = prof.events()
    kernels_us = sum(e.time_range.elapsed_us() for e in events
                     if e.device_type == DeviceType.CUDA and not e.is_user_annotation)  # fmt: skip
    times = range_times(events, ("work",), on_device=True, repeats=1)
    assert times.occurrences["work"] == 1.0  # the gpu_user_annotation twin is not counted
    assert kernels_us > 0
    assert times.per_call_ms["work"] == pytest.approx(kernels_us / 1000.0)


@pytest.mark.gpu
def test_cuda_launch_count_ignores_the_range_annotation(dev):
    a = torch.randn(64, 64, device=dev)

    def ranged() -> None:
        with record_function("work"):
            (a @ a).relu_()

    plain = count_launches(lambda: (a @ a).relu_(), device=dev)
    assert count_launches(ranged, device=dev).per_call == plain.per_call > 0
