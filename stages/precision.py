"""What runs in what precision: the one table of the stages' precision modes, and how close each
came to the official fp32 decoder.

Code2wav's TF32 mode (`token2wav_allow_tf32`, parsed in stages.code2wav.options) sets torch's two
TF32 flags in its two regions, the flow (flow encoder + CFM with its DiT) and HiFT, through
`stages.platform.precision_scope`. What each mode runs where, on CUDA (elsewhere nothing runs in
TF32; an fp32 DiT assumed, `code2wav_dit_dtype: bfloat16` runs the DiT's GEMMs and convs in bf16
whatever the mode):

| mode | cuDNN convs (flow / HiFT) | cuBLAS GEMMs (flow / HiFT) | DiT linears | DiT attention |
| --- | --- | --- | --- | --- |
| off (default) | fp32 / fp32 (the DiT's causal convs: Triton 3xTF32, D-DIT-8) | fp32 / fp32 | Triton 3xTF32 (fp32-accurate) | Triton 3xTF32 <= 4 requests, GEMMs or SDPA fp32 above |
| conv | TF32 / TF32 | fp32 / fp32 | as off | as off |
| flow | TF32 / TF32 | TF32 / fp32 | cuBLAS TF32 | GEMMs or SDPA, TF32 matmuls |
| all | TF32 / TF32 | TF32 / TF32 | cuBLAS TF32 | as flow |

3xTF32 splits each fp32 product into three TF32 products (2-4e-7 of the output's range against
fp64, cuBLAS fp32 0.3-2e-6; stages/code2wav/dit_gemm.py): fp32 accuracy on tensor cores, so
"off" keeps it. `code2wav_dit_tf32x3: false` / `code2wav_triton_attention: false` give cuBLAS.
The talker runs `runner.dtype` GEMMs with TF32 off (`TALKER_TF32`), SDPA attention in that
dtype, and elementwise Triton kernels (fp32 math); it runs no convolution.

`FIDELITY` holds the measured mel SNR of each mode against the official fp32 decoder, with its
source; a mode below `LOSSY_BELOW_DB` is labelled lossy in the run record (`fidelity`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from stages.platform.device import is_cpu, is_cuda
from stages.platform.precision import FP32, Tf32Flags, live_tf32, precision_scope

Region = str  # "flow" | "hift"


@dataclass(frozen=True)
class CodecMode:
    """A code2wav TF32 mode: the flags of each region, and what that means in words."""

    flow: Tf32Flags
    hift: Tf32Flags
    says: str

    def flags(self, region: Region) -> Tf32Flags:
        return self.flow if region == "flow" else self.hift


_CONV = Tf32Flags(matmul=False, cudnn=True)
_ALL = Tf32Flags(matmul=True, cudnn=True)
CODE2WAV_MODES: dict[str, CodecMode] = {
    "off": CodecMode(FP32, FP32, "no TF32: fp32 cuBLAS GEMMs and cuDNN convs (DiT Triton kernels 3xTF32, fp32-accurate)"),
    "conv": CodecMode(_CONV, _CONV, "TF32 cuDNN convs (torch's default), fp32 GEMMs"),
    "flow": CodecMode(_ALL, _CONV, "TF32 cuDNN convs, TF32 GEMMs in the flow, fp32 GEMMs in HiFT"),
    "all": CodecMode(_ALL, _ALL, "TF32 cuDNN convs and GEMMs everywhere"),
}


def region_scope(mode: str, device: torch.device, *, region: str) -> contextlib.AbstractContextManager[None]:
    """Both TF32 flags for code2wav's `region` ("flow" / "hift") as `mode`'s row of CODE2WAV_MODES
    says, restored after (CUDA only: `precision_scope`, whose lease lets regions that want the same
    flags run side by side on threads of one process, the talker's included)."""
    return precision_scope(device, CODE2WAV_MODES[mode].flags(region))


TALKER_TF32 = FP32  # the talker's GEMMs never round to TF32 (it runs no convolution)

# Mel SNR against the official fp32 decoder. Source: issue 44's H200 table (2026-12-04): the
# official token2wav modules (minicpmo-utils 1.0.7) in strict fp32 against the project's
# Token2Wav, same weights, tokens, speaker embedding and noise. Keys: (platform, mode, DiT dtype).
FIDELITY_SOURCE = "issue 44, H200 table of 2026-12-04 (official token2wav fp32 vs the project, same noise)"
LOSSY_BELOW_DB = 60.0


@dataclass(frozen=True)
class Fidelity:
    mel_snr_db: float
    max_abs_dmel: float
    measured_as: str  # the issue table's row

    @property
    def lossy(self) -> bool:
        return self.mel_snr_db < LOSSY_BELOW_DB


FIDELITY: dict[tuple[str, str, str], Fidelity] = {
    ("cpu", "off", "float32"): Fidelity(107, 2.4e-5, "project on CPU, fp32"),
    # Measured with the DiT's convs on cuDNN fp32; since D-DIT-8 they are 3xTF32 GEMMs (fp32-accurate,
    # 1e-4 from cuDNN's block in the GPU tests), not yet measured against the official decoder.
    ("cuda", "off", "float32"): Fidelity(106, 2.8e-5, "project on CUDA with cuDNN TF32 switched off (DiT convs then cuDNN fp32)"),
    ("cuda", "conv", "float32"): Fidelity(72, 1.5e-3, "project on CUDA, defaults (then: cuDNN TF32 on)"),
    ("cuda", "flow", "float32"): Fidelity(66, 3.2e-3, "project, token2wav_allow_tf32: flow"),
    ("cuda", "all", "float32"): Fidelity(66, 3.2e-3, "project, token2wav_allow_tf32: all"),
    ("cuda", "conv", "bfloat16"): Fidelity(21, 0.55, "project, bf16 DiT (then-default cuDNN TF32)"),
}
_BF16_DIT = FIDELITY[("cuda", "conv", "bfloat16")]


def fidelity(device: torch.device, mode: str, dit_dtype: str) -> dict[str, Any]:
    """The measured mel SNR of this setup against the official fp32 decoder, and whether it is
    lossy; None figures where it was not measured (a bf16 DiT is lossy in every mode: its own
    rounding, 21 dB, dwarfs TF32's)."""
    if is_cuda(device):
        found = FIDELITY.get(("cuda", mode, dit_dtype))
    else:  # no TF32 off CUDA; an NPU was not measured
        found = FIDELITY.get(("cpu", "off", dit_dtype)) if is_cpu(device) else None
    if found is None:
        lossy = True if dit_dtype == "bfloat16" else None
        return {"mel_snr_db": None, "lossy": lossy, "measured_as": None, "source": FIDELITY_SOURCE,
                "note": f"not measured; a bf16 DiT read {_BF16_DIT.mel_snr_db:g} dB" if lossy else "not measured"}
    return {"mel_snr_db": found.mel_snr_db, "max_abs_dmel": found.max_abs_dmel, "lossy": found.lossy,
            "measured_as": found.measured_as, "source": FIDELITY_SOURCE}


def word(flags: Tf32Flags) -> dict[str, str]:
    """{"cudnn_conv", "matmul"}: "tf32" or "fp32" for fp32 tensors under `flags`."""
    return {"cudnn_conv": "tf32" if flags.cudnn else "fp32", "matmul": "tf32" if flags.matmul else "fp32"}


def dit_gemm_precision(kernel: str, dit_dtype: str, flow: Tf32Flags) -> str:
    """What the DiT's linears ran in: `kernel` is DiT.gemm_kernel, `flow` the flow's live flags."""
    if dit_dtype == "bfloat16":
        return "bf16"
    if kernel == "tf32x3":
        return "fp32 (Triton 3xTF32)"
    return "tf32" if flow.matmul else "fp32"


def dit_attention_precision(kernel: str, dit_dtype: str, flow: Tf32Flags) -> str:
    """What the DiT's attention ran in: `kernel` is DiT.attention_kernel ("triton<=N",
    "matmul<=N" or "sdpa"); the GEMM and SDPA paths follow the flow's matmul flag."""
    if dit_dtype == "bfloat16":
        return "bf16"
    rest = "tf32" if flow.matmul else "fp32"
    if kernel.startswith("triton"):
        return f"fp32 (Triton 3xTF32) {kernel.removeprefix('triton')} requests, {rest} above"
    return rest


def code2wav_precision(device: torch.device, options: Any, estimator: Any) -> dict[str, Any]:
    """Each code2wav component's precision, from the TF32 flags torch holds inside the scopes the
    flow and HiFT run in (not from the mode's name), and the setup's fidelity. `options`: the
    stage's Code2WavOptions; `estimator`: its DiT (which GEMM and attention kernels it chose)."""
    live = {}
    for region in ("flow", "hift"):
        with region_scope(options.tf32_mode, device, region=region):
            live[region] = live_tf32(device)
    dtype = options.dit_dtype
    return {
        "mode": CODE2WAV_MODES[options.tf32_mode].says,
        "flow": word(live["flow"]), "hift": word(live["hift"]),
        "dit_gemm": dit_gemm_precision(estimator.gemm_kernel, dtype, live["flow"]),
        "dit_attention": dit_attention_precision(estimator.attention_kernel, dtype, live["flow"]),
        "fidelity": fidelity(device, options.tf32_mode, dtype),
    }


def talker_precision(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """The talker's precision, from torch's flags inside its scope (`TALKER_TF32`)."""
    with precision_scope(device, TALKER_TF32):
        live = live_tf32(device)
    name = str(dtype).removeprefix("torch.")
    matmul = ("tf32" if live.matmul else "fp32") if dtype == torch.float32 else name
    return {"matmul": matmul, "attention": f"sdpa {name}", "triton": "elementwise, fp32 math"}


def ready_phrase(code2wav: dict[str, Any] | None, *, deterministic: bool) -> str:
    """What the runner's ready line says of precision, from a replica's facts (its describe())."""
    facts = code2wav or {}
    precision = facts.get("precision") or {}
    fid = precision.get("fidelity") or {}
    snr = fid.get("mel_snr_db")
    said = f"{snr:g} dB mel SNR against the official fp32 decoder" if snr is not None else "fidelity not measured"
    lossy = ", lossy" if fid.get("lossy") else ""
    mode = facts.get("tf32_mode", "unknown")
    kernels = f"deterministic kernels {'on' if deterministic else 'off'}"
    if deterministic and any("tf32" in (precision.get(r) or {}).values() for r in ("flow", "hift")):
        kernels += f" (but TF32 {mode}: identical requests are not promised identical audio)"
    return f"code2wav TF32 {mode} ({said}{lossy}), {kernels}"
