"""Which kernels the DiT runs: one decision per replica, from the stage options, device and dtype.

`resolve(options, cfg, device, dtype)` decides four things and says why, as a `DiTKernels`:
* norm: the step between a block's branches (residual add + LayerNorm + adaLN modulation) as
  the eager torch chain or one Triton launch (`dit_triton`), and with it attention's q|k|v GEMM
  with the Triton q/k norm and cache write (`code2wav_fused_norm`, where Triton runs);
* attention: chunks of up to `code2wav_matmul_attention_requests` requests as batched GEMMs
  (`dit.attention_by_matmul`, CUDA/NPU) or one Triton kernel (`dit_flash`, CUDA, fp32,
  `code2wav_triton_attention`); larger chunks, and the CPU, scaled_dot_product_attention;
* conv: the causal convs frames-first (CUDA, `code2wav_frames_first_conv`) or channels-first as
  the checkpoint lays them out; frames-first, the block's LayerNorm + Mish + cache writes as one
  Triton launch (`dit_conv_triton`, `code2wav_fused_conv_norm`) and the convs themselves as
  3xTF32 GEMMs over the window (`dit_gemm.causal_conv`, `code2wav_conv_gemm`: only where the
  linears are 3xTF32 and no TF32 is asked for) or cuDNN's channels-last 2-D convs;
* gemm: the linears as Triton 3xTF32 GEMMs (`dit_gemm`, CUDA, fp32 DiT, `code2wav_dit_tf32x3`)
  or torch's (on CUDA with the GELU as cuBLASLt's epilogue).
The launch fusions across those kernels (split k-sums left open, the conv window written by the
norm step, and the opt-in MLP branch as one launch) are chosen by `stages.code2wav.fusions` once
these are known.
The slot pool's attention-cache copies (a chunk's per-step load and trimmed store, the conformer's
gather) as one Triton pass each way or torch's chains: `cache_copy_kernel`, handed to the
`ChunkDecoder`. HiFT's two choices, its stride-1 convs as 3xTF32 Triton GEMMs or cuDNN's
(`hift_conv_kernel`) and its Snake activations as one Triton launch each or the module's formula
(`snake_kernel`), are handed to `HiFTGenerator.use_kernels`.
The one cross-flag rule lives here too: with TF32 GEMMs in the flow (`token2wav_allow_tf32`
flow/all) the 3xTF32 GEMMs stand down, since one-pass TF32 is what the user asked for.

Kernels that must compile are compiled here, outside any graph capture (`warm_up`s on tiny
inputs); one that fails leaves its torch twin, with the reason logged and recorded. The DiT is
then handed the choice (`DiT.use_kernels`), which only wires callables in: the model asks no
device anything. Each part's `name` is what the run record's `dit_*` keys say ran, its `reason`
what the log says and why the others did not.

    kernels = resolve(cfg.options, cfg.dit, device, torch.float32)
    dit.use_kernels(kernels)
    kernels.describe()  # {"dit_norm": "eager", "dit_attention": "sdpa", "dit_conv": ..., "dit_gemm": ...}
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import nn

from stages.code2wav.config import DiTConfig
from stages.code2wav.dit import MOD_LN_EPS, residual_norm_modulate_eager, torch_linear
from stages.code2wav.dit_conv import CONV_LN_EPS
from stages.code2wav.fusions import conv_window_ready, fused_mlp, open_sums_ready
from stages.code2wav.options import Code2WavOptions, tf32_gemms_in_flow
from stages.platform import compile_failure, is_cpu, is_cuda, tf32_tensor_cores, triton_unavailable_reason

log = logging.getLogger(__name__)

Linear = Callable[..., torch.Tensor]  # (x, weight, bias, *, gelu=False, open_sum=False) -> x @ weight.T + bias


def torch_linear_epilogue(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *,
                          gelu: bool = False, open_sum: bool = False) -> torch.Tensor:
    """`dit.torch_linear` on CUDA: with the GELU, bias and activation are cuBLASLt's GEMM epilogue
    (`_addmm_activation`), one launch fewer. Not elsewhere: torch's CPU `_addmm_activation`
    applies the exact (erf) GELU, not the tanh one the checkpoint's MLP uses (4.7e-4 apart at
    unit scale). `open_sum` is ignored, as `dit.torch_linear` ignores it."""
    if not gelu:
        return torch.nn.functional.linear(x, weight, bias)
    *lead, c = x.shape
    out = torch._addmm_activation(bias, x.reshape(-1, c), weight.t(), use_gelu=True)
    return out.view(*lead, weight.shape[0])


def residual_norm_modulate_fused(x, gate, y, shift, scale, *, eps: float, history=None):
    """`dit.residual_norm_modulate_eager` as one Triton launch (`dit_triton`; x updated in place)."""
    from stages.code2wav.dit_triton import residual_norm_modulate  # lazy: loads triton

    if not x.is_contiguous():  # the kernel updates x in place, so it needs its own dense copy
        x = x.contiguous()
    return x, residual_norm_modulate(x, gate, y, shift, scale, eps=eps, history=history)


@dataclass(frozen=True)
class NormKernel:
    fused: bool = False  # the Triton norm steps, and attention's q|k|v GEMM + q/k norm and cache write
    reason: str = "eager (not resolved)"

    @property
    def name(self) -> str:
        return "triton" if self.fused else "eager"

    @property
    def step(self) -> Callable:
        """The step between two branches of a block (residual + LayerNorm + modulation)."""
        return residual_norm_modulate_fused if self.fused else residual_norm_modulate_eager

    @property
    def qk_norm_to_cache(self) -> Callable | None:
        """Attention's prologue after the one q|k|v GEMM (q/k LayerNorms + K/V cache write), or
        None: the modules' ops."""
        if not self.fused:
            return None
        from stages.code2wav.dit_triton import qk_norm_to_cache  # lazy: loads triton

        return qk_norm_to_cache


