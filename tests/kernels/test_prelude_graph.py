"""The fused prelude under device-graph capture: capture once, replay on new inputs, == eager.

The capture scope is the fused unit the sampler calls (`penalty_temperature_fused` with static
input buffers and a static `out=`), not the whole sampling chain. CUDA: `torch.cuda.CUDAGraph`
(marked `gpu`). Ascend: `torch.npu.NPUGraph` + `torch.npu.graph`, the API the NPU runtime really
uses (the CUDA-only API is a dummy there; marked `npu`, skipped here with a reason). Devices and
torch_npu are touched only inside the test bodies, so an unfiltered CPU run collects and skips.

What is asserted: (1) the eager-mode warmup launch (which also compiles the kernel; capture
needs a compiled kernel) on the first inputs; (2) after each replay on new inputs copied into
the static buffers, the static output, bit for bit against eager on those inputs. The output of
the capture pass itself is NOT asserted: capture records kernels without running them.
"""

from __future__ import annotations

import types

import pytest
import torch
from prelude_inputs import PreludeInputs, assert_bitwise_equal, random_inputs

from stages.talker import prelude
from stages.talker.prelude import (
    penalty_temperature_eager,
    penalty_temperature_fused,
    select_prelude,
)


def capture_and_replay(device: torch.device, backend: types.ModuleType, graph_cls) -> None:
    """backend: torch.cuda or torch.npu (same Stream / stream / graph / synchronize API)."""
    prelude._reset_latch_for_tests()
    batch = 8
    first, *later = (random_inputs(batch, seed=s).to(device) for s in (21, 22, 23))
    static = PreludeInputs(*(t.clone() for t in first.args()))
    static_out = torch.empty_like(static.logits)
    fused = select_prelude(fused=True, device=device)
    assert fused is penalty_temperature_fused

    # Warm up on a side stream (compiles the kernel; capture must not compile).
    side = backend.Stream()
    side.wait_stream(backend.current_stream())
    with backend.stream(side):
        fused(*static.args(), out=static_out)
    backend.current_stream().wait_stream(side)
    backend.synchronize()
    assert_bitwise_equal(static_out.cpu(), penalty_temperature_eager(*first.args()).cpu())

    graph = graph_cls()
    with backend.graph(graph):
        fused(*static.args(), out=static_out)
    # static_out is deliberately not checked here: capture does not execute the kernel.

    for new in later:
        for dst, src in zip(static.args(), new.args(), strict=True):
            dst.copy_(src)
        graph.replay()
        backend.synchronize()
        assert_bitwise_equal(static_out.cpu(), penalty_temperature_eager(*new.args()).cpu())
    assert prelude._latch_tripped is False, "the fused kernel failed and the latch fell back"


@pytest.mark.gpu
def test_cuda_graph_replay_is_bit_exact():
    pytest.importorskip("triton", reason="the fused prelude needs triton")
    capture_and_replay(torch.device("cuda"), torch.cuda, torch.cuda.CUDAGraph)


@pytest.mark.npu
def test_npu_graph_replay_is_bit_exact():
    pytest.importorskip("triton", reason="the fused prelude needs triton-ascend")
    pytest.importorskip("torch_npu", reason="requires torch_npu")
    capture_and_replay(torch.device("npu"), torch.npu, torch.npu.NPUGraph)
