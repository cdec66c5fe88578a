"""Audio front ends for the code2wav prompt, in plain torch (no librosa, no torchaudio).

Three features feed the prompt setup (spec §4.2), each matching the function the official
pipeline calls, so official weights see the inputs they were trained on:

* `prompt_mel` — the 24 kHz flow mel (Matcha/CosyVoice `mel_spectrogram`): 80 slaney mel bins,
  n_fft 1920, hop 480, Hann 1920, fmin 0, fmax 8000, reflect pad (n_fft - hop) / 2 per side,
  `center=False`, magnitude sqrt(re² + im² + 1e-9), log(clamp(·, 1e-5)).
* `kaldi_fbank` — Kaldi-style 80-bin log fbank at 16 kHz for CAM++ (torchaudio.compliance.kaldi
  defaults: 25 ms povey window, 10 ms shift, pre-emphasis 0.97, DC removal, power spectrum,
  snip_edges), dither 0, minus its time mean.
* `whisper_log_mel` — the 128-bin Whisper log-mel the S3 speech tokenizer reads (n_fft 400,
  hop 160, centred STFT, log10, dynamic range 8, (x + 4) / 4).

`resample` is a Hann-windowed sinc resampler (same construction as torchaudio's default
`sinc_interp_hann`, lowpass width 6, rolloff 0.99) for any integer rate pair.

Why not torchaudio (measured 2026-12): the stages depend on torch alone, and torchaudio cannot
follow them. Its last release (2.11.1, maintenance mode) needs torch >= 2.11 while the stages
take torch >= 2.6 (a GPU or NPU host keeps its own build), and its PyPI wheel links the CUDA
build of torch: with the CPU torch of the README's setup (2.13.0+cpu) `import torchaudio` fails
on libc10_cuda.so, and the CPU wheel is not on PyPI. So `kaldi_fbank` stays, and
tests/stages/test_mel.py checks it against torchaudio's `compliance.kaldi.fbank` source on the
builtin real-speech prompts (max |diff| 2.6e-4 on log energies of about +-13, mean 2.5e-6; the
`audio-reference` extra installs it, CI runs it).

    >>> wav = torch.zeros(24000 * 6)
    >>> prompt_mel(wav).shape            # [T, 80]
    torch.Size([300, 80])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class MelConfig:
    """The 24 kHz prompt mel; defaults are the MiniCPM-o 4.5 / CosyVoice2 values."""

    sample_rate: int = 24000
    n_fft: int = 1920
    hop_length: int = 480
    win_length: int = 1920
    n_mels: int = 80
    fmin: float = 0.0
    fmax: float = 8000.0

    def __post_init__(self) -> None:
        if self.n_fft < self.win_length or (self.n_fft - self.hop_length) % 2:
            raise ValueError("mel.n_fft must be >= win_length and n_fft - hop_length even")


@dataclass(frozen=True)
class FbankConfig:
    """Kaldi fbank for the speaker model (torchaudio.compliance.kaldi.fbank defaults)."""

    sample_rate: int = 16000
    n_mels: int = 80
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    preemphasis: float = 0.97
    low_freq: float = 20.0
    povey_power: float = 0.85


@dataclass(frozen=True)
class WhisperMelConfig:
    """Whisper log-mel used by the S3 speech tokenizer (v2: 128 bins)."""

    sample_rate: int = 16000
    n_fft: int = 400
    hop_length: int = 160
    n_mels: int = 128


# ---- filterbanks (float64 math, cast once, cached) -------------------------------------------


def _hz_to_mel_slaney(f: torch.Tensor) -> torch.Tensor:
    # Slaney scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above.
    f_sp, min_log_hz, logstep = 200.0 / 3, 1000.0, math.log(6.4) / 27.0
    min_log_mel = min_log_hz / f_sp
    lin = f / f_sp
    log = min_log_mel + torch.log(torch.clamp(f, min=min_log_hz) / min_log_hz) / logstep
    return torch.where(f >= min_log_hz, log, lin)


def _mel_to_hz_slaney(m: torch.Tensor) -> torch.Tensor:
    f_sp, min_log_hz, logstep = 200.0 / 3, 1000.0, math.log(6.4) / 27.0
    min_log_mel = min_log_hz / f_sp
    return torch.where(m >= min_log_mel, min_log_hz * torch.exp(logstep * (m - min_log_mel)), f_sp * m)


@lru_cache(maxsize=8)
def slaney_mel_filterbank(
    sample_rate: int, n_fft: int, n_mels: int, fmin: float, fmax: float
) -> torch.Tensor:
    """librosa.filters.mel(htk=False, norm='slaney') as float32 [n_mels, n_fft // 2 + 1]."""
    fft_freqs = torch.linspace(0, sample_rate / 2, n_fft // 2 + 1, dtype=torch.float64)
    mel_lo, mel_hi = _hz_to_mel_slaney(torch.tensor([fmin, fmax], dtype=torch.float64))
    mel_f = _mel_to_hz_slaney(torch.linspace(mel_lo.item(), mel_hi.item(), n_mels + 2, dtype=torch.float64))
    fdiff = mel_f.diff()
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = torch.clamp(torch.minimum(lower, upper), min=0.0)
    enorm = 2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels])  # slaney: constant area per band
    return (weights * enorm[:, None]).to(torch.float32)


