"""The fused prelude under device-graph capture: capture once, replay on new inputs, == eager.

The capture scope is the fused unit, in both forms: the per-call function
(`penalty_temperature_fused` with static input buffers and a static `out=`) and the step the
sampler calls (`bind_prelude`: the kernel bound to slot buffers, replayed for rows [:R] of them);
not the whole sampling chain. CUDA: `torch.cuda.CUDAGraph`
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
    bind_prelude,
    penalty_temperature_eager,
    penalty_temperature_fused,
    select_prelude,
)

SLOTS = 12  # slot buffers of the bound form; the captured step uses their first 8 rows


def fused_call(static: PreludeInputs, device: torch.device):
    """(the unit under capture, the static buffer it writes, its static inputs)."""
    fused = select_prelude(fused=True, device=device)
    assert fused is penalty_temperature_fused
    static_out = torch.empty_like(static.logits)
    return (lambda: fused(*static.args(), out=static_out)), static_out, static


def bound_step(static: PreludeInputs, device: torch.device):
    """The sampler's form: bound to SLOTS-row buffers whose first rows alias `static`'s."""
    batch = static.logits.shape[0]
    slots = [torch.zeros((SLOTS, *t.shape[1:]), dtype=t.dtype, device=device)
             for t in static.args()[1:]]  # fmt: skip
    for slot, row in zip(slots, static.args()[1:], strict=True):
        slot[:batch] = row
    out = torch.empty(SLOTS, static.logits.shape[1], device=device)
    history, history_len, pow_table, temperature = slots
    step = bind_prelude(select_prelude(fused=True, device=device), history=history,
                        history_len=history_len, pow_table=pow_table, temperature=temperature,
                        out=out)  # fmt: skip
    # New inputs are copied into the returned views: the slots' first rows, in place.
    views = PreludeInputs(static.logits, *(slot[:batch] for slot in slots))
    return (lambda: step(static.logits)), out[:batch], views


def capture_and_replay(device: torch.device, backend: types.ModuleType, graph_cls,
                       form=fused_call) -> None:
    """backend: torch.cuda or torch.npu (same Stream / stream / graph / synchronize API)."""
    prelude._reset_latch_for_tests()
    batch = 8
    first, *later = (random_inputs(batch, seed=s).to(device) for s in (21, 22, 23))
    static = PreludeInputs(*(t.clone() for t in first.args()))
    run, static_out, static = form(static, device)

    # Warm up on a side stream (compiles the kernel; capture must not compile).
    side = backend.Stream()
    side.wait_stream(backend.current_stream())
    with backend.stream(side):
        run()
    backend.current_stream().wait_stream(side)
    backend.synchronize()
    assert_bitwise_equal(static_out.cpu(), penalty_temperature_eager(*first.args()).cpu())

    graph = graph_cls()
    with backend.graph(graph):
        run()
    # static_out is deliberately not checked here: capture does not execute the kernel.

    for new in later:
        for dst, src in zip(static.args(), new.args(), strict=True):
            dst.copy_(src)
        graph.replay()
        backend.synchronize()
        assert_bitwise_equal(static_out.cpu(), penalty_temperature_eager(*new.args()).cpu())
    assert prelude._latch_tripped is False, "the fused kernel failed and the latch fell back"


@pytest.mark.gpu
@pytest.mark.parametrize("form", [fused_call, bound_step], ids=["per_call", "bound"])
def test_cuda_graph_replay_is_bit_exact(form):
    pytest.importorskip("triton", reason="the fused prelude needs triton")
    capture_and_replay(torch.device("cuda"), torch.cuda, torch.cuda.CUDAGraph, form)


@pytest.mark.npu
@pytest.mark.parametrize("form", [fused_call, bound_step], ids=["per_call", "bound"])
def test_npu_graph_replay_is_bit_exact(form):
    pytest.importorskip("triton", reason="the fused prelude needs triton-ascend")
    pytest.importorskip("torch_npu", reason="requires torch_npu")
    capture_and_replay(torch.device("npu"), torch.npu, torch.npu.NPUGraph, form)