@dataclass(frozen=True)
class AttentionKernel:
    max_requests: int = 0  # the flag's value
    matmul_rows: int = 0  # DiT rows (2 a request, CFG) up to which a chunk leaves SDPA; 0: never
    flash: Callable | None = None  # those rows through `dit_flash.attention`, else batched GEMMs
    reason: str = "scaled_dot_product_attention (not resolved)"

    @property
    def name(self) -> str:
        if not self.matmul_rows:
            return "sdpa"
        return f"{'triton' if self.flash else 'matmul'}<={self.max_requests}"


@dataclass(frozen=True)
class ConvLayout:
    frames_first: bool = False
    reason: str = "channels-first (not resolved)"
    # Frames-first only: the block's LayerNorm + Mish + conv2 window + cache writes as one
    # Triton launch (`dit_conv_triton.ln_mish_window`), or None: the modules' ops.
    ln_mish: Callable | None = None
    # Frames-first only: the two convs as 3xTF32 Triton GEMMs over the window in place
    # (`dit_gemm.causal_conv`), or None: cuDNN.
    gemm: Callable | None = None

    @property
    def name(self) -> str:
        return "frames-first" if self.frames_first else "channels-first"

    @property
    def norm_name(self) -> str:
        return "triton" if self.ln_mish else "eager"

    @property
    def gemm_name(self) -> str:
        return "tf32x3" if self.gemm else "cudnn"


@dataclass(frozen=True)
class GemmKernel:
    linear: Linear = torch_linear
    tf32x3: bool = False
    reason: str = "torch (not resolved)"

    @property
    def name(self) -> str:
        return "tf32x3" if self.tf32x3 else "torch"


@dataclass(frozen=True)
class DiTKernels:
    """What the DiT runs; the defaults are an unresolved DiT's (eager, SDPA, channels-first, torch)."""

    norm: NormKernel = NormKernel()
    attention: AttentionKernel = AttentionKernel()
    conv: ConvLayout = ConvLayout()
    gemm: GemmKernel = GemmKernel()
    # proj's, fc2's and the convs' split k-sums left open for the fused kernel after them (`dit_gemm.OpenSum`)
    open_sums: bool = False
    # frames-first: the norm step before each conv block writes the conv's input window
    conv_window: bool = False
    # fc1 + GELU + fc2 as one launch up to `fused_mlp_rows` rows (`dit_mlp.mlp`; needs open_sums)
    fused_mlp: Callable | None = None
    fused_mlp_rows: int = 0

    def describe(self) -> dict[str, str]:
        """The run record's one-word names (Token2Wav.describe's `dit_*` keys)."""
        return {"dit_norm": self.norm.name, "dit_attention": self.attention.name, "dit_conv": self.conv.name,
                "dit_conv_norm": self.conv.norm_name, "dit_conv_gemm": self.conv.gemm_name, "dit_gemm": self.gemm.name}

    def reasons(self) -> dict[str, str]:
        """What runs and why the other branches do not, one line a part (the log's words)."""
        opened = "; split k-sums of proj, fc2 and the convs added by the next fused kernel" if self.open_sums else ""
        window = "; the norm step writes each conv's input window" if self.conv_window else ""
        mlp = (f"; fc1 + GELU + fc2 as one launch up to {self.fused_mlp_rows} rows, its parts added by the norm step"
               if self.fused_mlp else "")
        return {"norm": self.norm.reason + window, "attention": self.attention.reason, "convs": self.conv.reason,
                "linears": self.gemm.reason + opened + mlp}


