"""The trace window's summary (stages.profiling.window) over profiler events: the talker's
stream marked by its step spans, busy time as the union of what ran, idle share, copies apart,
top kernels; and a real window on the CPU."""

from __future__ import annotations

import gzip
import json
from types import SimpleNamespace

import pytest
import torch

from stages.profiling.window import TALKER_RANGE, ProfileWindow, format_trace, summarize

CPU, CUDA = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA


def _event(name: str, start: float, end: float, *, stream: int = 0, device=CUDA, annotation: bool = False):
    return SimpleNamespace(name=name, device_type=device, device_resource_id=stream, is_user_annotation=annotation,
                           time_range=SimpleNamespace(start=start, end=end))


def test_the_summary_marks_the_talkers_stream_and_measures_busy_idle_and_kernels():
    events = [
        # two talker steps on the host (10 ms and 20 ms) and their device spans on stream 7
        _event(TALKER_RANGE, 0, 10_000, device=CPU), _event(TALKER_RANGE, 20_000, 40_000, device=CPU),
        _event(TALKER_RANGE, 1_000, 9_000, stream=7, annotation=True),
        _event(TALKER_RANGE, 21_000, 35_000, stream=7, annotation=True),
        # stream 7: kernels 1-3 ms and 2-4 ms overlap (busy 3 ms), a copy 30-31 ms
        _event("gemv", 1_000, 3_000, stream=7), _event("gemv", 2_000, 4_000, stream=7),
        _event("Memcpy DtoH (Device -> Pageable)", 30_000, 31_000, stream=7),
        # stream 9: one long kernel, no talker span
        _event("conv", 0, 50_000, stream=9),
        _event("aten::mm", 0, 5, device=CPU),  # host ops are not device work
    ]
    s = summarize(events, wall_s=0.1)
    assert (s["steps"], s["host_ms_per_step"], s["device_span_ms_per_step"]) == (2, 15.0, 11.0)
    talker, other = s["streams"]  # the talker's stream first
    assert (talker["stream"], talker["talker"], other["stream"], other["talker"]) == (7, True, 9, False)
    assert (talker["kernels"], talker["copies"], talker["kernel_ms"], talker["mean_kernel_us"]) == (2, 1, 4.0, 2000.0)
    assert (talker["busy_ms"], talker["span_ms"]) == (4.0, 30.0)  # 1-4 ms and 30-31 ms, of 1-31 ms
    assert talker["idle_in_span"] == pytest.approx(26 / 30, abs=1e-4)
    assert talker["top_kernels"] == [{"name": "gemv", "count": 2, "ms": 4.0}]
    assert other["idle_in_span"] == 0.0 and other["busy_ms"] == 50.0
    assert s["device_busy"] == 0.5  # 0-50 ms of a 100 ms window
    lines = format_trace({"trace": "t.json.gz", **s})
    assert "2 talker steps, host 15.0 ms a step, device span 11.0 ms a step; device busy 50%" in lines[0]
    assert lines[1].startswith("  stream 7 (talker): 2 kernels, mean 2000.0 us, 1 copies, busy 4.0 of 30.0 ms (13%)")


def test_without_device_events_the_summary_has_host_steps_only():
    s = summarize([_event(TALKER_RANGE, 0, 2_000, device=CPU)], wall_s=1.0)
    assert (s["steps"], s["host_ms_per_step"], s["device_span_ms_per_step"], s["device_busy"], s["streams"]) == (
        1, 2.0, None, None, [])
    assert format_trace({"trace": "t.json", **s})[1] == "  no device timeline (kernels are traced on CUDA only)"
    assert format_trace({"error": "ValueError: no"}) == ["trace: failed: ValueError: no"]


def test_a_cpu_window_records_its_steps_writes_the_trace_and_refuses_a_bad_length(tmp_path):
    with pytest.raises(ValueError, match="seconds > 0"):
        ProfileWindow.open(seconds=0, path=tmp_path / "x.json", device=torch.device("cpu"))
    path = tmp_path / "deep" / "trace.json.gz"
    window = ProfileWindow.open(seconds=0.05, path=path, device=torch.device("cpu"))
    for _ in range(3):
        with window.step():
            torch.ones(8) @ torch.ones(8)
    while not window.due():
        pass
    summary = window.close()
    assert summary["steps"] == 3 and summary["streams"] == [] and summary["trace"] == str(path)
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    assert sum(e.get("name") == TALKER_RANGE for e in events) == 3
