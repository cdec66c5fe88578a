"""HiFT vocoder (CosyVoice HiFTGenerator: NSF source + iSTFTNet), 80-bin mel -> 24 kHz audio.

Spec §4.5. Parameter names match the official `hift.pt` (after `hift_weights` strips a
`generator.` prefix and maps legacy weight-norm names), so the checkpoint loads strictly:
328 keys / 20,821,295 parameters at full size (f0 predictor 3,274,241).

Pipeline for a mel chunk [B, 80, T]:
  f0 = |Linear(ConvStack(mel))| -> nearest x480 -> NSF source [B, 1, T*480] (8 harmonics)
  -> STFT(16, 4) -> 18 channels; conv_pre -> 3 x (leaky_relu, ConvTranspose x8/x5/x3, + source
  branch, mean of 3 ResBlocks) -> conv_post -> exp-magnitude / sin-phase -> iSTFT(16, 4).

Landmines:
* The NSF source is random (initial harmonic phases and additive noise). Pass a
  `torch.Generator` to `inference` for reproducible audio; without one the global RNG is used,
  as upstream does. The draws depend on the batch shape, so a row's audio differs slightly
  between batch compositions. In streaming, the cached source overwrites the start of the new
  source so consecutive chunks stay phase-continuous regardless.
* The final activation before `conv_post` is leaky_relu with torch's default slope 0.01, not
  `lrelu_slope` — upstream does that and the weights were trained with it.
* `fold_weight_norm` replaces every weight-norm parametrization by its computed weight, once.
  The stored tensor is exactly what the parametrization returns, so folded output is
  bit-identical (tested with torch.equal) and each forward saves 82 norm computations.

* The source is SineGen2 (frame-rate phase integration), which upstream selects for every
  sample rate other than 22050 Hz; the 22.05 kHz per-sample SineGen is not implemented.

Streaming: `chunk_decode.ChunkDecoder` vocodes batches against the slot pool; `HiFTStream`
(over per-row `HiFTState`, bottom of this file) is the plain per-row reference of the same
contract, which the tests hold the pooled path to byte for byte.

    hift = HiFTGenerator(HiFTConfig()).eval()
    speech, source = hift.inference(mel, torch.zeros(1, 1, 0))   # mel [1, 80, T] -> [1, T*480]
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm

from stages.code2wav import noise
from stages.code2wav.config import HiFTConfig

if TYPE_CHECKING:
    from stages.code2wav.kernels import HiFTConvKernel, SnakeKernel

ConvFn = Callable[..., torch.Tensor]  # (x, weight, bias, *, dilation, padding) -> F.conv1d's result


def _pad(kernel_size: int, dilation: int = 1) -> int:
    return (kernel_size * dilation - dilation) // 2


def _wn_conv(*args, **kwargs) -> nn.Conv1d:
    conv = nn.Conv1d(*args, **kwargs)
    nn.init.normal_(conv.weight, 0.0, 0.01)  # upstream init_weights (HiFi-GAN)
    return weight_norm(conv)


def gemm_ready(conv: nn.Module) -> bool:
    """Whether `conv` is a conv the Triton GEMM (`hift_conv_triton.conv1d`) computes: a Conv1d of
    stride 1, one group, zero padding given as a number."""
    return (isinstance(conv, nn.Conv1d) and conv.stride == (1,) and conv.groups == 1
            and conv.padding_mode == "zeros" and not isinstance(conv.padding, str))


def run_conv(conv: nn.Conv1d, x: torch.Tensor, gemm: ConvFn | None) -> torch.Tensor:
    """`conv(x)`, through `gemm` (wired in by `HiFTGenerator.use_kernels` for `gemm_ready` convs
    only) when x is contiguous fp32, the GEMM's input."""
    if gemm is not None and x.dtype == torch.float32 and x.is_contiguous():
        return gemm(x, conv.weight, conv.bias, dilation=conv.dilation[0], padding=conv.padding[0])
    return conv(x)


