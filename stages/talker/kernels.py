"""Which kernels the talker runs: one decision per engine, from the stage options and the device.

`resolve(options, model, device)` decides two things and says why, as a `TalkerKernels`:
* decode layers: fused (`talker_fused_layers`, where Triton runs: one q|k|v and one gate|up GEMM,
  Triton residual + RMSNorm and RoPE + cache write, `stages.talker.layer_triton`) or the
  modules' ops. The model's projections are fused into views first and the kernels compiled
  now, outside any graph capture; a failure keeps the modules' decode, with the reason logged.
* sampling prelude: the fused Triton penalty + temperature kernel or the eager chain
  (`talker_codec_fused_prelude`, its env opt-out and process latch: `prelude.choose_prelude`).
The model is then handed the choice (`TalkerModel.use_kernels`, which only wires the layer
kernels in) and the sampler the prelude; neither asks the device anything.

    kernels = resolve(cfg.options, model, device)   # after model.setup_caches(...)
    model.use_kernels(kernels)
    kernels.layers.reason   # "fused (q|k|v and gate|up GEMMs; ...)" or "unfused (<why>)"
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING

import torch

from stages.platform import compile_failure, triton_unavailable_reason
from stages.talker.options import TalkerOptions
from stages.talker.prelude import Prelude, PreludeChoice, choose_prelude, penalty_temperature_eager

if TYPE_CHECKING:
    from stages.talker.model import TalkerModel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecodeLayers:
    kernels: ModuleType | None = None  # stages.talker.layer_triton when the fused layers run
    reason: str = "unfused (not resolved)"

    @property
    def fused(self) -> bool:
        return self.kernels is not None


@dataclass(frozen=True)
class TalkerKernels:
    layers: DecodeLayers = field(default_factory=DecodeLayers)
    prelude: PreludeChoice = field(default_factory=lambda: PreludeChoice(penalty_temperature_eager,
                                                                         "eager (not resolved)"))

    def reasons(self) -> dict[str, str]:
        """What runs and why the other branch does not, one line a part (the log's words)."""
        return {"decode_layers": self.layers.reason, "prelude": self.prelude.reason}


def resolve(options: TalkerOptions, model: TalkerModel, device: torch.device, *,
            prelude: Prelude | None = None) -> TalkerKernels:
    """The talker's kernels for `options` on `device`; call after `model.setup_caches`. A given
    `prelude` is used as it is (tests and A/Bs force one)."""
    chosen = (PreludeChoice(prelude, "given by the caller") if prelude is not None
              else choose_prelude(fused=options.fused_prelude, device=device))
    return TalkerKernels(decode_layers(options.fused_layers, model, device), chosen)


def decode_layers(fused: bool, model: TalkerModel, device: torch.device) -> DecodeLayers:
    """The fused decode layers when `fused` (the stage flag talker_fused_layers) and Triton runs
    on `device` (CUDA/NPU; the CPU only under TRITON_INTERPRET=1, for tests), compiled now; if
    that fails the modules' decode stays."""
    reason = "stage extra talker_fused_layers is false" if not fused else triton_unavailable_reason(device)
    if reason is None:
        from stages.talker import layer_triton  # lazy: loads triton

        model.fuse_projections()
        reason = compile_failure(lambda: layer_triton.warm_up(model), "the fused kernels",
                                 "unfused decode layers", log=log, owner="talker")  # fmt: skip
        if reason is None:
            return DecodeLayers(layer_triton, "fused (q|k|v and gate|up GEMMs; Triton residual + RMSNorm, RoPE + cache write)")
    return DecodeLayers(None, f"unfused ({reason})")