def resolve(options: Code2WavOptions, cfg: DiTConfig, device: torch.device, dtype: torch.dtype) -> DiTKernels:
    """The DiT's kernels for `options` on `device`, for a DiT (its weights) of `dtype`."""
    gemm = gemm_kernel(options.dit_tf32x3, cfg, device, dtype, tf32_flow=tf32_gemms_in_flow(options.tf32_mode))
    norm = norm_kernel(options.fused_norm, cfg, device, dtype)
    conv = conv_layout(options.frames_first_conv, device, fused_norm=options.fused_conv_norm, dtype=dtype,
                       channels=cfg.hidden_size, gemm_off=conv_gemm_unwanted(options, gemm))
    open_sums = options.open_split_sums and open_sums_ready(cfg, device, norm, conv, gemm)
    mlp, mlp_rows = fused_mlp(cfg, device) if options.fused_mlp and open_sums else (None, 0)
    return DiTKernels(
        norm=norm,
        attention=attention_kernel(options.matmul_attention_requests, cfg, device, dtype,
                                   triton=options.triton_attention),
        conv=conv,
        gemm=gemm,
        open_sums=open_sums,
        conv_window=options.norm_writes_conv_window and conv_window_ready(cfg, device, norm, conv),
        fused_mlp=mlp,
        fused_mlp_rows=mlp_rows,
    )


