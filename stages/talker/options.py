"""The talker's stage flags, parsed once and strictly (seed item 4), from one table (`OPTIONS`).

Each row is a key of the talker's `extra`, the `TalkerOptions` field it sets, its default (the
dataclass's field defaults are made from these rows), one line on what it does and the standing
decision behind the default. The parsed options are `TalkerConfig.options`: read once, where the
stage config is built, and what every consumer reads (the engine, the kernel choice in
`stages.talker.kernels`), never the `extra` mapping itself.

Unknown keys raise with the nearest valid name, so a typo never silently keeps a default.
Dependency-free (no torch) so the harness can validate a config before starting any process.

    TalkerOptions.from_extra({"talker_fused_layers": "false"}).fused_layers  # False
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stages.flags import Option, check_known_keys, defaults, read_bool_flag, read_env_opt_out

FUSED_PRELUDE_FLAG = "talker_codec_fused_prelude"
DECODE_GRAPH_FLAG = "talker_decode_graph"
PREFILL_GRAPH_FLAG = "talker_prefill_graph"
FUSED_LAYERS_FLAG = "talker_fused_layers"
FUSED_PRELUDE_ENV = "TALKER_CODEC_FUSED_PRELUDE"  # process-wide opt-out of the fused prelude

OPTIONS: tuple[Option, ...] = (
    # Fused Triton penalty + temperature prelude; false forces the eager chain (accuracy
    # triage). Env opt-out TALKER_CODEC_FUSED_PRELUDE=0, read once at import of
    # stages.talker.prelude and checked at config load (`check_env`).
    Option(FUSED_PRELUDE_FLAG, "fused_prelude", True,
           "fused Triton repetition penalty + temperature; false forces the eager chain", decision="D-TALKER-1"),
    # Capture the decode forward in device graphs (CUDA/NPU; eager on a CPU). The forward only;
    # sampling stays outside the graph (D-GRAPH-4).
    Option(DECODE_GRAPH_FLAG, "decode_graph", True, "the decode forward replayed as device graphs (CUDA/NPU)",
           decision="D-GRAPH-4"),
    # Capture the prefill forward of an admitted request in device graphs, one per length bucket
    # (CUDA/NPU; eager on a CPU). Off or on, prefills run at the bucket length, so codes are the
    # same.
    Option(PREFILL_GRAPH_FLAG, "prefill_graph", True,
           "each admission's prefill replayed as a device graph per length bucket (CUDA/NPU)",
           decision="D-GRAPH-3"),
    # Decode through fused layers where Triton runs (CUDA/NPU): one q|k|v and one gate|up GEMM,
    # Triton residual + RMSNorm and RoPE + cache write (~10 kernels a layer for ~65); false keeps
    # the modules' ops. Same function to fp32 rounding, so codes may differ between the two.
    Option(FUSED_LAYERS_FLAG, "fused_layers", True,
           "decode layers as fused GEMMs + Triton norm/RoPE/cache-write kernels (CUDA/NPU)",
           decision="D-TALKER-2"),
)
KNOWN_KEYS = frozenset(row.key for row in OPTIONS)
_DEFAULTS = defaults(OPTIONS)


def check_env(env: Mapping[str, str] | None = None) -> None:
    """Raise EnvFlagError (naming the variable) for a talker environment flag that is not a
    boolean; the talker process reads them itself, this only makes a typo fail early."""
    read_env_opt_out(FUSED_PRELUDE_ENV, env)


@dataclass(frozen=True)
class TalkerOptions:
    fused_prelude: bool = _DEFAULTS["fused_prelude"]
    decode_graph: bool = _DEFAULTS["decode_graph"]
    prefill_graph: bool = _DEFAULTS["prefill_graph"]
    fused_layers: bool = _DEFAULTS["fused_layers"]

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> TalkerOptions:
        check_known_keys(extra, KNOWN_KEYS, stage="talker")
        return cls(**{row.field: read_bool_flag(extra, row.key, row.default) for row in OPTIONS})