class Snake(nn.Module):
    """x + 1/alpha * sin²(alpha x), alpha per channel (linear scale)."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))
        # (x, alpha) -> the same formula in one launch (`HiFTGenerator.use_kernels`); it takes
        # contiguous fp32 input, which every Snake here gets (a conv's output or a sum of them).
        self.fused: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, C, T]
        if self.fused is not None and x.dtype == torch.float32 and x.is_contiguous():
            return self.fused(x, self.alpha)
        alpha = self.alpha[None, :, None]
        return x + (1.0 / (alpha + 1e-9)) * torch.sin(x * alpha).pow(2)


class ResBlock(nn.Module):
    """HiFi-GAN residual block with Snake activations (one pair of convs per dilation)."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]):
        super().__init__()
        self.convs1 = nn.ModuleList(
            _wn_conv(channels, channels, kernel_size, 1, dilation=d, padding=_pad(kernel_size, d)) for d in dilations
        )
        self.convs2 = nn.ModuleList(
            _wn_conv(channels, channels, kernel_size, 1, padding=_pad(kernel_size)) for _ in dilations
        )
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.gemm: ConvFn | None = None  # the convs as Triton GEMMs (`HiFTGenerator.use_kernels`)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, C, T]
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, self.activations1, self.activations2):
            x = x + run_conv(c2, a2(run_conv(c1, a1(x), self.gemm)), self.gemm)
        return x


class ConvRNNF0Predictor(nn.Module):
    """f0 (Hz, >= 0) per mel frame: 5 x (weight-normed Conv1d k3 + ELU) -> Linear -> abs."""

    def __init__(self, in_channels: int, channels: int, num_layers: int = 5):
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(num_layers):
            layers += [weight_norm(nn.Conv1d(in_channels if i == 0 else channels, channels, 3, padding=1)), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, 1)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:  # mel: [B, 80, T] -> [B, T]
        x = self.condnet(mel).transpose(1, 2)
        return torch.abs(self.classifier(x).squeeze(-1))


@dataclass(frozen=True)
class NoiseKeys:
    """Counter-based noise (`stages.code2wav.noise`): one int64 key per row, derived from the
    request's seed and chunk number. Draws are pure functions of the key and the element index,
    so they are graph-capturable and independent of batch company."""

    keys: torch.Tensor  # [B] int64


# One generator for the whole batch, or counter-based keys. Keys make a row's NSF noise
# independent of which other requests share its batch, so a request's audio does not change with
# scheduling (the A/B output-identity check depends on that), and they replay inside a device
# graph.
Generators = torch.Generator | NoiseKeys | None

# Counter streams of the two NSF draws (distinct, so the phases and the noise never correlate).
_PHASE_STREAM, _NOISE_STREAM = 1, 3


def _draw(fn, shape: tuple[int, ...], like: torch.Tensor, generator: Generators) -> torch.Tensor:
    """fn (torch.rand / torch.randn) of `shape` [B, ...], from one generator or counter keys."""
    if isinstance(generator, NoiseKeys):
        draw, stream = (noise.uniform, _PHASE_STREAM) if fn is torch.rand else (noise.normal, _NOISE_STREAM)
        return draw(generator.keys, stream=stream, shape=shape[1:], dtype=like.dtype)
    return fn(shape, device=like.device, dtype=like.dtype, generator=generator)


