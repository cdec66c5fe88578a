"""The tier split of `tts-bench profile`: tier arithmetic, range timing, launch counts in ranges."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import record_function

from stages.code2wav.config import Code2WavConfig
from stages.config import StageConfig
from stages.profiling.launches import count_launches, measure, range_times
from stages.talker.engine import TalkerEngine
from stages.talker.tokenizer import WordHashTokenizer
from tests.stages.code2wav_tiny import single_thread  # noqa: F401
from tts_bench._dataclass_yaml import load_dataclass, load_yaml_file
from tts_bench.config import Tier
from tts_bench.profile import _talker_seq_len, measure_talker_step, profile_text
from tts_bench.profile_split import TALKER_RANGE, TierPlan

CPU = torch.device("cpu")
TINY = Path(__file__).resolve().parents[2] / "configs/stages/minicpmo45-tiny.yaml"


def _tiny_stages() -> StageConfig:
    return load_dataclass(StageConfig, load_yaml_file(TINY), source=str(TINY), base_dir=TINY.parent)


@pytest.mark.parametrize(
    ("tier", "talker_rows", "code2wav_rows", "decodes"),
    [((128, 8), 128, 8, 16.0), ((32, 1), 32, 8, 4.0), ((4, 2), 4, 2, 2.0), ((3, 2), 3, 2, 1.5)],
)
def test_tier_plan_profiles_talker_at_c_rows_and_code2wav_at_the_replica_batch(
    tier, talker_rows, code2wav_rows, decodes
):
    plan = TierPlan.of(Tier(*tier), max_num_seqs=8, cfg=Code2WavConfig())
    assert (plan.talker_rows, plan.code2wav_rows) == (talker_rows, code2wav_rows)
    assert plan.talker_steps_per_s == 25.0  # 25 Hz codes: one step per code per stream
    assert plan.decodes_per_s == decodes  # one 25-code payload (1 s) per stream


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


@pytest.mark.usefixtures("single_thread")
def test_talker_profiles_128_rows_with_a_cache_sized_to_the_workload():
    stages = _tiny_stages()
    text = profile_text(0)
    seq = _talker_seq_len(stages, text, chunks=1)
    assert seq == 64 and seq < stages.runner.max_seq_len  # one kv_len bucket, not 1024 positions
    engine = TalkerEngine(stages.talker, device=CPU, dtype=torch.float32, max_batch=128, max_seq_len=seq)
    m = measure_talker_step(engine, 128, 1, text=text)
    assert m.times.occurrences == {TALKER_RANGE: 1.0} and m.times.per_call_ms[TALKER_RANGE] > 0
    assert not engine.has_work()


def test_talker_context_sets_the_condition_length():
    tok = WordHashTokenizer(151643)
    assert len(tok.encode(profile_text(256))) + 2 == 256  # + text_eos, audio_bos
    assert profile_text(0) == profile_text(10)  # short contexts keep the default sentence


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