def tf32x3_unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the 3xTF32 Triton kernels (`dit_gemm`, `dit_flash`) cannot run for a DiT of `dtype` on
    `device`, or None: fp32 only, on CUDA with TF32 tensor cores (the CPU only under
    TRITON_INTERPRET=1, for tests; an NPU keeps its own kernels: 3xTF32 is a CUDA scheme)."""
    if dtype != torch.float32:
        return f"the DiT is {str(dtype).removeprefix('torch.')}"
    if not (is_cuda(device) or is_cpu(device)):
        return f"not CUDA ({device.type})"
    if is_cuda(device) and not tf32_tensor_cores(device):
        return "no TF32 tensor cores (CUDA compute capability below 8.0)"
    return triton_unavailable_reason(device)


def norm_kernel(fused: bool, cfg: DiTConfig, device: torch.device, dtype: torch.dtype) -> NormKernel:
    """The fused norm steps when `fused` and Triton runs on `device` (a CUDA/NPU device; the CPU
    only under TRITON_INTERPRET=1), compiled now; if that fails the eager chain stays."""
    reason = "stage extra code2wav_fused_norm is false" if not fused else triton_unavailable_reason(device)
    if reason is None:
        from stages.code2wav import dit_triton  # lazy: loads triton

        # The q/k LayerNorms the kernel reads, as the DiT's Attention holds them (no RNG drawn).
        heads = SimpleNamespace(h=cfg.num_heads, d=cfg.head_dim,
                                q_norm=nn.LayerNorm(cfg.head_dim, device=device, dtype=dtype),
                                k_norm=nn.LayerNorm(cfg.head_dim, device=device, dtype=dtype))
        reason = compile_failure(lambda: dit_triton.warm_up(device, dtype, cfg.hidden_size, MOD_LN_EPS, heads),
                                 "the fused kernels", "the eager norm chain", log=log, owner="DiT")
    if reason is None:
        return NormKernel(True, "fused Triton norm steps (residual + LayerNorm + modulation; q/k norms + cache write)")
    return NormKernel(False, f"eager ({reason})")


def attention_kernel(max_requests: int, cfg: DiTConfig, device: torch.device, dtype: torch.dtype, *,
                     triton: bool = False) -> AttentionKernel:
    """Attention of chunks of up to `max_requests` requests (2 DiT rows each, CFG) as batched
    GEMMs on a CUDA/NPU device, in fp32 (the DiT routes only fp32 there; with TF32 matmuls on,
    those GEMMs are TF32 too); larger chunks, a bf16 DiT and the CPU keep
    `scaled_dot_product_attention` (0 = always). With `triton`, on CUDA (the CPU under
    TRITON_INTERPRET=1, for tests), those small fp32 chunks run one Triton kernel instead
    (`dit_flash`: online softmax, 3xTF32 dots), compiled now; if that fails the GEMMs stay."""
    on_device = not is_cpu(device)  # CUDA or NPU
    flash = None
    if not triton:
        flash_reason = "code2wav_triton_attention is false"
    elif not max_requests:
        flash_reason = "code2wav_matmul_attention_requests is 0"
    else:
        flash_reason = tf32x3_unavailable(device, dtype)
    if flash_reason is None:
        from stages.code2wav import dit_flash  # lazy: loads triton

        h, d = cfg.num_heads, cfg.head_dim
        flash_reason = compile_failure(
            lambda: dit_flash.attention(torch.zeros(1, 1, h, d, device=device), torch.zeros(1, h, 1, 2 * d, device=device)),
            "the Triton attention", "batched GEMMs", log=log, owner="DiT")
        if flash_reason is None:
            flash = dit_flash.attention
    rows = 2 * max_requests if (on_device or flash) else 0
    if flash:
        said = f"one Triton kernel (3xTF32) up to {max_requests} requests a chunk, scaled_dot_product_attention above"
        return AttentionKernel(max_requests, rows, flash, said)
    if not on_device:
        said = "scaled_dot_product_attention (the CPU)"
    elif not max_requests:
        said = "scaled_dot_product_attention (code2wav_matmul_attention_requests is 0)"
    else:
        said = f"batched GEMMs up to {max_requests} requests a chunk, scaled_dot_product_attention above"
    return AttentionKernel(max_requests, rows, None, f"{said}; Triton attention: {flash_reason}" if triton else said)


def tf32_convs_asked(tf32_mode: str) -> str | None:
    """Why a conv GEMM stands down for TF32 (None: TF32 is off): one-pass TF32 cuDNN convs are
    what the user chose (`token2wav_allow_tf32`), for the DiT's convs and HiFT's alike."""
    return None if tf32_mode == "off" else f"TF32 convs asked for (token2wav_allow_tf32: {tf32_mode})"


def conv_gemm_unwanted(options: Code2WavOptions, gemm: GemmKernel) -> str | None:
    """Why the DiT's convs stay cuDNN's whatever the device (None: the 3xTF32 GEMMs are wanted):
    the flag, linears that are not 3xTF32 (a bf16 DiT, TF32 flow GEMMs, no Triton), or TF32
    convs asked for (one-pass TF32 cuDNN is then what the user chose)."""
    if not options.conv_gemm:
        return "code2wav_conv_gemm is false"
    if not gemm.tf32x3:
        return "the linears are not 3xTF32 GEMMs"
    return tf32_convs_asked(options.tf32_mode)


def conv_layout(frames_first: bool, device: torch.device, *, fused_norm: bool = False,
                dtype: torch.dtype = torch.float32, channels: int = 512,
                gemm_off: str | None = "not asked") -> ConvLayout:
    """Frames-first causal convs when asked and on CUDA, where cuDNN otherwise transforms every
    conv's input and output between layouts; the CPU and an NPU keep the checkpoint's
    channels-first convs (measured on CUDA only). Frames-first, with `fused_norm` the block's
    LayerNorm + Mish + conv2 window + cache writes run as one Triton launch, compiled now for
    `dtype`; with `gemm_off` None the two convs run as 3xTF32 Triton GEMMs over the window
    (`dit_gemm.causal_conv`: fp32-accurate on tensor cores, where cuDNN's fp32 convs run on CUDA
    cores with layout transforms around them), compiled now (`resolve` says None only for an
    fp32 DiT whose linears are 3xTF32 and no TF32 asked for). If a compile fails, that part
    keeps the modules' ops or cuDNN."""
    if not (frames_first and is_cuda(device)):
        why = "code2wav_frames_first_conv is false" if not frames_first else f"not CUDA ({device.type})"
        return ConvLayout(False, f"channels-first ({why})")
    ln_mish, gemm = None, None
    if not fused_norm:
        norm_said = "LayerNorm + Mish eager (code2wav_fused_conv_norm is false)"
    else:
        from stages.code2wav import dit_conv_triton  # lazy: loads triton

        reason = compile_failure(lambda: dit_conv_triton.warm_up(device, dtype, channels, CONV_LN_EPS),
                                 "the Triton conv-block norm", "the eager LayerNorm + Mish", log=log, owner="DiT")
        norm_said = f"LayerNorm + Mish eager ({reason})" if reason else "LayerNorm + Mish + cache writes as one Triton launch"
        ln_mish = None if reason else dit_conv_triton.ln_mish_window
    if gemm_off is None:
        from stages.code2wav import dit_gemm  # lazy: loads triton

        gemm_off = compile_failure(lambda: dit_gemm.warm_up_conv(device, channels), "the Triton conv GEMM",
                                   "cuDNN's convs", log=log, owner="DiT")
        gemm = None if gemm_off else dit_gemm.causal_conv
    conv_said = "3xTF32 Triton GEMMs over the window" if gemm else f"cuDNN channels-last 2-D convs ({gemm_off})"
    return ConvLayout(True, f"frames-first, {conv_said}; {norm_said}", ln_mish, gemm)


