"""SM partitions: hold some of a GPU's SMs back for one stage (CUDA green contexts).

Why: with the talker and the code2wav replicas as threads of one process (`runner.execution:
single`), a talker step is a chain of ~900 small dependent kernels, and each can wait for an SM
that the replicas' chunk kernels hold; a high stream priority only orders blocks that are waiting,
it preempts nothing. On an H200 (`scripts/bench_sm_partition.py`, D-EXEC-4) a talker-like chain of
~800 kernels took 3.0 ms alone and 153 ms beside four replica-like streams, on a high-priority
stream; with the load confined to the 116 SMs left after reserving 16 it took 9.4 ms, and the load
lost 10-11 % of its throughput. So the replicas run on streams of a green context that holds every
SM but the reserved ones, and the talker keeps the primary context (all SMs, high priority).

In the runner itself this did not shorten the talker's step at 64x4 (79 ms either way), and the
talker confined to the reserved SMs as well was slower still (145 ms a step with 32 SMs; with 16 it
did not finish its requests in 140 s), though the synthetic chain confined to 16 SMs beside the
load took 9.8 ms: the talker's step beside the replicas holds ~55 ms of device time against ~5.5 ms
alone, and SMs held for it do not shorten it, so what delays it is not SM occupancy (D-EXEC-4).
`runner.talker_sms` is opt-in, and only the benchmark runs work on a split's held side.

How: the CUDA driver's green-context calls (CUDA >= 12.4), through ctypes, since torch's own
wrapper (`torch.cuda.green_contexts`, beta; in torch 2.11 `create(num_sms, device_id)`) makes a
context of N SMs but none of the SMs left over, which is what the replicas need.
A stream of a green context is an ordinary CUDA stream to torch (`torch.cuda.ExternalStream`).

    split = split_sms(torch.device("cuda", 0), 16)     # >= 16 SMs held, and the rest
    with on_partition(split.rest), thread_stream(device): # this thread's stream is the rest's
        ...                                                # graph side streams made here are too

Landmines:
* a graph captured on a primary-context stream and replayed into a partition's stream is not
  confined (the talker-like chain took 212-214 ms beside such replays, more than beside
  unconfined load, 153 ms; bench_sm_partition_r2.json): capture on the partition's streams, which
  `graph_api(...).stream()` does inside `on_partition`;
* the driver rounds a reservation up to its SM granularity (8 on an H200): `split.held.sms` is
  what it took;
* a green context lives as long as the process (its streams are never destroyed while torch may
  still hold them).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from stages.platform.errors import PlatformError

_SM_RESOURCE = 1  # CU_DEV_RESOURCE_TYPE_SM
_GREEN_CTX_DEFAULT_STREAM = 1  # CU_GREEN_CTX_DEFAULT_STREAM (required by cuGreenCtxCreate)
_STREAM_NON_BLOCKING = 1  # CU_STREAM_NON_BLOCKING (required by cuGreenCtxStreamCreate)
# CUdevResource: a 4-byte type, 92 bytes of padding, then the SM count (CUDA 12.4 and 13 alike).
# Its size grew between releases (13 adds a trailing pointer), so every buffer is far larger.
_RESOURCE_BYTES = 512
_SM_COUNT_OFFSET = 96

_local = threading.local()


class GreenContextDriver:
    """The five driver calls an SM partition needs, over `libcuda` (ctypes)."""

    def __init__(self, lib: Any = None) -> None:
        if lib is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as exc:
                raise PlatformError(f"error: SM partitions need the CUDA driver library ({exc})") from exc
        missing = [n for n in ("cuDevSmResourceSplitByCount", "cuGreenCtxCreate", "cuGreenCtxStreamCreate")
                   if not hasattr(lib, n)]
        if missing:
            version = ctypes.c_int()
            lib.cuDriverGetVersion(ctypes.byref(version))
            raise PlatformError(
                f"error: SM partitions need CUDA green contexts (driver >= 12.4); this driver "
                f"reports {version.value // 1000}.{version.value % 1000 // 10} and lacks {', '.join(missing)}"
            )
        self.lib = lib

    def _check(self, rc: int, call: str) -> None:
        if rc:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(name))
            raise PlatformError(f"error: {call} failed: {(name.value or b'?').decode()} ({rc})")

    def _device(self, ordinal: int) -> ctypes.c_int:
        dev = ctypes.c_int()
        self._check(self.lib.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
        return dev

    def sm_resource(self, ordinal: int) -> ctypes.Array:
        """Every SM of device `ordinal`, as a CUdevResource."""
        whole = ctypes.create_string_buffer(_RESOURCE_BYTES)
        self._check(self.lib.cuDeviceGetDevResource(self._device(ordinal), whole, _SM_RESOURCE),
                    "cuDeviceGetDevResource")
        return whole

    @staticmethod
    def sm_count(resource: ctypes.Array) -> int:
        return int.from_bytes(resource.raw[_SM_COUNT_OFFSET:_SM_COUNT_OFFSET + 4], "little")

    def split(self, whole: ctypes.Array, count: int) -> tuple[ctypes.Array, ctypes.Array]:
        """(a group of at least `count` SMs, the rest of `whole`)."""
        group, rest = ctypes.create_string_buffer(_RESOURCE_BYTES), ctypes.create_string_buffer(_RESOURCE_BYTES)
        groups = ctypes.c_uint(1)
        self._check(self.lib.cuDevSmResourceSplitByCount(group, ctypes.byref(groups), whole, rest,
                                                         ctypes.c_uint(0), ctypes.c_uint(count)),
                    f"cuDevSmResourceSplitByCount({count})")
        return group, rest

    def green_context(self, ordinal: int, resource: ctypes.Array) -> ctypes.c_void_p:
        desc, ctx = ctypes.c_void_p(), ctypes.c_void_p()
        self._check(self.lib.cuDevResourceGenerateDesc(ctypes.byref(desc), resource, ctypes.c_uint(1)),
                    "cuDevResourceGenerateDesc")
        self._check(self.lib.cuGreenCtxCreate(ctypes.byref(ctx), desc, self._device(ordinal),
                                              ctypes.c_uint(_GREEN_CTX_DEFAULT_STREAM)), "cuGreenCtxCreate")
        return ctx

    def stream(self, ctx: ctypes.c_void_p, priority: int) -> int:
        """A new stream of green context `ctx` (its raw handle)."""
        handle = ctypes.c_void_p()
        self._check(self.lib.cuGreenCtxStreamCreate(ctypes.byref(handle), ctx, ctypes.c_uint(_STREAM_NON_BLOCKING),
                                                    ctypes.c_int(priority)), "cuGreenCtxStreamCreate")
        return int(handle.value)


@dataclass
class SmPartition:
    """`sms` of `device`'s `total` SMs: work on its streams runs there only. Its green context is
    made at its first stream (a split's unused side costs nothing)."""

    device: torch.device
    sms: int  # SMs in this partition
    total: int  # SMs of the device
    driver: GreenContextDriver
    resource: ctypes.Array  # the driver's description of these SMs
    _context: ctypes.c_void_p | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def context(self) -> ctypes.c_void_p:
        with self._lock:  # replica threads ask for their streams at once
            if self._context is None:
                self._context = self.driver.green_context(self.device.index, self.resource)
            return self._context

    def stream(self, *, priority: int = 0) -> Any:
        """A new stream on this partition's SMs (lower priority numbers run first)."""
        return torch.cuda.ExternalStream(self.driver.stream(self.context, priority), device=self.device)

    def covers(self, device: torch.device) -> bool:
        """Whether `device` is this partition's device."""
        return device.type == "cuda" and _ordinal(device) == self.device.index


@dataclass(frozen=True)
class SmSplit:
    """A device's SMs in two disjoint partitions: `held` for one stage, `rest` for the others."""

    held: SmPartition
    rest: SmPartition

    def describe(self) -> dict:
        return {"reserved_sms": self.held.sms, "partition_sms": self.rest.sms, "device_sms": self.rest.total}


def split_sms(device: torch.device, count: int, *, driver: GreenContextDriver | None = None) -> SmSplit:
    """`device`'s SMs as a partition of at least `count` (the driver's rounding) and one of the
    rest, each to be its own green context."""
    if device.type != "cuda":
        raise PlatformError(
            f"error: an SM reservation needs a CUDA device (green contexts), got {device}; "
            "set runner.talker_sms=0 there"
        )
    if count < 1:
        raise PlatformError(f"error: an SM reservation must hold back >= 1 SM, got {count}")
    driver = driver or GreenContextDriver()
    ordinal = _ordinal(device)
    device = torch.device("cuda", ordinal)
    whole = driver.sm_resource(ordinal)
    total = driver.sm_count(whole)
    if count >= total:
        raise PlatformError(
            f"error: cannot hold back {count} of {device}'s {total} SMs; the replicas need some"
        )
    group, rest = driver.split(whole, count)
    reserved, sms = driver.sm_count(group), driver.sm_count(rest)
    if sms < 1:
        raise PlatformError(
            f"error: holding back {count} SMs of {device} leaves none ({reserved} of {total} taken after "
            "the driver's rounding); reserve fewer"
        )
    return SmSplit(SmPartition(device, reserved, total, driver, group), SmPartition(device, sms, total, driver, rest))


def _ordinal(device: torch.device) -> int:
    """A CUDA device's index ("cuda" alone: the current one)."""
    return device.index if device.index is not None else torch.cuda.current_device()


@contextlib.contextmanager
def on_partition(partition: SmPartition | None) -> Iterator[None]:
    """Inside the block, streams this thread makes on `partition.device` (`thread_stream`, graph
    side streams) are the partition's. None: a no-op."""
    previous = getattr(_local, "partition", None)
    _local.partition = partition if partition is not None else previous
    try:
        yield
    finally:
        _local.partition = previous


def active_partition(device: torch.device) -> SmPartition | None:
    """The calling thread's partition if it is on `device` (see `on_partition`)."""
    part = getattr(_local, "partition", None)
    return part if part is not None and part.covers(device) else None


def new_cuda_stream(device: torch.device, *, priority: int = 0) -> Any:
    """A new CUDA stream on `device`: the calling thread's partition's, if it has one there."""
    part = active_partition(device)
    if part is not None:
        return part.stream(priority=priority)
    return torch.cuda.Stream(device=device, priority=priority)