class SourceModuleHnNSF2(nn.Module):
    """Harmonic-plus-noise NSF source (CosyVoice2 SineGen2 at 24 kHz) merged to one channel.

    Phase is integrated at frame rate (linear down-interpolation, cumsum, linear up-interpolation)
    rather than per sample, as upstream does for the 24 kHz models.
    """

    def __init__(self, cfg: HiFTConfig):
        super().__init__()
        self.sampling_rate = cfg.sampling_rate
        self.upsample_scale = cfg.samples_per_frame
        self.harmonics = cfg.nb_harmonics + 1
        self.sine_amp = cfg.nsf_alpha
        self.noise_std = cfg.nsf_sigma
        self.voiced_threshold = cfg.nsf_voiced_threshold
        self.l_linear = nn.Linear(self.harmonics, 1)

    def _sines(self, fn: torch.Tensor, generator: Generators) -> torch.Tensor:
        # fn: [B, L, H] harmonic frequencies in Hz at sample rate -> sin(phase) [B, L, H]
        rad = (fn / self.sampling_rate) % 1
        rand_ini = _draw(torch.rand, (fn.shape[0], fn.shape[2]), fn, generator)
        rand_ini[:, 0] = 0  # the fundamental starts at phase 0
        rad[:, 0, :] = rad[:, 0, :] + rand_ini
        rad = F.interpolate(rad.transpose(1, 2), scale_factor=1 / self.upsample_scale, mode="linear")
        phase = torch.cumsum(rad, dim=2) * 2 * math.pi
        phase = F.interpolate(phase * self.upsample_scale, scale_factor=float(self.upsample_scale), mode="linear")
        return torch.sin(phase).transpose(1, 2)

    def forward(self, f0: torch.Tensor, generator: Generators = None) -> torch.Tensor:
        # f0: [B, L, 1] Hz at sample rate -> source [B, L, 1]
        with torch.no_grad():
            harm = torch.arange(1, self.harmonics + 1, device=f0.device, dtype=f0.dtype)
            sines = self._sines(f0 * harm, generator) * self.sine_amp
            uv = (f0 > self.voiced_threshold).to(sines.dtype)
            noise_amp = uv * self.noise_std + (1 - uv) * self.sine_amp / 3
            noise = noise_amp * _draw(torch.randn, tuple(sines.shape), sines, generator)
            sines = sines * uv + noise
        return torch.tanh(self.l_linear(sines))


def overlap_add(frames: torch.Tensor, hop: int) -> torch.Tensor:
    """[B, F, n_fft] frames -> [B, n_fft + hop * (F - 1)] summed where they overlap.

    n_fft is a multiple of hop, so each output block of `hop` samples is the sum of n_fft / hop
    frame segments: that many shifted adds, always in the same order. (aten's overlap-add,
    `unfold_backward`, accumulates with atomics on CUDA: on an H200 the same chunk's audio
    differed in its low bits from run to run at a batch of one.)
    """
    b, count, n_fft = frames.shape
    k = n_fft // hop
    assert k * hop == n_fft, "n_fft must be a multiple of hop"
    segments = frames.view(b, count, k, hop)
    out = frames.new_zeros(b, count + k - 1, hop)
    for m in range(k):
        out[:, m : m + count] += segments[:, :, m]
    return out.view(b, -1)


_ENVELOPES: dict[tuple[int, int, int, torch.device], torch.Tensor] = {}


