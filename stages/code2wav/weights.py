"""Load the official `assets/token2wav/flow.pt` into `FlowModel`, strictly, without renames.

The module names in `flow.py`, `flow_encoder.py` and `dit.py` were chosen so the checkpoint's
605 keys (155,802,352 parameters at full size) map one to one; any missing key, unexpected key
or shape mismatch raises `FlowWeightsError` listing the first offenders. The CFM noise buffer and
the rel-pos table are not in the checkpoint (drawn / computed at construction).

    flow = FlowModel(cfg)
    load_flow_weights(flow, "/models/MiniCPM-o-4_5")   # reads assets/token2wav/flow.pt
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger(__name__)

FLOW_CHECKPOINT = Path("assets") / "token2wav" / "flow.pt"
_SHOW = 8  # how many offending keys an error lists


class FlowWeightsError(ValueError):
    """The flow checkpoint is missing, or its keys/shapes do not match the model."""


def flow_checkpoint_path(weights_dir: str | Path) -> Path:
    return Path(weights_dir) / FLOW_CHECKPOINT


def _first(keys: list[str]) -> str:
    more = f" (+{len(keys) - _SHOW} more)" if len(keys) > _SHOW else ""
    return ", ".join(keys[:_SHOW]) + more


def check_state_dict(model: nn.Module, state: Mapping[str, torch.Tensor], where: str) -> None:
    """Raise FlowWeightsError unless `state` matches `model` key for key and shape for shape."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mismatched = sorted(
        f"{k} {tuple(state[k].shape)} != {tuple(expected[k].shape)}"
        for k in set(expected) & set(state)
        if tuple(state[k].shape) != tuple(expected[k].shape)
    )
    problems = []
    if missing:
        problems.append(f"missing keys: {_first(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {_first(unexpected)}")
    if mismatched:
        problems.append(f"shape mismatches: {_first(mismatched)}")
    if problems:
        raise FlowWeightsError(
            f"error: flow checkpoint does not match the model ({where}): "
            + "; ".join(problems)
            + "; point weights at an official MiniCPM-o 4.5 directory and use the full-size "
            "code2wav config"
        )


def load_flow_state(model: nn.Module, state: Mapping[str, torch.Tensor], where: str) -> None:
    check_state_dict(model, state, where)
    model.load_state_dict(dict(state), strict=True)


def load_flow_weights(model: nn.Module, weights_dir: str | Path) -> None:
    path = flow_checkpoint_path(weights_dir)
    if not path.is_file():
        raise FlowWeightsError(
            f"error: flow checkpoint not found ({path}); the weights directory must contain "
            f"{FLOW_CHECKPOINT}"
        )
    state = torch.load(path, map_location="cpu", weights_only=True)
    load_flow_state(model, state, str(path))
    log.info("loaded flow weights from %s (%d tensors)", path, len(state))
