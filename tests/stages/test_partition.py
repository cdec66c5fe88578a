"""SM partitions (stages.platform.partition) on the CPU: the ctypes layer against a stand-in
driver that behaves like the CUDA driver's green-context calls, the reservation's arithmetic and
errors, and which streams a thread gets inside `on_partition`. The real driver: test_partition_gpu."""

from __future__ import annotations

import ctypes
import math
import threading
import time

import pytest
import torch

from stages.config import RunnerConfig
from stages.platform.errors import PlatformError
from stages.platform.partition import (
    GreenContextDriver,
    SmPartition,
    active_partition,
    on_partition,
    split_sms,
)


class _FakeLibcuda:
    """The driver calls `GreenContextDriver` makes, writing through the same pointers and buffer
    offsets as libcuda: a device of `total` SMs split in steps of `granularity`."""

    def __init__(self, total: int = 132, granularity: int = 8, fail: dict | None = None,
                 create_s: float = 0.0) -> None:
        self.total, self.granularity, self.fail = total, granularity, fail or {}
        self.create_s = create_s  # how long making a green context takes (a window for races)
        self.descs: dict[int, int] = {}  # desc handle -> SMs it describes
        self.contexts: dict[int, int] = {}  # green context handle -> SMs
        self.streams: list[tuple[int, int, int]] = []  # (context, flags, priority)

    @staticmethod
    def _write_sms(buf, sms: int) -> None:
        buf[96:100] = sms.to_bytes(4, "little")

    @staticmethod
    def _read_sms(buf) -> int:
        return int.from_bytes(bytes(buf[96:100]), "little")

    def cuDriverGetVersion(self, out):
        out._obj.value = 12030
        return 0

    def cuGetErrorName(self, rc, out):
        out._obj.value = b"CUDA_ERROR_INVALID_VALUE"
        return 0

    def cuDeviceGet(self, out, ordinal):
        out._obj.value = ordinal
        return 0

    def cuDeviceGetDevResource(self, dev, buf, kind):
        assert kind == 1  # CU_DEV_RESOURCE_TYPE_SM
        self._write_sms(buf, self.total)
        return 0

    def cuDevSmResourceSplitByCount(self, group, groups, whole, rest, flags, count):
        if self.fail.get("split"):
            return self.fail["split"]
        taken = math.ceil(count.value / self.granularity) * self.granularity
        have = self._read_sms(whole)
        self._write_sms(group, min(taken, have))
        self._write_sms(rest, max(0, have - taken))
        groups._obj.value = 1
        return 0

    def cuDevResourceGenerateDesc(self, out, buf, n):
        handle = 1000 + len(self.descs)
        self.descs[handle] = self._read_sms(buf)
        out._obj.value = handle
        return 0

    def cuGreenCtxCreate(self, out, desc, dev, flags):
        assert flags.value == 1  # CU_GREEN_CTX_DEFAULT_STREAM
        time.sleep(self.create_s)
        handle = 2000 + len(self.contexts)
        self.contexts[handle] = self.descs[desc.value]
        out._obj.value = handle
        return 0

    def cuGreenCtxStreamCreate(self, out, ctx, flags, priority):
        self.streams.append((ctx.value, flags.value, priority.value))
        out._obj.value = 3000 + len(self.streams)
        return 0


def test_a_split_makes_a_green_context_of_the_driver_rounded_group_and_one_of_the_rest():
    lib = _FakeLibcuda()
    split = split_sms(torch.device("cuda", 0), 10, driver=GreenContextDriver(lib))
    assert (split.held.sms, split.rest.sms, split.rest.total) == (16, 116, 132)  # 10 rounded up to 2 x 8
    assert split.describe() == {"reserved_sms": 16, "partition_sms": 116, "device_sms": 132}
    assert lib.contexts == {}  # a side's green context is made at its first stream
    split.rest.driver.stream(split.rest.context, 0)
    assert list(lib.contexts.values()) == [116]  # the rest's, not the held group's
    split.held.driver.stream(split.held.context, -1)
    split.rest.driver.stream(split.rest.context, 0)
    assert lib.contexts == {split.rest.context.value: 116, split.held.context.value: 16}
    # Each side's streams are its own context's: non-blocking (the driver requires it), at the
    # priority asked.
    rest, held = split.rest.context.value, split.held.context.value
    assert lib.streams == [(rest, 1, 0), (held, 1, -1), (rest, 1, 0)]