def _envelope(window: torch.Tensor, hop: int, frames: int) -> torch.Tensor:
    """Overlap-added window**2 over `frames` frames ([1, n_fft + hop*(frames-1)]), cached."""
    n_fft = window.shape[0]
    key = (n_fft, hop, frames, window.device)
    env = _ENVELOPES.get(key)
    if env is None:
        env = overlap_add(window.pow(2).view(1, 1, n_fft).expand(1, frames, n_fft).contiguous(), hop)
        length = env.shape[1]
        if env[:, n_fft // 2 : length - n_fft // 2].abs().min().item() < 1e-11:
            raise ValueError(f"istft: window overlap-add is zero somewhere (n_fft {n_fft}, hop {hop})")
        _ENVELOPES[key] = env
    return env


# Measured deviation from upstream's `torch.istft` on the CPU (results/cpu/official_deviation_
# {full,tiny}*.json, tests/stages/test_official_reference.py): 1.8-2.4e-7 max at unit scale; HiFT's
# audio on the same mel and source 3.0e-8 (full) / 1.8e-7 (tiny) max, 141-143 dB SNR; with torch.istft
# swapped back, bit-exact. Kept: graph-capturable, no atomics (run-to-run identical on CUDA).
def istft(spec: torch.Tensor, n_fft: int, hop: int, window: torch.Tensor) -> torch.Tensor:
    """`torch.istft(spec, n_fft, hop, n_fft, window=window)` (center=True) without its host sync
    and with a deterministic overlap-add (equal to torch.istft to float rounding).

    torch.istft checks the window envelope with `.item()`, which a device graph cannot capture;
    this runs the same steps (irfft, window, overlap-add, trim, divide by the envelope) and
    checks the envelope once per frame count on the host instead.
    spec: [B, n_fft // 2 + 1, F] complex -> [B, hop * (F - 1)].
    """
    frames = spec.shape[2]
    y = torch.fft.irfft(spec, n=n_fft, dim=1) * window.view(n_fft, 1)  # [B, n_fft, F]
    y = overlap_add(y.transpose(1, 2).contiguous(), hop)
    env = _envelope(window, hop, frames)
    length = y.shape[1]
    start, end = n_fft // 2, length - n_fft // 2
    return y[:, start:end] / env[:, start:end]


class HiFTGenerator(nn.Module):
    """HiFTNet generator; see the module docstring for the data flow."""

    def __init__(self, cfg: HiFTConfig):
        super().__init__()
        self.cfg = cfg
        n_fft, base = cfg.istft_n_fft, cfg.base_channels
        self.m_source = SourceModuleHnNSF2(cfg)
        self.conv_pre = _wn_conv(cfg.in_channels, base, 7, 1, padding=3)
        self.ups = nn.ModuleList()
        for i, (u, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes)):
            up = nn.ConvTranspose1d(base // 2**i, base // 2 ** (i + 1), k, u, padding=(k - u) // 2)
            nn.init.normal_(up.weight, 0.0, 0.01)
            self.ups.append(weight_norm(up))
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        # The source STFT runs at the final rate; stage i needs it downsampled by the product of
        # the upsample rates still to come.
        down = [math.prod(cfg.upsample_rates[i + 1 :]) for i in range(len(cfg.upsample_rates))]
        src = zip(down, cfg.source_resblock_kernel_sizes, cfg.source_resblock_dilation_sizes)
        for i, (u, k, d) in enumerate(src):
            ch = base // 2 ** (i + 1)
            if u == 1:
                self.source_downs.append(nn.Conv1d(n_fft + 2, ch, 1, 1))
            else:
                self.source_downs.append(nn.Conv1d(n_fft + 2, ch, u * 2, u, padding=u // 2))
            self.source_resblocks.append(ResBlock(ch, k, tuple(d)))
        self.resblocks = nn.ModuleList()
        for i in range(len(self.ups)):
            ch = base // 2 ** (i + 1)
            for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes):
                self.resblocks.append(ResBlock(ch, k, tuple(d)))
        self.conv_post = _wn_conv(base // 2 ** len(self.ups), n_fft + 2, 7, 1, padding=3)
        self.f0_predictor = ConvRNNF0Predictor(cfg.in_channels, cfg.f0_predictor_channels)
        self.register_buffer("stft_window", torch.empty(n_fft), persistent=False)
        self.snake_kernel = "eager"  # the run record's name of what runs: "eager" or "triton"
        self.conv_kernel = "cudnn"  # the same for the ResBlocks', conv_pre's and conv_post's convs
        self.gemm: ConvFn | None = None  # conv_pre and conv_post as Triton GEMMs (`use_kernels`)
        self.init_buffers()

    def init_buffers(self) -> None:
        """(Re)compute non-checkpoint buffers; call after `load_state_dict(assign=True)` on meta."""
        # Periodic Hann, computed in float64 then rounded (scipy get_window, as upstream).
        device = self.conv_pre.bias.device
        window = torch.hann_window(self.cfg.istft_n_fft, periodic=True, dtype=torch.float64, device=device)
        self.stft_window = window.to(torch.float32)

    def use_kernels(self, snake: SnakeKernel, conv: HiFTConvKernel | None = None) -> None:
        """Run what `stages.code2wav.kernels` chose (decides nothing): `snake_kernel`'s in every
        Snake, `hift_conv_kernel`'s in the convs of `gemm_convs` (None: the modules' own)."""
        self.snake_kernel = snake.name
        for module in self.modules():
            if isinstance(module, Snake):
                module.fused = snake.fn
        self.conv_kernel = "cudnn" if conv is None else conv.name
        self.gemm = None if conv is None else conv.fn
        for block in (*self.resblocks, *self.source_resblocks):
            block.gemm = self.gemm

    def gemm_convs(self) -> list[nn.Conv1d]:
        """The convs `use_kernels` routes to a conv GEMM: every ResBlock conv, conv_pre and
        conv_post (all stride 1; the strided source downsamplers and the transposed upsamplers
        keep cuDNN)."""
        convs = [self.conv_pre, self.conv_post]
        for block in (*self.resblocks, *self.source_resblocks):
            convs += [*block.convs1, *block.convs2]
        if not all(gemm_ready(c) for c in convs):
            raise ValueError("a HiFT conv routed to the conv GEMM is not stride-1, one-group, zero-padded")
        return convs

    # -- pieces --------------------------------------------------------------------------------

    def f0_to_source(self, f0: torch.Tensor, generator: Generators = None) -> torch.Tensor:
        # f0: [B, T] -> source [B, 1, T * samples_per_frame]
        f0 = F.interpolate(f0[:, None], scale_factor=float(self.cfg.samples_per_frame), mode="nearest")
        return self.m_source(f0.transpose(1, 2), generator).transpose(1, 2)

    def _stft(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, L] -> [B, n_fft + 2, L / hop + 1]
        n_fft, hop = self.cfg.istft_n_fft, self.cfg.istft_hop_len
        spec = torch.stft(x, n_fft, hop, n_fft, window=self.stft_window, return_complex=True)
        spec = torch.view_as_real(spec)
        return torch.cat([spec[..., 0], spec[..., 1]], dim=1)

    def _istft(self, magnitude: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
        magnitude = torch.clip(magnitude, max=1e2)
        spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        return istft(spec, self.cfg.istft_n_fft, self.cfg.istft_hop_len, self.stft_window)

    def decode(self, mel: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        # mel: [B, 80, T], source: [B, 1, T*480] -> speech [B, T*480]
        s_stft = self._stft(source.squeeze(1))
        x = run_conv(self.conv_pre, mel, self.gemm)
        n_up, n_k = len(self.ups), len(self.cfg.resblock_kernel_sizes)
        for i in range(n_up):
            x = self.ups[i](F.leaky_relu(x, self.cfg.lrelu_slope))
            if i == n_up - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + self.source_resblocks[i](self.source_downs[i](s_stft))
            xs = self.resblocks[i * n_k](x)
            for j in range(1, n_k):
                xs = xs + self.resblocks[i * n_k + j](x)
            x = xs / n_k
        x = run_conv(self.conv_post, F.leaky_relu(x), self.gemm)  # default slope 0.01 here, as trained
        half = self.cfg.istft_n_fft // 2 + 1
        magnitude = torch.exp(x[:, :half, :])
        phase = torch.sin(x[:, half:, :])
        speech = self._istft(magnitude, phase)
        return torch.clamp(speech, -self.cfg.audio_limit, self.cfg.audio_limit)

    @torch.inference_mode()
    def inference(
        self, mel: torch.Tensor, cache_source: torch.Tensor, *, generator: Generators = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """mel [B, 80, T], cache_source [B, 1, S] -> (speech [B, T*480], source [B, 1, T*480]).

        A non-empty `cache_source` overwrites the first S samples of the new source (upstream's
        glitch guard: the re-decoded cached frames get the exact excitation they had before).
        """
        f0 = self.f0_predictor(mel)
        source = self.f0_to_source(f0, generator)
        if cache_source.shape[2] != 0:
            source[:, :, : cache_source.shape[2]] = cache_source
        return self.decode(mel, source), source


def fold_weight_norm(module: nn.Module) -> int:
    """Replace every weight-norm parametrization below `module` by its weight; returns the count.

    Done once after loading, for inference. `leave_parametrized=True` stores exactly the tensor
    the parametrization computes, so outputs are bit-identical to the parametrized module.
    """
    folded = 0
    for sub in module.modules():
        if parametrize.is_parametrized(sub, "weight"):
            parametrize.remove_parametrizations(sub, "weight", leave_parametrized=True)
            folded += 1
    return folded


# ---- streaming ---------------------------------------------------------------------------------


@dataclass
class HiFTState:
    """One request's vocoder caches between chunks (all on the device, batch dim dropped)."""

    mel_cache: torch.Tensor  # [80, <= mel_cache_frames] last mel frames, re-decoded next chunk
    source_cache: torch.Tensor  # [1, <= source_cache_samples] NSF source of those frames
    speech_tail: torch.Tensor  # [<= source_cache_samples] held-back audio, cross-faded next chunk


def crossfade_window(cfg: HiFTConfig) -> torch.Tensor:
    """The Hamming window of 2 x source_cache_samples that cross-fades chunk boundaries (float32,
    CPU): np.hamming is the symmetric window, so float64 then rounded like upstream's from_numpy()."""
    n = cfg.source_cache_samples
    return torch.hamming_window(2 * n, periodic=False, dtype=torch.float64).to(torch.float32)


class HiFTStream:
    """Per-row streaming around `HiFTGenerator.inference` (spec §4.5): the reference of the
    pooled vocoder step in `chunk_decode` (tests compare them byte for byte).

    Each chunk decodes [cached 8 mel frames | new frames]; the first 3840 samples are cross-faded
    with the previous chunk's held-back tail (Hamming 7680: rising half x new + falling half x
    old), and the last 3840 samples are held back unless it is the last chunk. A steady 50-frame
    chunk thus emits (58 * 480 - 3840) = 24000 samples; the first emits 50 * 480 - 3840 = 20160.
    """

    def __init__(self, cfg: HiFTConfig):
        self.cfg = cfg
        self._window = crossfade_window(cfg)

    def decode(
        self,
        hift: HiFTGenerator,
        mel: torch.Tensor,
        states: list[HiFTState | None],
        last_chunk: list[bool],
        *,
        generator: Generators = None,
    ) -> tuple[list[torch.Tensor], list[HiFTState | None]]:
        """mel [B, 80, T] for B rows with equal T and equal cache lengths (the caller groups).

        Returns per-row speech [n_out] and the new states (None for rows that finished).
        """
        rows = mel.shape[0]
        assert len(states) == rows == len(last_chunk), "one state and one last_chunk flag per row"
        cached = [s for s in states if s is not None]
        assert len(cached) in (0, rows), "rows in one call must all be first chunks or all continue"
        if cached:
            assert len({s.mel_cache.shape[1] for s in cached}) == 1, "rows must share cache lengths"
            mel = torch.cat([torch.stack([s.mel_cache for s in cached]), mel], dim=2)
            cache_source = torch.stack([s.source_cache for s in cached])
        else:
            cache_source = mel.new_zeros(rows, 1, 0)
        speech, source = hift.inference(mel, cache_source, generator=generator)
        return self._split_rows(mel, speech, source, states, last_chunk)

    def _split_rows(self, mel, speech, source, states, last_chunk):
        n = self.cfg.source_cache_samples
        window = self._window.to(device=speech.device, dtype=speech.dtype)
        out, new_states = [], []
        for b, (state, last) in enumerate(zip(states, last_chunk)):
            row = speech[b]
            if state is not None and state.speech_tail.numel() > 0:
                k = state.speech_tail.shape[0]
                row = row.clone()
                row[:k] = row[:k] * window[:k] + state.speech_tail * window[-k:]
            if last:
                out.append(row)
                new_states.append(None)
                continue
            new_states.append(
                HiFTState(
                    mel_cache=mel[b, :, -self.cfg.mel_cache_frames :].clone(),
                    source_cache=source[b, :, -n:].clone(),
                    speech_tail=row[-n:].clone(),
                )
            )
            out.append(row[:-n])
        return out, new_states
