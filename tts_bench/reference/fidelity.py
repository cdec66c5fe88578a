"""How far a decoder's output sits from a reference decoder's, on the same input and noise.

Figures (each a float; reference first):
* `max_abs_mel`, `mel_snr_db` = 10 log10(sum ref^2 / sum (mel - ref)^2) over the log-mel;
* `mel_lsd_db`: the mel's log-spectral distance, RMS over bins of 20 log10(e) x delta(ln mel)
  per frame, averaged over frames (the mel is a natural-log amplitude);
* `max_abs_wav`, `wav_snr_db` on the waveform, and `lsd_db`: the waveform's log-spectral
  distance (power STFT, n_fft 1024, hop 256, Hann; 10 log10 with a 1e-10 floor).
A mode whose `mel_snr_db` is below `LOSSY_MEL_SNR_DB` is labelled lossy.

The runs feed both decoders the same codes (the project's `Chunker` payloads), the same voice
(the project's prompt features: tokens, prompt mel, speaker embedding) and the same CFM noise
(the official modules get the project's seeded buffer), and vocode the whole mel once with the
reference's NSF source (see `vocode_project`):

    t2w = Token2Wav(cfg, device=cpu, dtype=torch.float32, init_seed=0, keep_mel=True)
    ref = build_official(cfg, init="project", project=t2w)
    streams = [stream_payloads(cfg, codes, "r0")]
    want = official_mel(ref, t2w, streams[0]); got = project_mels(t2w, streams)[0]
    ref_wav, source = vocode_official(ref, want)
    print(deviation(want, got, ref_wav, vocode_project(t2w.hift, got, source)))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from stages.code2wav.config import Code2WavConfig
from stages.code2wav.streaming import Chunker, CodecPayload

LOSSY_MEL_SNR_DB = 60.0
DB_PER_NEPER = 20.0 / math.log(10.0)
_STFT = (1024, 256)  # n_fft, hop of the waveform LSD


def snr_db(ref: torch.Tensor, x: torch.Tensor) -> float:
    """10 log10(signal / error energy) in float64; inf when equal."""
    ref, x = ref.double(), x.double()
    err = float((x - ref).pow(2).sum())
    return math.inf if err == 0.0 else 10.0 * math.log10(float(ref.pow(2).sum()) / err)


def mel_lsd_db(ref: torch.Tensor, mel: torch.Tensor) -> float:
    """ref, mel: [80, T] natural-log mel -> mean over frames of the RMS dB difference over bins."""
    diff = (mel.double() - ref.double()) * DB_PER_NEPER
    return float(diff.pow(2).mean(dim=0).sqrt().mean())


def lsd_db(ref: torch.Tensor, wav: torch.Tensor) -> float:
    """ref, wav: [N] waveforms -> log-spectral distance in dB (power STFT)."""
    n_fft, hop = _STFT
    window = torch.hann_window(n_fft, dtype=torch.float64)

    def power_db(x):
        spec = torch.stft(x.double().reshape(-1), n_fft, hop, window=window, return_complex=True)
        return 10.0 * torch.log10(spec.abs().pow(2).clamp_min(1e-10))

    diff = power_db(wav) - power_db(ref)
    return float(diff.pow(2).mean(dim=0).sqrt().mean())


@dataclass(frozen=True)
class Deviation:
    max_abs_mel: float
    mel_snr_db: float
    mel_lsd_db: float
    max_abs_wav: float
    wav_snr_db: float
    lsd_db: float

    @property
    def lossy(self) -> bool:
        return self.mel_snr_db < LOSSY_MEL_SNR_DB

    def as_dict(self) -> dict:
        return {**asdict(self), "lossy": self.lossy}


def deviation(ref_mel: torch.Tensor, mel: torch.Tensor, ref_wav: torch.Tensor, wav: torch.Tensor) -> Deviation:
    """ref_mel, mel: [80, T]; ref_wav, wav: [N]."""
    ref_mel, mel = ref_mel.float().cpu(), mel.float().cpu()
    ref_wav, wav = ref_wav.float().cpu().reshape(-1), wav.float().cpu().reshape(-1)
    return Deviation(
        max_abs_mel=float((mel - ref_mel).abs().max()),
        mel_snr_db=snr_db(ref_mel, mel),
        mel_lsd_db=mel_lsd_db(ref_mel, mel),
        max_abs_wav=float((wav - ref_wav).abs().max()),
        wav_snr_db=snr_db(ref_wav, wav),
        lsd_db=lsd_db(ref_wav, wav),
    )


# ---- runs ------------------------------------------------------------------------------------


def stream_payloads(cfg: Code2WavConfig, codes: Sequence[int], request_id: str, seed: int = 0) -> list[CodecPayload]:
    """Every payload of one request: the full chunks, then the final flush."""
    chunker = Chunker(cfg, request_id, seed=seed)
    return [*chunker.push(codes), chunker.finish()]


def project_mels(t2w, streams: Sequence[Sequence[CodecPayload]]) -> list[torch.Tensor]:
    """Decode the streams together, one payload of each per step (equal payload counts), on a
    `Token2Wav(keep_mel=True)`; returns each stream's whole mel [80, T] (CPU)."""
    steps = {len(s) for s in streams}
    assert len(steps) == 1, "streams decoded together need the same number of payloads"
    mels: list[list[torch.Tensor]] = [[] for _ in streams]
    for k in range(steps.pop()):
        for r, out in enumerate(t2w.decode([s[k] for s in streams])):
            mels[r].append(out.mel)
    return [torch.cat(m, dim=1).float() for m in mels]


def official_mel(dec, t2w, payloads: Sequence[CodecPayload]) -> torch.Tensor:
    """The official flow's streamed mel [80, T] (CPU) for one request's payloads, with the voice
    of the project's default prompt setup."""
    setup = t2w.prompt_setup(payloads[0].prompt_id)
    f = setup.features
    mels = dec.stream_mels(f.tokens, setup.mel, f.spk_embedding, [(p.codes, p.last_chunk) for p in payloads])
    return torch.cat(mels, dim=1).float().cpu()


def vocode_official(dec, mel: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """[80, T] -> (audio [T*480], NSF source [1, 1, T*480]) by the official HiFT, its source drawn
    from the global RNG seeded with `seed`."""
    audio, source = dec.vocode(mel[None].float(), seed=seed)
    return audio[0].cpu(), source.cpu()


@torch.inference_mode()
def vocode_project(hift, mel: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """[80, T] -> [T*480] by the project's HiFT filter (`decode`) on a given NSF source [1, 1, N].

    Why a given source: the project's NSF draws are the official ones in another element order
    (upstream's `randn_like` fills a transposed tensor in memory order; the project draws
    [B, L, H] contiguous, or counter-based per-row keys when streaming), so a seeded global RNG
    gives the same f0 and sines bit for bit but not the same noise. Feeding the reference's
    source compares the filter and iSTFT; the f0 -> source step is compared on its own."""
    device = hift.stft_window.device
    audio = hift.decode(mel[None].float().to(device), source.float().to(device))
    return audio[0].cpu()
