"""Decoding reference voices (`stages.audio`, libsndfile through soundfile): the same
floats as the stdlib reader it replaced on real speech, every PCM width, other formats, and
PromptErrors that say what and where."""

from __future__ import annotations

import io
import struct
import wave
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from stages.audio import PromptError, decode_audio
from stages.code2wav.config import Code2WavConfig
from stages.code2wav.prompt import DEFAULT_REF_WAV, PromptBuilder

REPO = Path(__file__).resolve().parents[2]
SPEECH = sorted((REPO / "tts_bench/data/seed-tts-en/prompts").glob("*.wav")) + [DEFAULT_REF_WAV]


def riff(fmt_tag: int, channels: int, rate: int, bits: int, data: bytes, *, extensible: bool = False) -> bytes:
    """A WAV file built by hand (independent of the decoder under test)."""
    align = channels * bits // 8
    fmt = struct.pack("<HHIIHH", 0xFFFE if extensible else fmt_tag, channels, rate, rate * align, align, bits)
    if extensible:  # cbSize, valid bits, channel mask, sub-format GUID (the tag + KSDATAFORMAT's tail)
        fmt += struct.pack("<HHI", 22, bits, 0) + struct.pack("<H", fmt_tag) + bytes.fromhex("000000001000800000aa00389b71")
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def stdlib_int16(path: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path), "rb") as w:
        assert w.getsampwidth() == 2
        raw, channels, rate = w.readframes(w.getnframes()), w.getnchannels(), w.getframerate()
    return (np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0).reshape(-1, channels).T, rate


@pytest.mark.parametrize("path", SPEECH, ids=lambda p: p.name)
def test_real_speech_decodes_to_exactly_the_floats_of_the_stdlib_reader(path):
    wav, rate = decode_audio(path)
    ref, ref_rate = stdlib_int16(path)
    assert wav.dtype == np.float32 and wav.shape == ref.shape and rate == ref_rate == 24000
    assert float(np.abs(wav - ref).max()) == 0.0


def test_every_pcm_width_and_float_decodes_to_the_same_scale_as_c_by_n():
    rng = np.random.default_rng(0)
    n, c = 257, 2
    u8 = rng.integers(0, 256, (n, c)).astype(np.uint8)
    i16 = rng.integers(-(1 << 15), 1 << 15, (n, c)).astype("<i2")
    i24 = rng.integers(-(1 << 23), 1 << 23, (n, c)).astype(np.int32)
    i32 = rng.integers(-(1 << 31), 1 << 31, (n, c)).astype("<i4")
    f32 = rng.uniform(-1, 1, (n, c)).astype("<f4")
    packed24 = np.stack([(i24 >> s) & 0xFF for s in (0, 8, 16)], axis=-1).astype(np.uint8).tobytes()
    cases = [
        (riff(1, c, 8000, 8, u8.tobytes()), (u8.astype(np.float32) - 128) / 128),
        (riff(1, c, 16000, 16, i16.tobytes()), i16 / np.float32(1 << 15)),
        (riff(1, c, 22050, 24, packed24), i24 / np.float32(1 << 23)),
        (riff(1, c, 44100, 32, i32.tobytes()), i32 / np.float32(1 << 31)),
        (riff(3, c, 48000, 32, f32.tobytes()), f32),
        (riff(3, c, 48000, 64, f32.astype("<f8").tobytes()), f32),
        (riff(1, c, 16000, 16, i16.tobytes(), extensible=True), i16 / np.float32(1 << 15)),
    ]
    for data, expected in cases:
        wav, rate = decode_audio(data)
        assert wav.shape == (c, n) and wav.dtype == np.float32
        assert float(np.abs(wav - expected.T.astype(np.float32)).max()) <= 1e-7, rate


def _encoded(wav: np.ndarray, rate: int, fmt: str, subtype: str) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, wav.T, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def test_flac_is_lossless_and_ogg_and_mp3_decode_close_to_the_speech():
    speech, rate = decode_audio(SPEECH[0])
    flac, flac_rate = decode_audio(_encoded(speech, rate, "FLAC", "PCM_16"))
    assert flac_rate == rate and np.array_equal(flac, speech)
    lossy = [("OGG", "VORBIS")] + ([("MP3", "MPEG_LAYER_III")] if "MP3" in soundfile.available_formats() else [])
    for fmt, subtype in lossy:
        wav, got_rate = decode_audio(_encoded(speech, rate, fmt, subtype), where=f"x.{fmt.lower()}")
        n = min(wav.shape[1], speech.shape[1])
        assert got_rate == rate and abs(wav.shape[1] - speech.shape[1]) < rate // 10, fmt
        lag = int(np.argmax(np.correlate(wav[0, 2000:6000], speech[0, 2000:4000], "valid")))  # codec delay
        corr = np.corrcoef(wav[0, lag : n], speech[0, : n - lag])[0, 1]
        assert corr > 0.9, (fmt, corr)


def test_a_flac_voice_gives_the_same_prompt_as_its_wav(tmp_path):
    speech, rate = decode_audio(SPEECH[1])
    (tmp_path / "v.flac").write_bytes(_encoded(speech, rate, "FLAC", "PCM_16"))
    builder = PromptBuilder(Code2WavConfig(), device=torch.device("cpu"), dtype=torch.float32, weights_dir=None)
    a, b = builder.build(SPEECH[1]), builder.build(tmp_path / "v.flac")
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.mel, b.mel)
    assert torch.equal(a.spk_embedding, b.spk_embedding)


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        (b"this is a text file named x.wav", "cannot decode reference audio (ref_audio): "),
        (b"RIFF", "cannot decode reference audio (ref_audio): "),
        (riff(1, 1, 16000, 16, b""), "reference audio is empty (ref_audio)"),
        (riff(0x1234, 1, 16000, 16, b"\x00\x00" * 8), "cannot decode reference audio (ref_audio)"),  # unknown tag
    ],
)
def test_undecodable_or_empty_audio_is_a_prompt_error_naming_where(source, fragment):
    with pytest.raises(PromptError) as info:
        decode_audio(source, where="ref_audio")
    msg = str(info.value)
    assert msg.startswith("error: ") and fragment in msg and "; give a" in msg, msg


def test_missing_or_unreadable_files_are_prompt_errors_naming_the_path(tmp_path):
    with pytest.raises(PromptError, match=r"not found \(.*missing\.wav\); give an existing audio file"):
        decode_audio(tmp_path / "missing.wav")
    with pytest.raises(PromptError, match=r"cannot read reference audio \(.*\): .*; give a readable file"):
        decode_audio(tmp_path)  # a directory
    with pytest.raises(PromptError, match=r"cannot decode reference audio \(reference audio bytes\)"):
        decode_audio(b"\x00" * 64)
