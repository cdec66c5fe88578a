"""Token2Wav end to end on the tiny config (CPU): contract sizes, streaming == reference,
determinism, batched == per-row cache split (bytes), ragged groups, state lifecycle."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from stages.code2wav.streaming import Chunker, Code2WavPayloadError, CodecPayload
from stages.code2wav.token2wav import Token2Wav
from tests.stages.code2wav_tiny import single_thread, tiny_config  # noqa: F401

pytestmark = pytest.mark.usefixtures("single_thread")

MEL_TOL = 1e-4  # streamed vs one-shot mel, fp32 (measured ~1e-6)
# Streamed vs one-shot HiFT audio. The first chunk has no chunk boundary: waveforms agree
# (measured 0.02 relative rms). Each later chunk restarts the NSF source's phase integration after
# its cached frames (upstream's streaming contract; only the cached 8 frames' source is carried),
# and with a live source (random_init, D-INIT-1) that moves the waveform by ~0.3 relative rms, so
# later chunks are compared by STFT magnitude: measured 0.20 against 0.52 for other codes.
FIRST_CHUNK_REL_RMS_TOL = 0.05
MAGNITUDE_REL_TOL = 0.3
OTHER_CODES_MAGNITUDE_REL_MIN = 0.4


def _t2w(**kw) -> Token2Wav:
    extra = kw.pop("extra", {})
    cfg = tiny_config(extra=extra, **kw)
    return Token2Wav(cfg, device=torch.device("cpu"), dtype=torch.float32, init_seed=0, keep_mel=True)


def _codes(n: int, seed: int) -> list[int]:
    vocab = tiny_config().flow.vocab_size
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _payloads(cfg, request_id: str, codes: list[int], seed: int = 0) -> list[CodecPayload]:
    ch = Chunker(cfg, request_id, seed=seed)
    return [*ch.push(codes), ch.finish()]


def test_steady_28_code_payload_is_exactly_one_second():
    t2w = _t2w()
    first, second, third = _payloads(t2w.cfg, "r", _codes(50, 1))
    a = t2w.decode([first])[0]
    b = t2w.decode([second])[0]
    assert len(second.codes) == 28
    assert a.audio.shape == (20160,) and a.mel.shape == (80, 50)  # first chunk holds 3840 back
    assert b.audio.shape == (24000,) and b.audio.dtype == np.float32 and b.mel.shape[1] == 50
    c = t2w.decode([third])[0]
    assert c.last_chunk and c.audio.shape == (3 * 2 * 480 + 3840,)
    assert t2w.active_requests == 0


def test_a_shorter_first_chunk_emits_its_own_length_then_steady_seconds():
    t2w = _t2w(initial_codec_chunk_frames=5)
    first, second, third, last = _payloads(t2w.cfg, "r", _codes(60, 1))
    a, b, c = (t2w.decode([p])[0] for p in (first, second, third))
    # 5 codes -> 10 mel frames, less the 8 frames' audio held back for the cross-fade
    assert len(first.codes) == 8 and a.mel.shape == (80, 10) and a.audio.shape == (10 * 480 - 3840,)
    assert b.audio.shape == c.audio.shape == (24000,) and b.mel.shape == (80, 50)
    assert t2w.decode([last])[0].audio.shape == ((3 + 5) * 2 * 480 + 3840,)
    assert t2w.active_requests == 0


@pytest.mark.parametrize(("initial", "growing"), [(0, 1), (10, 2)])
def test_groups_are_counted_by_the_part_of_a_streams_life_they_decode(initial, growing):
    # keep 100 mel frames: caches grow 2 x first chunk, then 50 a chunk, until they hold 100
    t2w = _t2w(initial_codec_chunk_frames=initial)
    a = _payloads(t2w.cfg, "a", _codes(t2w.cfg.first_chunk_frames + 4 * 25, 1))  # 5 chunks + final
    b = _payloads(t2w.cfg, "b", _codes(t2w.cfg.first_chunk_frames, 2))  # 1 chunk + final
    t2w.decode([a[0], b[0]])  # both first chunks: one group
    for i, p in enumerate(a[1:]):
        t2w.decode([p, b[1]] if i == 0 else [p])  # b's final beside a's second chunk: two groups
    work = t2w.work()
    kinds = {k: work[f"group_{k}"] for k in ("first", "growing", "steady", "final")}
    assert kinds == {"first": 1, "growing": growing, "steady": 4 - growing, "final": 2}
    assert work["groups"] == sum(kinds.values()) == 7 and work["eager_final_groups"] == 2


def test_work_splits_decode_time_into_eager_launches_replays_and_finishing(monkeypatch):
    t2w = _t2w()
    assert t2w.work() == {"groups": 0, "graph_captures": 0, "graph_replays": 0, "eager_final_groups": 0,
                          "group_first": 0, "group_growing": 0, "group_steady": 0, "group_final": 0,
                          "eager_launch_s": 0.0, "replay_launch_s": 0.0, "finish_s": 0.0}
    # Slow finishing down by a known amount: it must land in finish_s, not in the launches.
    finish = t2w._finish_group
    monkeypatch.setattr(t2w, "_finish_group", lambda *a: time.sleep(0.05) or finish(*a))
    a, b = (_payloads(t2w.cfg, rid, _codes(30, seed), seed) for rid, seed in (("a", 1), ("b", 2)))
    t2w.decode([a[0], b[0]])  # one shape: one group
    t2w.decode([a[1], b[1]])  # both final, same length: one group
    work = t2w.work()
    assert work["groups"] == 2 and work["graph_replays"] == 0  # no graphs on the CPU: all eager
    assert work["eager_final_groups"] == 1  # the second group: both rows' final chunks
    assert work["finish_s"] >= 0.1 and work["eager_launch_s"] > 0 and work["replay_launch_s"] == 0.0


@pytest.mark.parametrize("initial", [0, 10], ids=["full-first-chunk", "initial-chunk-10"])
def test_streaming_equals_the_non_streaming_reference(initial):
    # no trim within this length: caches stay exact
    t2w = _t2w(prompt_keep_frames=1000, initial_codec_chunk_frames=initial)
    codes = _codes(80, 2)
    outs = [t2w.decode([p])[0] for p in _payloads(t2w.cfg, "r", codes)]
    assert outs[0].mel.shape[1] == 2 * t2w.cfg.first_chunk_frames
    ref = t2w.reference(codes)
    mel = torch.cat([o.mel for o in outs], dim=1)
    audio = np.concatenate([o.audio for o in outs])
    assert mel.shape == ref.mel.shape == (80, 2 * (3 + 80))
    assert (mel - ref.mel).abs().max().item() < MEL_TOL
    assert audio.shape == ref.audio.shape
    n = outs[0].audio.shape[0]
    first = np.sqrt(np.mean((audio[:n] - ref.audio[:n]) ** 2) / np.mean(ref.audio[:n] ** 2))
    assert first < FIRST_CHUNK_REL_RMS_TOL
    assert _magnitude_rel(audio, ref.audio) < MAGNITUDE_REL_TOL
    assert _magnitude_rel(t2w.reference(_codes(80, 7)).audio, ref.audio) > OTHER_CODES_MAGNITUDE_REL_MIN


def _magnitude_rel(a: np.ndarray, b: np.ndarray, n_fft: int = 1024) -> float:
    """|| |STFT a| - |STFT b| || / || |STFT b| ||: the audio compared without its phase."""
    window = torch.hann_window(n_fft)
    ma, mb = (torch.stft(torch.as_tensor(x), n_fft, n_fft // 4, window=window, return_complex=True).abs()
              for x in (a, b))
    return float((ma - mb).norm() / mb.norm())


def test_trimmed_caches_saturate_at_prompt_plus_keep_frames():
    t2w = _t2w()
    payloads = _payloads(t2w.cfg, "r", _codes(125, 3))
    for p in payloads[:-1]:
        t2w.decode([p])
    caches = t2w._requests["r"].caches
    limit = t2w.prompt_setup().prompt_len + t2w.cfg.prompt_keep_frames
    assert caches.estimator_len == limit and caches.conformer_len == limit
    assert t2w.pool.frames == limit  # the pool holds exactly the saturated length


def test_two_instances_with_the_same_seed_give_identical_audio():
    runs = []
    for _ in range(2):
        t2w = _t2w()
        a, b = _payloads(t2w.cfg, "a", _codes(60, 4)), _payloads(t2w.cfg, "b", _codes(30, 5))
        audio = [o.audio for o in t2w.decode([a[0], b[0]])]
        audio += [o.audio for o in t2w.decode([a[1], b[1]])]
        audio += [o.audio for o in t2w.decode([a[2]])]
        runs.append(audio)
    assert all(torch.equal(torch.from_numpy(x), torch.from_numpy(y)) for x, y in zip(*runs))


def test_batched_rows_match_rows_decoded_alone():
    batched, alone = _t2w(), _t2w()
    streams = {f"r{i}": _payloads(batched.cfg, f"r{i}", _codes(50, 10 + i)) for i in range(3)}
    for step in range(3):
        outs = batched.decode([s[step] for s in streams.values()])
        for rid, out in zip(streams, outs):
            single = alone.decode([streams[rid][step]])[0]
            assert (out.mel - single.mel).abs().max().item() < MEL_TOL


def _ragged_traffic(t2w: Token2Wav):
    """8 requests, staggered starts and lengths: steps mix first, steady and last chunks."""
    lengths = [10, 30, 55, 80, 25, 60, 5, 100]
    pending = {f"r{i}": _payloads(t2w.cfg, f"r{i}", _codes(n, 20 + i)) for i, n in enumerate(lengths)}
    start = {f"r{i}": i // 2 for i in range(8)}
    step = 0
    while pending:
        batch = [q.pop(0) for rid, q in pending.items() if start[rid] <= step]
        pending = {rid: q for rid, q in pending.items() if q}
        yield step, batch
        step += 1


def test_one_shape_steps_decode_as_one_group_beside_final_chunks_and_like_alone():
    # The replica's one_shape_steps rule on the real decoder: every step that take_batch makes
    # with step_shape runs one non-final chunk group (plus a group per final chunk), no stream
    # is left behind, and each stream's audio is what it gets decoded alone (fp32 rounding).
    from collections import deque

    from stages.code2wav.prompt import prompt_id_of
    from stages.runner.replica_proc import take_batch

    t2w, alone = _t2w(), _t2w()
    voice = _voice("ref_0.wav")
    streams = {}
    for i, n in enumerate([80, 30, 105, 55, 10, 80]):  # 1 to 4 chunks and a final each
        pid, audio = (prompt_id_of(voice), voice) if i % 2 else ("default", None)
        ch = Chunker(t2w.cfg, f"r{i}", pid, seed=i, prompt_audio=audio)
        streams[f"r{i}"] = [*ch.push(_codes(n, 40 + i)), ch.finish()]
    pending, out, deferred, merged_voices, step = deque(), {rid: [] for rid in streams}, 0, 0, 0
    while step < len(streams) or pending:
        if step < len(streams) and step % 2 == 0:  # two streams, two voices, every other step
            for rid in (f"r{step}", f"r{step + 1}"):
                pending.extend(streams[rid])
                t2w.prepare(streams[rid][0])
        heads = {p.request_id: t2w.step_shape(p) for p in reversed(pending)}  # each request's oldest
        batch = take_batch(pending, 4, shape_of=t2w.step_shape)
        shapes = {t2w.step_shape(p) for p in batch} - {None}
        deferred += sum(1 for s in heads.values() if s is not None and shapes and s not in shapes)
        before = t2w.work()["groups"]
        for o in t2w.decode(batch):
            out[o.request_id].append(o)
        finals = sum(p.last_chunk for p in batch)
        assert len(shapes) <= 1 and t2w.work()["groups"] - before == len(shapes) + finals
        step += 1
        merged_voices += len({p.prompt_id for p in batch if p.chunk_seq == 0 and not p.last_chunk}) == 2
    # the rule held rows back, first chunks of two voices ran as one group, and all finished
    assert deferred > 0 and merged_voices > 0 and t2w.active_requests == 0
    for rid, payloads in streams.items():
        alone.prepare(payloads[0])
        assert [o.chunk_seq for o in out[rid]] == [p.chunk_seq for p in payloads]
        for o, p in zip(out[rid], payloads):
            assert (o.mel - alone.decode([p])[0].mel).abs().max().item() < MEL_TOL


def test_batched_cache_split_is_byte_identical_to_per_row_with_ragged_groups():
    arms = [_t2w(extra={"code2wav_batched_cache_split": v}) for v in (True, "false")]
    assert [a.options.batched_cache_split for a in arms] == [True, False]
    traffic = [list(_ragged_traffic(arms[0]))]
    group_sizes = set()
    for _, batch in traffic[0]:
        outs = [arm.decode(batch) for arm in arms]
        for x, y in zip(*outs):
            assert x.request_id == y.request_id
            assert torch.equal(torch.from_numpy(x.audio), torch.from_numpy(y.audio))
        assert {r: s.slot for r, s in arms[0]._requests.items()} == {
            r: s.slot for r, s in arms[1]._requests.items()
        }
        for name, tensor in arms[0].pool.tensors.items():
            assert torch.equal(tensor, arms[1].pool[name]), name
        group_sizes.add(len(batch))
    assert max(group_sizes) >= 4 and arms[0].active_requests == 0


def test_state_lifecycle_and_errors():
    t2w = _t2w()
    p = _payloads(t2w.cfg, "r", _codes(50, 6))
    t2w.decode([p[0]])
    with pytest.raises(Code2WavPayloadError, match="expected 1"):
        t2w.decode([p[2]])
    with pytest.raises(Code2WavPayloadError, match="two payloads"):
        t2w.decode([p[1], p[1]])
    t2w.drop("r")
    assert t2w.active_requests == 0 and t2w.pool.in_use == 0
    with pytest.raises(Code2WavPayloadError, match="expected 0"):
        t2w.decode([p[1]])
    t2w.decode([p[0]])  # chunk_seq 0 restarts a stream
    with pytest.raises(ValueError, match="unknown prompt id"):
        t2w.decode([CodecPayload("x", 0, (1, 2, 3, 4), False, prompt_id="nope")])


@pytest.mark.gpu
def test_cuda_decode_matches_contract_and_cpu_mel():
    cfg = tiny_config(extra={"token2wav_allow_tf32": "off"})
    gpu = Token2Wav(cfg, device=torch.device("cuda"), dtype=torch.float32, keep_mel=True)
    cpu = Token2Wav(cfg, device=torch.device("cpu"), dtype=torch.float32, keep_mel=True)
    payloads = _payloads(cfg, "r", _codes(50, 7))
    for p in payloads:
        g, c = gpu.decode([p])[0], cpu.decode([p])[0]
        assert g.audio.shape == c.audio.shape
        assert (g.mel - c.mel).abs().max().item() < 1e-2


@pytest.fixture
def deterministic_cuda(monkeypatch):
    # Without deterministic algorithms the LAST chunk of this test differed in its low bits on
    # an H200 in 2 of 3 runs, in a different row each run: some kernel on the final-chunk path
    # is nondeterministic run to run (not yet identified). With them it passed; the comparison
    # is about the cache split, so pin the kernels, not the tolerance.
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(previous)


@pytest.mark.gpu
@pytest.mark.slow
def test_full_size_steady_chunks_on_cuda_batched_equals_per_row(deterministic_cuda):
    from stages.code2wav.config import Code2WavConfig

    arms = [
        Token2Wav(Code2WavConfig(extra={"code2wav_batched_cache_split": v}),
                  device=torch.device("cuda"), dtype=torch.float32)
        for v in (True, False)
    ]  # fmt: skip
    cfg = arms[0].cfg
    streams = [_payloads(cfg, f"r{i}", _codes(100, 40 + i)) for i in range(8)]
    for k in range(len(streams[0])):
        outs = [arm.decode([s[k] for s in streams]) for arm in arms]
        for x, y in zip(*outs):
            assert torch.equal(torch.from_numpy(x.audio), torch.from_numpy(y.audio))
        if 0 < k < len(streams[0]) - 1:
            assert all(o.audio.shape == (cfg.sample_rate,) for o in outs[0])
    limit = arms[0].prompt_setup().prompt_len + cfg.prompt_keep_frames
    assert limit == 400


def test_a_requests_vocoder_noise_does_not_depend_on_its_batch_mates():
    # Same codes for request "a", decoded alone in one instance and beside "b" in another: the
    # NSF noise comes from a's own generator, so the rows that differ only by batch company
    # must agree to GEMM rounding, and a's audio must not change when b's codes change.
    alone, paired, paired_other = _t2w(), _t2w(), _t2w()
    a = _payloads(alone.cfg, "a", _codes(60, 7), seed=1)
    b = _payloads(alone.cfg, "b", _codes(60, 8), seed=2)
    c = _payloads(alone.cfg, "b", _codes(60, 9), seed=2)
    solo = np.concatenate([alone.decode([p])[0].audio for p in a])
    # "a" sits in the second row: a shared generator would hand it the mate's draws.
    with_b = np.concatenate([paired.decode([pb, pa])[1].audio for pa, pb in zip(a, b)])
    with_c = np.concatenate([paired_other.decode([pc, pa])[1].audio for pa, pc in zip(a, c)])
    assert np.array_equal(with_b, with_c)  # identical shapes, only the mate's codes differ
    # Batch-company GEMM rounding (~1e-6 in the mel) reaches the audio amplified by the live
    # vocoder (f0 in Hz, integrated into the source's phase): measured 1.1e-4 on a 0.5 peak.
    assert np.abs(solo - with_b).max() < 1e-3


def test_audio_follows_the_request_seed_not_its_id():
    # A/B arms name their requests differently ("base:..." / "test:..."); equal codes and seed
    # must still give equal audio, and another seed must give other noise.
    t2w = _t2w()
    codes = _codes(40, 3)

    def audio(rid, seed):
        return np.concatenate([t2w.decode([p])[0].audio for p in _payloads(t2w.cfg, rid, codes, seed)])

    assert np.array_equal(audio("base:x", 5), audio("test:x", 5))
    assert not np.array_equal(audio("base:x", 5), audio("base:x", 6))


def test_pooled_vocoder_equals_the_per_row_reference_stream():
    # ChunkDecoder vocodes a batch against the slot pool; HiFTStream is the plain per-row
    # reference of the same streaming contract (cache, cross-fade, hold-back). Same mel, same
    # counter noise: same bytes.
    from stages.code2wav import noise
    from stages.code2wav.hift import HiFTStream, NoiseKeys
    from stages.code2wav.stream_state import vocoder_seed

    t2w = _t2w()
    seeds = {"a": 3, "b": 4}
    streams = {rid: _payloads(t2w.cfg, rid, _codes(70, 20 + k), seed=seeds[rid]) for k, rid in enumerate(seeds)}
    ref, states = HiFTStream(t2w.cfg.hift), [None, None]
    request_seeds = torch.tensor([vocoder_seed(0, s) for s in seeds.values()])
    for step in range(len(streams["a"])):
        outs = t2w.decode([streams[rid][step] for rid in seeds])  # one batch of two rows
        keys = NoiseKeys(noise.row_keys(request_seeds, torch.tensor([o.chunk_seq for o in outs])))
        audio, states = ref.decode(t2w.hift, torch.stack([o.mel for o in outs]), states,
                                   [o.last_chunk for o in outs], generator=keys)
        for out, want in zip(outs, audio):
            assert torch.equal(torch.from_numpy(out.audio), want), (out.request_id, step)


PROMPTS = __import__("pathlib").Path(__file__).resolve().parents[2] / "tts_bench/data/seed-tts-en/prompts"


def _voice(name: str) -> bytes:
    return (PROMPTS / name).read_bytes()


def test_a_request_voice_is_built_once_then_reused_and_changes_the_audio():
    from stages.code2wav.prompt import prompt_id_of

    t2w = _t2w()
    voice = _voice("ref_0.wav")
    codes = _codes(60, 11)

    def run(rid, audio):
        pid = prompt_id_of(audio) if audio else "default"
        ch = Chunker(t2w.cfg, rid, pid, seed=1, prompt_audio=audio)
        payloads = [*ch.push(codes), ch.finish()]
        stats = t2w.prepare(payloads[0])
        return stats, np.concatenate([t2w.decode([p])[0].audio for p in payloads])

    miss, with_voice = run("a", voice)
    hit, again = run("b", voice)
    assert miss["cache_hit"] is False and miss["setup_ms"] > 0 and hit == {"cache_hit": True, "setup_ms": 0.0}
    assert np.array_equal(with_voice, again)  # same codes, seed and voice
    default_stats, default_audio = run("c", None)
    assert default_stats["cache_hit"] and not np.array_equal(with_voice, default_audio)
    assert t2w.prompt_cache()["entries"] == 2 and t2w.prompt_cache()["bytes"] > 0


def test_rows_of_different_voices_decode_in_one_batch_like_alone():
    from stages.code2wav.prompt import prompt_id_of

    batched, alone = _t2w(), _t2w()
    voices = [_voice(f"ref_{i}.wav") for i in range(3)]
    streams = []
    for i, v in enumerate(voices):
        ch = Chunker(batched.cfg, f"v{i}", prompt_id_of(v), seed=i, prompt_audio=v)
        streams.append([*ch.push(_codes(50, 30 + i)), ch.finish()])
    for step in range(len(streams[0])):
        outs = batched.decode([s[step] for s in streams])
        assert len({o.request_id for o in outs}) == 3
        for s, out in zip(streams, outs):
            single = alone.decode([s[step]])[0]
            assert (out.mel - single.mel).abs().max().item() < MEL_TOL


def test_bad_and_over_long_voices_are_prompt_errors_and_the_lru_keeps_registered_voices():
    from stages.code2wav.prompt import prompt_id_of
    from stages.audio import PromptError

    t2w = _t2w(prompt_cache_size=2, ref_audio_limit_seconds=6.5)
    t2w.prompt_setup()  # the default voice, as a replica builds it at start

    def first(rid, audio):
        return Chunker(t2w.cfg, rid, prompt_id_of(audio), prompt_audio=audio).finish()

    with pytest.raises(PromptError, match="cannot decode reference audio"):
        t2w.prepare(first("bad", b"this is a text file named x.wav"))
    with pytest.raises(PromptError, match="empty"):
        t2w.prepare(first("empty", _wav_bytes(np.zeros(0, np.float32))))
    with pytest.raises(PromptError, match="ref_audio_limit_seconds"):
        t2w.prepare(first("long", _wav_bytes(np.zeros(24000 * 7, np.float32))))
    for i in range(3):
        t2w.prepare(first(f"v{i}", _voice(f"ref_{i}.wav")))
    held = set(t2w._setups)
    assert "default" in held and prompt_id_of(_voice("ref_0.wav")) not in held and len(held) == 3


def test_a_batch_of_new_voices_builds_each_once_even_when_the_lru_evicts_them(monkeypatch):
    """The replica prepares each new stream's voice, then decodes the batch: the decode uses
    the voices it was prepared with, though the LRU (one voice) has evicted all but the last."""
    from stages.code2wav.prompt import prompt_id_of

    t2w = _t2w(prompt_cache_size=1)
    builds = []
    build = t2w._build_setup
    monkeypatch.setattr(t2w, "_build_setup", lambda pf: builds.append(1) or build(pf))
    voices = [_voice(f"ref_{i}.wav") for i in range(3)]
    firsts = [Chunker(t2w.cfg, f"v{i}", prompt_id_of(v), seed=i, prompt_audio=v).push(_codes(30, 40 + i))[0]
              for i, v in enumerate(voices)]
    stats = [t2w.prepare(p) for p in firsts]
    outs = t2w.decode(firsts)
    assert len(builds) == 3 and all(s["cache_hit"] is False for s in stats)
    assert [o.request_id for o in outs] == ["v0", "v1", "v2"] and t2w.active_requests == 3
    assert len(t2w._prepared) == 0  # nothing held past the decode


def _wav_bytes(samples: np.ndarray, rate: int = 24000) -> bytes:
    import io
    import wave

    buf = io.BytesIO()
    with wave.open(buf, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes((samples * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def test_describe_reports_the_speaker_branch_that_runs(monkeypatch):
    """The run record says where the speaker embedding ran: the flag, unless the environment
    opts the device out (then the CPU branch runs and the record must say so)."""
    assert _t2w(extra={"token2wav_device_spk": True}).describe()["speaker_branch"].startswith("device-torch")
    off = _t2w(extra={"token2wav_device_spk": False}).describe()
    assert off["device_spk"] is False and off["speaker_branch"] == "cpu-onnxruntime"
    monkeypatch.setenv("VLLM_OMNI_DEVICE_SPK", "0")
    opted_out = _t2w(extra={"token2wav_device_spk": True}).describe()
    assert opted_out["device_spk"] is False and opted_out["speaker_branch"] == "cpu-onnxruntime"


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_cuda_a_chunk_waits_for_the_device_once(graphs, deterministic_cuda):
    """A batch's one host read is its audio: the chunk's inputs are queued, not copied from
    pageable memory (which would wait for the replica's groups already launched)."""
    import warnings
    from dataclasses import replace

    cfg = tiny_config()
    t2w = Token2Wav(replace(cfg, extra={**cfg.extra, "code2wav_device_graph": graphs}),
                    device=torch.device("cuda"), dtype=torch.float32, slots=4)
    streams = [_payloads(t2w.cfg, f"r{i}", _codes(130, 20 + i)) for i in range(2)]
    for k in range(2):  # warm up (and capture)
        t2w.decode([s[k] for s in streams])
    torch.cuda.synchronize()
    waits = []
    torch.cuda.set_sync_debug_mode("warn")
    try:
        for k in range(2, len(streams[0]) - 1):  # steady chunks (the last one is eager anyway)
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                t2w.decode([s[k] for s in streams])
            waits.append(sum("synchronizing" in str(w.message) for w in seen))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert waits and all(n == 1 for n in waits), waits