@lru_cache(maxsize=8)
def _hann(n: int) -> torch.Tensor:
    # float32 `torch.hann_window`, exactly what the Matcha/CosyVoice mel and Whisper code use.
    return torch.hann_window(n)


@lru_cache(maxsize=4)
def kaldi_mel_banks(cfg: FbankConfig, padded_window: int) -> torch.Tensor:
    """Kaldi triangular mel banks (mel = 1127 ln(1 + f/700)) as float32 [n_mels, padded/2 + 1]."""
    def mel(f: torch.Tensor) -> torch.Tensor:
        return 1127.0 * torch.log(1.0 + f / 700.0)

    nyquist = cfg.sample_rate / 2
    n_fft_bins = padded_window // 2
    lo, hi = mel(torch.tensor(cfg.low_freq, dtype=torch.float64)), mel(torch.tensor(nyquist, dtype=torch.float64))
    delta = (hi - lo) / (cfg.n_mels + 1)
    b = torch.arange(cfg.n_mels, dtype=torch.float64)[:, None]
    left, center, right = lo + b * delta, lo + (b + 1) * delta, lo + (b + 2) * delta
    freqs = mel(cfg.sample_rate / padded_window * torch.arange(n_fft_bins, dtype=torch.float64))[None, :]
    up = (freqs - left) / (center - left)
    down = (right - freqs) / (right - center)
    banks = torch.clamp(torch.minimum(up, down), min=0.0)
    return F.pad(banks, (0, 1)).to(torch.float32)  # the Nyquist bin gets no weight


# ---- features --------------------------------------------------------------------------------


def prompt_mel(wav: torch.Tensor, cfg: MelConfig = MelConfig()) -> torch.Tensor:
    """24 kHz waveform [N] -> log mel [T, n_mels], T = N // hop (for N a multiple of hop)."""
    pad = (cfg.n_fft - cfg.hop_length) // 2
    x = F.pad(wav.float()[None, None], (pad, pad), mode="reflect")[0]
    spec = torch.stft(
        x, cfg.n_fft, cfg.hop_length, cfg.win_length, window=_hann(cfg.win_length).to(x.device),
        center=False, onesided=True, return_complex=True,
    )
    spec = torch.view_as_real(spec)
    mag = torch.sqrt(spec.pow(2).sum(-1) + 1e-9)  # [1, F, T]
    basis = slaney_mel_filterbank(cfg.sample_rate, cfg.n_fft, cfg.n_mels, cfg.fmin, cfg.fmax)
    mel = torch.matmul(basis.to(x.device), mag)
    return torch.log(torch.clamp(mel, min=1e-5))[0].transpose(0, 1)


