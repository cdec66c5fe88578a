"""Code2wav stage `extra` flags, parsed once at construction on every platform (spec §5.6/5.7).

One table, `OPTIONS`, says every key: the `Code2WavOptions` field it sets, its default (the
dataclass's field defaults are made from it), what it does and the decision behind the default.
The parsed options are `Code2WavConfig.options`, read once where the stage config is built; every
consumer (Token2Wav, the prompt builder, the kernel choice in `stages.code2wav.kernels`, the
memory budget, the profiler) reads them, never the `extra` mapping.

Every key is checked: an unknown key is rejected with the nearest valid name, booleans go
through `stages.flags.read_bool_flag` (quoted "false" is false, null is the default, junk
raises), and the TF32 mode is resolved once:

* `token2wav_allow_tf32` (primary) decides when it is not null;
* else env `MINICPMO_CODE2WAV_TF32` when set and non-empty;
* else `code2wav_allow_tf32` (alias) when not null;
* else "off".
Values: "off" / "conv" / "flow" / "all", booleans (true = "all"), and the tokens in `_TF32_TOKENS`;
every value present is parsed (a typo in an unused alias still fails). The mode is applied
only on CUDA, by `stages.precision.region_scope`, from the resolved value — never re-read per forward. What each
mode runs in TF32 is the table in `stages.precision` (CODE2WAV_MODES): "off" is no TF32
anywhere, cuDNN's convolutions included (torch leaves `torch.backends.cudnn.allow_tf32` on;
each region sets it off); "conv" keeps cuDNN's TF32 convolutions with fp32 GEMMs (what "off"
ran before); "flow" adds TF32 GEMMs in the flow, "all" everywhere. The request-count flags
(`code2wav_matmul_attention_requests`) are whole numbers, 0..4096, refused otherwise.

    opts = Code2WavOptions.from_extra({"code2wav_batched_cache_split": "false"})
    with region_scope(opts.tf32_mode, device, region="flow"):  # stages.precision
        ...
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from stages import flags
from stages.flags import EnvFlagError, FlagError, Option, defaults, read_bool_flag, read_env_opt_out

Tf32Mode = Literal["off", "conv", "flow", "all"]
TF32_ENV = "MINICPMO_CODE2WAV_TF32"
TF32_KEY = "token2wav_allow_tf32"
TF32_ALIAS = "code2wav_allow_tf32"
DEVICE_SPK_ENV = "VLLM_OMNI_DEVICE_SPK"  # `0` forces the CPU onnxruntime speaker embedding
_TF32_TOKENS: dict[str, Tf32Mode] = {
    "off": "off", "false": "off", "0": "off", "no": "off",
    "conv": "conv", "cudnn": "conv",
    "flow": "flow",
    "all": "all", "true": "all", "1": "all", "yes": "all", "tf32": "all",
}  # fmt: skip

# The code2wav stage's options, one row a key: the `Code2WavOptions` field it sets, its default
# (the dataclass's field defaults are made from these rows), one line on what it does and the
# standing decision (results/decisions.md) behind the default. Booleans first, in parse order.
BOOL_OPTIONS: tuple[Option, ...] = (
    Option("code2wav_batched_cache_split", "batched_cache_split", True,
           "a B-row chunk's flow caches stored by 3 batched copies instead of 3B per-row ones",
           decision="D-C2W-1"),
    # Consumed by the prompt builder (speaker-embedding placement), parsed here with the others.
    Option("token2wav_device_spk", "device_spk", True,
           f"CAM++ speaker embedding on the device; false: CPU onnxruntime (env {DEVICE_SPK_ENV}=0 too)",
           decision="D-C2W-2"),
    # Replay whole chunks as device graphs on CUDA/NPU (no effect on CPU). On since replicas warm
    # their shapes up before serving, without which they did not pay (D-GRAPH-1).
    Option("code2wav_device_graph", "device_graph", True, "whole chunks replayed as device graphs (CUDA/NPU)",
           decision="D-GRAPH-1"),
    # With device graphs on: a replica decodes synthetic streams of 1..max_num_seqs rows before
    # it reports ready, so every steady shape is captured before the first request (otherwise
    # each new shape's first chunk pays an eager run plus a capture while serving).
    Option("code2wav_graph_warmup", "graph_warmup", True,
           "with device graphs: every steady shape captured before the replica reports ready",
           decision="D-GRAPH-1"),
    # With device graphs and their warmup: one-row final chunks replay graphs too, one per stage
    # a stream can end in and count of new codes (0..codec_chunk_frames-1), captured at warmup;
    # finals ending in one step replay one row at a time (launch_plan.py), since a final chunk's
    # shape varies with its length and rows (too many shapes to capture as they come).
    # Every request ends with one. At 32x1 mean RTF -41 % (H100), 64x4 and 128x8 within noise;
    # at 128x8 on an H200 the 600 graphs of 8 replicas took 1.8 GiB (D-GRAPH-6).
    Option("code2wav_final_chunk_graphs", "final_chunk_graphs", True,
           "with graphs and their warmup: final chunks replay one-row graphs captured at warmup",
           decision="D-GRAPH-6"),
    # The DiT's residual add + LayerNorm + adaLN modulation as one Triton launch instead of three
    # (stages/code2wav/dit_triton.py) on CUDA/NPU; the CPU keeps the eager chain.
    Option("code2wav_fused_norm", "fused_norm", True, "the DiT's norm steps as Triton launches (CUDA/NPU)",
           decision="D-DIT-1"),
    # The DiT's causal convs frames-first on CUDA: 2-D convs over the [B, T, C] activations as
    # a channels-last image, so cuDNN runs no layout transforms around them (two a conv); the CPU
    # and an NPU keep the checkpoint's channels-first convs (D-DIT-4).
    Option("code2wav_frames_first_conv", "frames_first_conv", True,
           "the DiT's causal convs without cuDNN layout transforms (CUDA)", decision="D-DIT-4"),
    # The DiT's fp32 linears as Triton GEMMs with 3xTF32 products on CUDA (stages/code2wav/
    # dit_gemm.py): tensor cores at fp32 accuracy (closer to fp64 than cuBLAS fp32), bias and
    # GELU fused. Acts on CUDA with an fp32 DiT only, and not with TF32 for the flow (D-DIT-5).
    Option("code2wav_dit_tf32x3", "dit_tf32x3", True,
           "the DiT's fp32 linears as Triton 3xTF32 GEMMs (CUDA, fp32 DiT, no TF32 flow)", decision="D-DIT-5"),
    # Chunks small enough for attention as GEMMs (code2wav_matmul_attention_requests) run it as
    # one Triton kernel instead (stages/code2wav/dit_flash.py: online softmax, 3xTF32 dots; fp32
    # DiT, CUDA): one launch for five a block-step (D-DIT-3). Larger chunks keep the fused SDPA
    # kernel, which the Triton one did not beat there. False keeps the GEMMs.
    Option("code2wav_triton_attention", "triton_attention", True,
           "small chunks' attention as one Triton kernel (CUDA, fp32 DiT)", decision="D-DIT-3"),
    # The causal conv block's LayerNorm + Mish, conv2's input window and both cache writes as one
    # Triton launch instead of five (stages/code2wav/dit_conv_triton.py); acts with the frames-first
    # convs (CUDA). The same function to fp32 rounding (D-DIT-7).
    Option("code2wav_fused_conv_norm", "fused_conv_norm", True,
           "the DiT conv block's LayerNorm + Mish + cache writes as one Triton launch (CUDA, frames-first)",
           decision="D-DIT-7"),
    # The DiT's causal convs (frames-first) as 3xTF32 Triton GEMMs reading the window in place
    # (stages/code2wav/dit_gemm.py `causal_conv`): in the default precision cuDNN runs them on CUDA
    # cores as fp32 with layout transforms around them. Acts where the linears are 3xTF32 GEMMs
    # (CUDA, fp32 DiT) and no TF32 is asked for (D-DIT-8).
    Option("code2wav_conv_gemm", "conv_gemm", True,
           "the DiT's causal convs as 3xTF32 Triton GEMMs (CUDA, fp32 DiT, frames-first, TF32 off)",
           decision="D-DIT-8"),
    # HiFT's 72 Snake activations a call as one Triton launch each instead of eight eager kernels
    # (stages/code2wav/hift_triton.py), bit for bit the module's formula; CUDA only (D-HIFT-1).
    Option("code2wav_fused_snake", "fused_snake", True,
           "HiFT's Snake activations as one Triton launch each (CUDA; bit-exact)", decision="D-HIFT-1"),
    # HiFT's stride-1 convs (ResBlocks, conv_pre, conv_post) as 3xTF32 Triton implicit GEMMs
    # (stages/code2wav/hift_conv_triton.py): with TF32 off cuDNN runs them as fp32 on CUDA cores.
    # fp32-accurate, not bit-exact; CUDA only. Off: the fixed 64x64 tile made a chunk slower than
    # cuDNN's fp32 convs (D-HIFT-2); kept as the starting point of a tuned kernel.
    Option("code2wav_hift_conv_gemm", "hift_conv_gemm", False,
           "HiFT's stride-1 convs as 3xTF32 Triton GEMMs (CUDA, TF32 off; fp32-accurate; slower today)",
           decision="D-HIFT-2"),
    # The slot pool's attention-cache copies, each Euler step's load into the step buffer and its
    # trimmed store back, and the conformer's gather, as one Triton pass each way
    # (stages/code2wav/cache_copy_triton.py) instead of index_select + copy and cat + the
    # deterministic index_put_: bit for bit the same bytes (the interpreter's and the GPU's
    # tests); CUDA only (D-C2W-4).
    Option("code2wav_fused_cache_copy", "fused_cache_copy", True,
           "the slot pool's attention-cache loads and stores as one Triton pass each (CUDA; bit-exact)",
           decision="D-C2W-4"),
    # A DiT branch's last GEMM (attention's proj, fc2, each causal conv) that splits its k-sum
    # (small chunks) leaves the parts unadded, and the launch after it (the fused norm step, the
    # conv block's LayerNorm + Mish) adds them as it loads, in the split sum's order: bit for bit
    # the same values, one launch fewer for each (3 a block-step at one request: 480 a steady
    # chunk). Acts with the 3xTF32 GEMMs and the fused kernels (CUDA; stages/code2wav/fusions.py).
    Option("code2wav_open_split_sums", "open_split_sums", True,
           "split GEMMs' k-sum parts added by the next fused kernel, one launch fewer each (CUDA; bit-exact)",
           decision="D-DIT-9"),
    # The fused norm step before each frames-first conv block writes the conv's input window (its
    # two cached frames, then the frames) instead of the block concatenating them: one launch
    # fewer a block-step (160 a chunk), the same bytes (D-DIT-9 measured the two together).
    Option("code2wav_norm_writes_conv_window", "norm_writes_conv_window", True,
           "the fused norm step writes each conv block's input window, one launch fewer (CUDA; bit-exact)",
           decision="D-DIT-9"),
    # The MLP branch (fc1 + GELU + fc2) as one Triton launch at chunks of up to 256 DiT rows (two
    # requests), fc2's k-sum parts (one per slice of 128 hidden units) added by the norm step:
    # one launch instead of two a block-step (160 a chunk), fp32 accuracy but not bit for bit the
    # unfused MLP (stages/code2wav/dit_mlp.py). Acts with the open split sums. Off: a replayed
    # chunk took +57.5 % at one request and +92.1 % at two on an H100 (D-DIT-10).
    Option("code2wav_fused_mlp", "fused_mlp", False,
           "with open split sums: fc1 + GELU + fc2 as one launch at up to two requests (CUDA; fp32, not bit-exact)",
           decision="D-DIT-10"),
)
# Chunks of up to this many requests run the DiT's attention as batched GEMMs on CUDA/NPU
# (`dit.attention_by_matmul`, fp32 DiT only), larger ones through scaled_dot_product_attention;
# 0 = always the latter. Small chunks leave a fused attention kernel most of the GPU idle; past 4
# requests the GEMMs stopped paying (D-DIT-2), hence 4.
MATMUL_ATTENTION_KEY = "code2wav_matmul_attention_requests"
MATMUL_ATTENTION_DEFAULT = 4
_MAX_REQUESTS = 4096
# The CFM estimator's (DiT's) precision, with its caches: float32 (default) or bfloat16.
DIT_DTYPE_KEY = "code2wav_dit_dtype"
PROMPT_WAV_KEY = "prompt_wav"
OPTIONS: tuple[Option, ...] = (
    *BOOL_OPTIONS,
    Option(TF32_KEY, "tf32_mode", "off",
           f"off (no TF32, cuDNN too) | conv | flow | all (stages/precision.py); null: env {TF32_ENV}, the alias",
           decision="D-PREC-1"),
    Option(TF32_ALIAS, None, None, f"the older name of {TF32_KEY}, read after the environment"),
    Option(DIT_DTYPE_KEY, "dit_dtype", "float32", "the CFM estimator and its caches: float32 | bfloat16",
           decision="D-DIT-6"),
    Option(MATMUL_ATTENTION_KEY, "matmul_attention_requests", MATMUL_ATTENTION_DEFAULT,
           "chunks of up to this many requests: attention as GEMMs (CUDA/NPU, fp32 DiT); 0 = never",
           decision="D-DIT-2"),
    Option(PROMPT_WAV_KEY, "prompt_wav", None,
           "the default voice's reference audio; null: the packaged voice (the official one with runner.weights)"),
)
KNOWN_KEYS = frozenset(row.key for row in OPTIONS)
_DEFAULTS = defaults(OPTIONS)


def parse_request_count(value: Any, *, key: str, default: int) -> int:
    """A whole number of requests, 0..4096, as an int or its decimal string; null = `default`.
    Booleans and fractions are refused (`true` is not 1 request, 8.5 is no count)."""
    if value is None:
        return default
    number = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        number = int(value.strip())
    if number is None or not 0 <= number <= _MAX_REQUESTS:
        raise FlagError(
            f"error: {key} must be a whole number of requests from 0 to {_MAX_REQUESTS}, got {value!r} "
            f"(code2wav stage extra); write e.g. {default}, or 0 to turn it off"
        )
    return number


def parse_dit_dtype(value: Any) -> str:
    if value is None:
        return "float32"
    name = value.strip().lower() if isinstance(value, str) else value
    aliases = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16"}
    if name not in aliases:
        raise FlagError(
            f"error: {DIT_DTYPE_KEY} must be float32 or bfloat16, got {value!r} (code2wav stage "
            "extra); write float32 (default) or bfloat16"
        )
    return aliases[name]


def parse_prompt_wav(value: Any) -> str | None:
    """A path (a string; empty = null) or null."""
    if value is None or value == "":
        return None
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value)
    raise FlagError(
        f"error: {PROMPT_WAV_KEY} must be a path to an audio file or null, got {value!r} (code2wav stage "
        "extra); write a path, or null for the packaged voice"
    )


def parse_tf32(value: Any, *, key: str) -> Tf32Mode:
    if isinstance(value, bool):
        return "all" if value else "off"
    if isinstance(value, int) and value in (0, 1):
        return "all" if value else "off"
    if isinstance(value, str) and value.strip().lower() in _TF32_TOKENS:
        return _TF32_TOKENS[value.strip().lower()]
    raise FlagError(
        f"error: {key} must be off/conv/flow/all or a boolean, got {value!r} (code2wav stage "
        f"extra); write one of off, conv, flow, all"
    )


def _tf32_from_env(env: Mapping[str, str]) -> Tf32Mode | None:
    raw = env.get(TF32_ENV)
    if not raw or not raw.strip():
        return None
    try:
        return parse_tf32(raw, key=TF32_ENV)
    except FlagError:
        raise EnvFlagError(
            f"error: environment variable {TF32_ENV} must be off/conv/flow/all or a boolean, got "
            f"{raw!r} (environment); set one of off, conv, flow, all, or unset it"
        ) from None


def check_env(env: Mapping[str, str] | None = None) -> None:
    """Raise EnvFlagError (naming the variable) for a code2wav environment flag that is not
    valid; the replicas read them themselves, this only makes a typo fail at config load."""
    env = os.environ if env is None else env
    read_env_opt_out(DEVICE_SPK_ENV, env)
    _tf32_from_env(env)


def resolve_tf32_mode(extra: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Tf32Mode:
    env = os.environ if env is None else env
    primary = None if extra.get(TF32_KEY) is None else parse_tf32(extra[TF32_KEY], key=TF32_KEY)
    from_env = _tf32_from_env(env)
    alias = None if extra.get(TF32_ALIAS) is None else parse_tf32(extra[TF32_ALIAS], key=TF32_ALIAS)
    for mode in (primary, from_env, alias):
        if mode is not None:
            return mode
    return "off"


def check_known_keys(extra: Mapping[str, Any], known: frozenset[str] = KNOWN_KEYS) -> None:
    flags.check_known_keys(extra, known, stage="code2wav")


@dataclass(frozen=True)
class Code2WavOptions:
    """The parsed stage flags (`Code2WavConfig.options`); field defaults are the `OPTIONS` rows'."""

    batched_cache_split: bool = _DEFAULTS["batched_cache_split"]
    device_spk: bool = _DEFAULTS["device_spk"]
    device_graph: bool = _DEFAULTS["device_graph"]
    graph_warmup: bool = _DEFAULTS["graph_warmup"]  # only acts with device_graph on a device
    # Only acts with device_graph and graph_warmup on a device.
    final_chunk_graphs: bool = _DEFAULTS["final_chunk_graphs"]
    fused_norm: bool = _DEFAULTS["fused_norm"]  # only acts where Triton runs (CUDA/NPU)
    frames_first_conv: bool = _DEFAULTS["frames_first_conv"]  # only acts on CUDA
    # Only acts on CUDA with an fp32 DiT and no TF32 GEMMs in the flow.
    dit_tf32x3: bool = _DEFAULTS["dit_tf32x3"]
    # Only acts on CUDA, fp32 DiT, chunks of matmul-attention size.
    triton_attention: bool = _DEFAULTS["triton_attention"]
    fused_conv_norm: bool = _DEFAULTS["fused_conv_norm"]  # only acts with frames_first_conv on CUDA
    conv_gemm: bool = _DEFAULTS["conv_gemm"]  # only acts frames-first with 3xTF32 linears, TF32 off
    fused_snake: bool = _DEFAULTS["fused_snake"]  # only acts on CUDA
    fused_cache_copy: bool = _DEFAULTS["fused_cache_copy"]  # only acts on CUDA
    hift_conv_gemm: bool = _DEFAULTS["hift_conv_gemm"]  # only acts on CUDA with TF32 off
    # Only acts with 3xTF32 linears and conv GEMMs and the fused norm kernels.
    open_split_sums: bool = _DEFAULTS["open_split_sums"]
    norm_writes_conv_window: bool = _DEFAULTS["norm_writes_conv_window"]  # only acts fused and frames-first
    fused_mlp: bool = _DEFAULTS["fused_mlp"]  # only acts with open_split_sums
    tf32_mode: Tf32Mode = _DEFAULTS["tf32_mode"]
    dit_dtype: str = _DEFAULTS["dit_dtype"]  # the CFM estimator's dtype (its caches too)
    matmul_attention_requests: int = _DEFAULTS["matmul_attention_requests"]  # only acts on CUDA/NPU
    prompt_wav: str | None = _DEFAULTS["prompt_wav"]  # the default voice (prompt builder)

    @classmethod
    def from_extra(
        cls, extra: Mapping[str, Any] | None, env: Mapping[str, str] | None = None
    ) -> Code2WavOptions:
        extra = extra or {}
        check_known_keys(extra)
        return cls(
            **{row.field: read_bool_flag(extra, row.key, row.default) for row in BOOL_OPTIONS},
            tf32_mode=resolve_tf32_mode(extra, env),
            dit_dtype=parse_dit_dtype(extra.get(DIT_DTYPE_KEY)),
            matmul_attention_requests=parse_request_count(
                extra.get(MATMUL_ATTENTION_KEY), key=MATMUL_ATTENTION_KEY, default=MATMUL_ATTENTION_DEFAULT),
            prompt_wav=parse_prompt_wav(extra.get(PROMPT_WAV_KEY)),
        )


def tf32_gemms_in_flow(mode: Tf32Mode) -> bool:
    """Whether `mode` runs the flow's fp32 GEMMs in TF32 (then the DiT keeps cuBLAS's TF32)."""
    return mode in ("flow", "all")

