"""SM partitions on a real CUDA device: the driver's green contexts through ctypes, streams and
graph captures on a partition, and results equal to the whole device's."""

from __future__ import annotations

import pytest
import torch

from stages.platform import graph_api, thread_stream
from stages.platform.partition import new_cuda_stream, on_partition, split_sms

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def split():
    return split_sms(torch.device("cuda", 0), 16)


@pytest.fixture(scope="module", params=["held", "rest"])
def partition(request, split):
    return getattr(split, request.param)


def _work(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = torch.nn.functional.conv1d(x, w, padding=3)
    return torch.softmax(y.flatten(1) @ y.flatten(1).T, dim=-1)


def test_a_split_divides_the_device_sms(split):
    total = torch.cuda.get_device_properties(0).multi_processor_count
    assert split.rest.total == split.held.total == total
    assert split.held.sms >= 16 and split.held.sms + split.rest.sms == total


def test_inside_on_partition_new_streams_and_graph_side_streams_are_the_partitions(partition):
    device = torch.device("cuda", 0)
    assert not isinstance(new_cuda_stream(device), torch.cuda.ExternalStream)
    with on_partition(partition):
        assert isinstance(new_cuda_stream(device), torch.cuda.ExternalStream)
        assert isinstance(graph_api(device).stream(), torch.cuda.ExternalStream)
        with thread_stream(device):
            assert torch.cuda.current_stream(device).cuda_stream != torch.cuda.default_stream(device).cuda_stream


def test_work_and_a_graph_on_the_partition_equal_the_whole_devices(partition):
    device = torch.device("cuda", 0)
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(4, 32, 4000, device=device, generator=gen)
    w = torch.randn(32, 32, 7, device=device, generator=gen)
    whole = _work(x, w)
    torch.cuda.synchronize()
    with on_partition(partition), thread_stream(device):
        api = graph_api(device)
        eager = _work(x, w)
        side = api.stream()
        side.wait_stream(api.current_stream())
        graph = api.graph()
        with api.capture(graph, pool=api.pool(), stream=side, **api.capture_options):
            captured = _work(x, w)
        api.current_stream().wait_stream(side)
        graph.replay()
        api.current_stream().synchronize()
    assert torch.equal(eager, whole)
    assert torch.equal(captured, whole)