def test_threads_asking_for_streams_at_once_share_one_green_context():
    lib = _FakeLibcuda(create_s=0.05)
    split = split_sms(torch.device("cuda", 0), 16, driver=GreenContextDriver(lib))
    start = threading.Barrier(8)

    def ask() -> None:
        start.wait()
        split.rest.driver.stream(split.rest.context, 0)

    workers = [threading.Thread(target=ask) for _ in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert list(lib.contexts.values()) == [116] and len(lib.streams) == 8


@pytest.mark.parametrize("count, message", [
    (0, ">= 1 SM"),
    (132, "cannot hold back 132 of cuda:0's 132 SMs"),
    (130, "leaves none"),  # 130 rounds up to 136 > 132
])
def test_a_reservation_that_leaves_no_sms_or_holds_none_back_fails_clearly(count, message):
    with pytest.raises(PlatformError, match=message):
        split_sms(torch.device("cuda", 0), count, driver=GreenContextDriver(_FakeLibcuda()))


def test_a_reservation_off_cuda_names_the_setting_to_change():
    for device in (torch.device("cpu"), torch.device("meta")):
        with pytest.raises(PlatformError, match="needs a CUDA device.*runner.talker_sms=0"):
            split_sms(device, 16, driver=GreenContextDriver(_FakeLibcuda()))


def test_a_driver_error_is_reported_with_its_name_and_the_call():
    lib = _FakeLibcuda(fail={"split": 1})
    with pytest.raises(PlatformError, match=r"cuDevSmResourceSplitByCount\(16\) failed: CUDA_ERROR_INVALID_VALUE \(1\)"):
        split_sms(torch.device("cuda", 0), 16, driver=GreenContextDriver(lib))


def test_a_driver_without_green_contexts_is_refused_with_its_version():
    class _OldDriver:
        def cuDriverGetVersion(self, out):
            out._obj.value = 12020
            return 0

    with pytest.raises(PlatformError, match=r"driver >= 12.4.*reports 12.2 and lacks cuDevSmResourceSplitByCount"):
        GreenContextDriver(_OldDriver())


def _partition(index: int = 0) -> SmPartition:
    return SmPartition(torch.device("cuda", index), 116, 132, GreenContextDriver(_FakeLibcuda()),
                       ctypes.create_string_buffer(512))


def test_on_partition_is_per_thread_nests_and_covers_only_its_device():
    part, other = _partition(0), _partition(1)
    cuda0, cuda1 = torch.device("cuda", 0), torch.device("cuda", 1)
    assert active_partition(cuda0) is None
    seen_elsewhere = []
    with on_partition(part):
        assert active_partition(cuda0) is part
        assert active_partition(cuda1) is None and active_partition(torch.device("cpu")) is None
        worker = threading.Thread(target=lambda: seen_elsewhere.append(active_partition(cuda0)))
        worker.start()
        worker.join()
        with on_partition(None):  # None keeps the thread's partition
            assert active_partition(cuda0) is part
        with on_partition(other):
            assert active_partition(cuda1) is other and active_partition(cuda0) is None
        assert active_partition(cuda0) is part
    assert active_partition(cuda0) is None
    assert seen_elsewhere == [None]  # another thread is not on it


def test_talker_sms_needs_the_single_execution_and_a_count_of_zero_or_more():
    assert RunnerConfig(execution="single", talker_sms=16).talker_sms == 16
    assert RunnerConfig().talker_sms == 0
    with pytest.raises(ValueError, match="needs runner.execution: single"):
        RunnerConfig(execution="threads", talker_sms=16)
    with pytest.raises(ValueError, match="needs runner.execution: single"):
        RunnerConfig(talker_sms=8)  # auto resolves to processes
    with pytest.raises(ValueError, match=">= 0"):
        RunnerConfig(execution="single", talker_sms=-8)


def test_the_partition_benchmark_refuses_a_machine_without_cuda(monkeypatch):
    from scripts import bench_sm_partition

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        bench_sm_partition.main(["--reserve", "16"])