def gemm_kernel(tf32x3: bool, cfg: DiTConfig, device: torch.device, dtype: torch.dtype, *,
                tf32_flow: bool) -> GemmKernel:
    """The DiT's linears (in_proj, q|k|v, proj, fc1 + GELU, fc2, final) as Triton GEMMs with
    3xTF32 products (`dit_gemm`: fp32 accuracy on tensor cores) when asked, on CUDA (the CPU
    only under TRITON_INTERPRET=1, for tests; an NPU keeps its own GEMMs), with an fp32 DiT and no
    TF32 for the flow (`tf32_flow`: then cuBLAS's one-pass TF32 is what the user asked for, and
    faster). On CUDA every tile is compiled now; if that fails torch's linears stay. The timestep
    and adaLN linears stay torch's: they run once per weights (`CausalCFM.step_modulations`)."""
    torch_gemm = torch_linear_epilogue if is_cuda(device) else torch_linear
    if not tf32x3:
        reason = "code2wav_dit_tf32x3 is false"
    elif tf32_flow:
        reason = "TF32 matmuls are on for the flow (token2wav_allow_tf32)"
    else:
        reason = tf32x3_unavailable(device, dtype)
    if reason is None:
        from stages.code2wav import dit_gemm  # lazy: loads triton

        if is_cuda(device):  # the interpreter (CPU) compiles nothing
            reason = compile_failure(lambda: dit_gemm.warm_up(device, linear_shapes(cfg)),
                                     "the Triton GEMM", "torch's linears", log=log, owner="DiT")
    if reason is not None:
        return GemmKernel(torch_gemm, False, f"torch ({reason})")
    return GemmKernel(dit_gemm.linear, True,
                      "Triton GEMMs with 3xTF32 products (fp32 accuracy on tensor cores; bias and GELU fused)")


@dataclass(frozen=True)
class SnakeKernel:
    """HiFT's Snake activation: `fn(x, alpha)` (the Triton launch) or None (the module's formula)."""

    fn: Callable | None = None
    reason: str = "eager (not resolved)"

    @property
    def name(self) -> str:
        return "triton" if self.fn else "eager"


def cuda_triton_unavailable(device: torch.device) -> str | None:
    """Why a CUDA-only Triton kernel cannot run on `device` (None: it can): CUDA, or the CPU under
    TRITON_INTERPRET=1 (tests); an NPU keeps torch's ops (these kernels call CUDA's libdevice or
    were only measured on CUDA)."""
    if not (is_cuda(device) or is_cpu(device)):
        return f"not CUDA ({device.type})"
    return triton_unavailable_reason(device)


def snake_kernel(fused: bool, device: torch.device) -> SnakeKernel:
    """HiFT's Snakes as one Triton launch each (`hift_triton`, bit for bit the module's formula)
    when `fused`, on CUDA (the CPU only under TRITON_INTERPRET=1, for tests; an NPU keeps the
    module's ops: the kernel calls CUDA's libdevice), compiled now; if that fails the module's
    formula stays. HiFT runs fp32 whatever the flow's dtype, so no dtype is asked."""
    reason = "code2wav_fused_snake is false" if not fused else cuda_triton_unavailable(device)
    if reason is None:
        from stages.code2wav import hift_triton  # lazy: loads triton

        reason = compile_failure(lambda: hift_triton.warm_up(device), "the Triton Snake", "the module's Snake",
                                 log=log, owner="HiFT")
        if reason is None:
            return SnakeKernel(hift_triton.snake, "one Triton launch a Snake (bit for bit the module's formula)")
    return SnakeKernel(None, f"the module's formula, eight launches ({reason})")


