"""The talker's stage flags, parsed once and strictly (seed item 4).

    talker_codec_fused_prelude  (default true)  fused Triton penalty + temperature prelude;
                                                false forces the eager chain (accuracy triage).
                                                Env opt-out TALKER_CODEC_FUSED_PRELUDE=0, read
                                                once at import of stages.talker.prelude and
                                                checked at config load (`check_env`).
    talker_decode_graph         (default true)  capture the decode forward in device graphs
                                                (CUDA/NPU; eager on a CPU). Measured on an
                                                H200: results/h200/README.md.
    talker_prefill_graph        (default true)  capture the prefill forward of an admitted
                                                request in device graphs, one per length bucket
                                                (CUDA/NPU; eager on a CPU). Off or on, prefills
                                                run at the bucket length, so codes are the same.
    talker_fused_layers         (default true)  decode through fused layers where Triton runs
                                                (CUDA/NPU): one q|k|v and one gate|up GEMM,
                                                Triton residual + RMSNorm and RoPE + cache
                                                write (~10 kernels a layer for ~65); false
                                                keeps the modules' ops. Same function to fp32
                                                rounding, so codes may differ between the two.

Unknown keys raise with the nearest valid name, so a typo never silently keeps a default.
Dependency-free (no torch) so the harness can validate a config before starting any process.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stages.flags import check_known_keys, read_bool_flag, read_env_opt_out

FUSED_PRELUDE_FLAG = "talker_codec_fused_prelude"
DECODE_GRAPH_FLAG = "talker_decode_graph"
PREFILL_GRAPH_FLAG = "talker_prefill_graph"
FUSED_LAYERS_FLAG = "talker_fused_layers"
KNOWN_KEYS = frozenset({FUSED_PRELUDE_FLAG, DECODE_GRAPH_FLAG, PREFILL_GRAPH_FLAG, FUSED_LAYERS_FLAG})
FUSED_PRELUDE_ENV = "TALKER_CODEC_FUSED_PRELUDE"  # process-wide opt-out of the fused prelude


def check_env(env: Mapping[str, str] | None = None) -> None:
    """Raise EnvFlagError (naming the variable) for a talker environment flag that is not a
    boolean; the talker process reads them itself, this only makes a typo fail early."""
    read_env_opt_out(FUSED_PRELUDE_ENV, env)


@dataclass(frozen=True)
class TalkerOptions:
    fused_prelude: bool = True
    decode_graph: bool = True
    prefill_graph: bool = True
    fused_layers: bool = True

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> TalkerOptions:
        check_known_keys(extra, KNOWN_KEYS, stage="talker")
        return cls(
            fused_prelude=read_bool_flag(extra, FUSED_PRELUDE_FLAG, True),
            decode_graph=read_bool_flag(extra, DECODE_GRAPH_FLAG, True),
            prefill_graph=read_bool_flag(extra, PREFILL_GRAPH_FLAG, True),
            fused_layers=read_bool_flag(extra, FUSED_LAYERS_FLAG, True),
        )
