"""Load the official HiFT checkpoint into `HiFTGenerator`, strictly, in any of its spellings.

Releases differ in two independent ways (spec §4.1b), so four spellings exist:
* keys prefixed `generator.` (training checkpoints) or not;
* weight norm stored as `<m>.parametrizations.weight.original0/1` (torch >= 2.1) or legacy
  `<m>.weight_g` / `<m>.weight_v`. original0 is g (the norm), original1 is v (the direction).

`canonical_hift_state_dict` maps any of them to our names; `load_hift` then loads with strict key
and shape checking and raises `HiFTWeightsError` naming the first missing / unexpected / misshaped
keys. In the newer asset set `hift.pt` is a different (causal) vocoder and the original HiFT is
`hift_original.pt`, so `find_hift_checkpoint` prefers the latter.

    hift = HiFTGenerator(cfg.hift)
    load_hift(hift, find_hift_checkpoint(weights_dir))
    fold_weight_norm(hift)
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import torch
from torch import nn

PREFIX = "generator."
CHECKPOINT_NAMES = ("hift_original.pt", "hift.pt")  # preference order
_NEW_G, _NEW_V = ".parametrizations.weight.original0", ".parametrizations.weight.original1"
_OLD_G, _OLD_V = ".weight_g", ".weight_v"
_SHOW = 5  # keys listed in an error message


class HiFTWeightsError(ValueError):
    """The HiFT checkpoint is missing, unreadable, or does not match the model."""


def find_hift_checkpoint(weights_dir: str | Path) -> Path:
    """`<dir>/assets/token2wav/hift_original.pt`, else `hift.pt` (also accepts the asset dir)."""
    root = Path(weights_dir)
    for base in (root / "assets" / "token2wav", root):
        for name in CHECKPOINT_NAMES:
            if (base / name).is_file():
                return base / name
    raise HiFTWeightsError(
        f"error: no {' or '.join(CHECKPOINT_NAMES)} found (under {root}/assets/token2wav); "
        "point runner.weights at the MiniCPM-o 4.5 model directory"
    )


def canonical_hift_state_dict(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Strip a `generator.` prefix and rename legacy weight_g/weight_v to parametrizations."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        name = key[len(PREFIX) :] if key.startswith(PREFIX) else key
        if name.endswith(_OLD_G):
            name = name[: -len(_OLD_G)] + _NEW_G
        elif name.endswith(_OLD_V):
            name = name[: -len(_OLD_V)] + _NEW_V
        out[name] = value
    return out


def official_hift_state_dict(
    model: nn.Module, *, prefix: bool, spelling: Literal["parametrizations", "legacy"]
) -> dict[str, torch.Tensor]:
    """Our (parametrized) state dict written in one of the four official spellings (for tests
    and for exporting a random checkpoint in the official layout)."""
    out: dict[str, torch.Tensor] = {}
    for name, value in model.state_dict().items():
        if spelling == "legacy":
            name = name.replace(_NEW_G, _OLD_G).replace(_NEW_V, _OLD_V)
        out[(PREFIX if prefix else "") + name] = value
    return out


def _check(model: nn.Module, state: Mapping[str, torch.Tensor], where: str) -> None:
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    misshaped = [
        f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and tuple(state[k].shape) != tuple(v.shape)
    ]
    if not (missing or unexpected or misshaped):
        return
    parts = []
    for label, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", misshaped)):
        if keys:
            more = f" (+{len(keys) - _SHOW} more)" if len(keys) > _SHOW else ""
            parts.append(f"{len(keys)} {label}: {', '.join(keys[:_SHOW])}{more}")
    raise HiFTWeightsError(
        f"error: HiFT checkpoint does not match the model ({where}): {'; '.join(parts)}; "
        "use the original HiFT (hift_original.pt in newer asset sets) with the default "
        "code2wav.hift dims, and load before fold_weight_norm()"
    )


def load_hift_state(model: nn.Module, state: Mapping[str, torch.Tensor], *, where: str = "state dict") -> None:
    """Strictly load `state` (any official spelling) into a parametrized `HiFTGenerator`."""
    canonical = canonical_hift_state_dict(state)
    _check(model, canonical, where)
    on_meta = _is_meta(model)
    model.load_state_dict(canonical, strict=True, assign=on_meta)
    if on_meta and hasattr(model, "init_buffers"):
        model.init_buffers()  # the STFT window is derived, not stored: rebuild it off meta


def load_hift(model: nn.Module, path: str | Path) -> None:
    """Read `path` (a torch state dict, loaded with weights_only) and load it strictly."""
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as exc:
        raise HiFTWeightsError(
            f"error: cannot read HiFT checkpoint ({path}): {exc}; check the file is a torch state dict"
        ) from exc
    if not isinstance(state, Mapping):
        raise HiFTWeightsError(f"error: HiFT checkpoint is not a state dict ({path}); expected a key -> tensor mapping")
    load_hift_state(model, state, where=str(path))


def _is_meta(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())