@dataclass(frozen=True)
class HiFTConvKernel:
    """HiFT's stride-1 convs: `fn(x, weight, bias, *, dilation, padding)` (one 3xTF32 Triton
    implicit GEMM, `hift_conv_triton.conv1d`) or None (the modules' cuDNN convs)."""

    fn: Callable | None = None
    reason: str = "cuDNN (not resolved)"

    @property
    def name(self) -> str:
        return "tf32x3" if self.fn else "cudnn"


def hift_conv_kernel(enabled: bool, device: torch.device, tf32_mode: str, convs: Sequence[nn.Conv1d]) -> HiFTConvKernel:
    """HiFT's ResBlock convs, conv_pre and conv_post (`HiFTGenerator.gemm_convs`) as 3xTF32 Triton
    GEMMs when `enabled`, on CUDA (the CPU only under TRITON_INTERPRET=1, for tests; an NPU keeps
    its convs), with no TF32 asked for (then one-pass TF32 cuDNN is what the user chose, as for
    the DiT's convs), compiled now for every shape in `convs`; if that fails cuDNN stays."""
    if not enabled:
        reason = "code2wav_hift_conv_gemm is false"
    else:
        reason = tf32_convs_asked(tf32_mode) or cuda_triton_unavailable(device)
    if reason is None:
        from stages.code2wav import hift_conv_triton  # lazy: loads triton

        shapes = sorted({(c.in_channels, c.out_channels, c.kernel_size[0], c.bias is not None) for c in convs})
        if is_cuda(device):  # the interpreter (CPU) compiles nothing
            reason = compile_failure(lambda: hift_conv_triton.warm_up(device, shapes), "the Triton conv GEMM",
                                     "cuDNN's convs", log=log, owner="HiFT")
        if reason is None:
            return HiFTConvKernel(hift_conv_triton.conv1d, "3xTF32 Triton implicit GEMMs (fp32 accuracy on tensor cores)")
    return HiFTConvKernel(None, f"cuDNN's convs ({reason})")


@dataclass(frozen=True)
class CacheCopyKernel:
    """The attention-cache copies between the slot pool and a chunk's buffers: `gather(src,
    index, dst, at=, frames=)` and `scatter(src, index, dst, spans)` (one Triton pass each,
    `cache_copy_triton`), or None: torch's `index_select` / `cat` / `index_put_` chains."""

    gather: Callable | None = None
    scatter: Callable | None = None
    reason: str = "torch (not resolved)"

    @property
    def name(self) -> str:
        return "triton" if self.gather else "torch"


def cache_copy_kernel(fused: bool, device: torch.device, dtypes: Sequence[torch.dtype],
                      widths: Sequence[int]) -> CacheCopyKernel:
    """The pool's attention-cache copies as one Triton pass each way (`cache_copy_triton`, bit
    for bit torch's copies) when `fused`, on CUDA (the CPU only under TRITON_INTERPRET=1, for
    tests; an NPU keeps torch's ops), compiled now for every cache dtype and K|V width in
    `dtypes` x `widths` (the variants a chunk launches: none may compile inside a capture); if
    that fails torch's ops stay."""
    reason = "code2wav_fused_cache_copy is false" if not fused else cuda_triton_unavailable(device)
    if reason is None:
        from stages.code2wav import cache_copy_triton  # lazy: loads triton

        def warm_up() -> None:
            for dtype in dict.fromkeys(dtypes):
                for width in dict.fromkeys(widths):
                    cache_copy_triton.warm_up(device, dtype, width)

        reason = compile_failure(warm_up, "the Triton cache copy", "torch's index_select / index_put_",
                                 log=log, owner="code2wav")
        if reason is None:
            return CacheCopyKernel(cache_copy_triton.gather_frames, cache_copy_triton.scatter_frames,
                                   "one Triton pass each way (bit for bit torch's copies)")
    return CacheCopyKernel(None, None, f"torch's index_select / cat / index_put_ ({reason})")


def linear_shapes(cfg: DiTConfig) -> list[tuple[int, int, bool, bool]]:
    """(N, K, bias?, gelu?) of every linear `gemm_kernel` routes: in_proj, proj, fc1 + GELU, fc2,
    final and the fused q|k|v (unfused attention's q, k and v have proj's shape)."""
    inner, hidden, mlp = cfg.num_heads * cfg.head_dim, cfg.hidden_size, int(cfg.hidden_size * cfg.mlp_ratio)
    shapes = {(hidden, cfg.in_channels, True, False), (hidden, inner, True, False), (mlp, hidden, True, True),
              (hidden, mlp, True, False), (cfg.out_channels, hidden, True, False), (3 * inner, hidden, True, False)}
    return sorted(shapes)
