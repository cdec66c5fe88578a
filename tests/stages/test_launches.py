"""Launch accounting counts what a call dispatches, per call, on CPU."""

import torch

from stages.profiling.launches import count_launches


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