def kaldi_fbank(wav: torch.Tensor, cfg: FbankConfig = FbankConfig()) -> torch.Tensor:
    """16 kHz waveform [N] (float, ±1 scale) -> mean-normalised log fbank [T, n_mels]."""
    win = int(cfg.sample_rate * cfg.frame_length_ms / 1000)
    shift = int(cfg.sample_rate * cfg.frame_shift_ms / 1000)
    wav = wav.to(torch.float32)
    if wav.numel() < win:
        raise ValueError(f"kaldi_fbank needs at least {win} samples, got {wav.numel()}")
    frames = wav.unfold(0, win, shift)  # snip_edges: only whole frames, [T, win]
    frames = frames - frames.mean(dim=1, keepdim=True)  # remove DC offset
    prev = torch.cat([frames[:, :1], frames[:, :-1]], dim=1)
    frames = frames - cfg.preemphasis * prev
    window = torch.hann_window(win, periodic=False).pow(cfg.povey_power)  # Kaldi "povey" window
    frames = frames * window
    padded = 1 << (win - 1).bit_length()  # round up to a power of two (512)
    frames = F.pad(frames, (0, padded - win))
    power = torch.fft.rfft(frames).abs().pow(2)  # [T, padded/2 + 1]
    energies = torch.matmul(power, kaldi_mel_banks(cfg, padded).t())
    fbank = torch.log(torch.clamp(energies, min=torch.finfo(torch.float32).eps))
    return fbank - fbank.mean(dim=0, keepdim=True)


def whisper_log_mel(wav: torch.Tensor, cfg: WhisperMelConfig = WhisperMelConfig()) -> torch.Tensor:
    """16 kHz waveform [N] -> Whisper log-mel [n_mels, N // hop] (last centred frame dropped)."""
    window = _hann(cfg.n_fft).to(wav.device)
    stft = torch.stft(wav.float(), cfg.n_fft, cfg.hop_length, window=window, return_complex=True)
    power = stft[..., :-1].abs() ** 2
    basis = slaney_mel_filterbank(cfg.sample_rate, cfg.n_fft, cfg.n_mels, 0.0, cfg.sample_rate / 2)
    log_spec = torch.clamp(basis.to(wav.device) @ power, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


# ---- resampling ------------------------------------------------------------------------------


@lru_cache(maxsize=16)
def _sinc_kernel(orig: int, new: int, width_taps: int, rolloff: float) -> tuple[torch.Tensor, int]:
    base = min(orig, new) * rolloff  # cutoff below the lower Nyquist to limit aliasing
    width = math.ceil(width_taps * orig / base)
    idx = torch.arange(-width, width + orig, dtype=torch.float64)[None, :] / orig
    t = torch.arange(0, -new, -1, dtype=torch.float64)[:, None] / new + idx
    t = torch.clamp(t * base, -width_taps, width_taps)
    window = torch.cos(t * math.pi / width_taps / 2) ** 2
    t = t * math.pi
    sinc = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / torch.where(t == 0, torch.ones_like(t), t))
    kernel = sinc * window * (base / orig)
    return kernel.to(torch.float32)[:, None, :], width


def resample(
    wav: torch.Tensor, orig_sr: int, new_sr: int, *, width_taps: int = 6, rolloff: float = 0.99
) -> torch.Tensor:
    """Band-limited resampling of wav [..., N] -> [..., ceil(N * new / orig)]."""
    if orig_sr <= 0 or new_sr <= 0:
        raise ValueError(f"sample rates must be positive, got {orig_sr} -> {new_sr}")
    if orig_sr == new_sr:
        return wav
    g = math.gcd(orig_sr, new_sr)
    orig, new = orig_sr // g, new_sr // g
    kernel, width = _sinc_kernel(orig, new, width_taps, rolloff)
    shape = wav.shape
    x = wav.reshape(-1, 1, shape[-1]).to(torch.float32)
    n = shape[-1]
    x = F.pad(x, (width, width + orig))
    y = F.conv1d(x, kernel.to(x.device), stride=orig)  # [B, new, frames]: phase-major
    y = y.transpose(1, 2).reshape(x.shape[0], -1)
    target = math.ceil(new * n / orig)
    return y[:, :target].reshape(*shape[:-1], target)
