"""The meta.lst loader, prompt selection, and the content rules of the packaged English set."""

from __future__ import annotations

import importlib
import re
import wave
from pathlib import Path

import numpy as np
import pytest

from tts_bench.errors import ConfigError
from tts_bench.inputs.prompts import Prompt, builtin_sets, load_prompts, parse_meta, resolve_meta, select_prompts

REPO = Path(__file__).resolve().parents[2]

# Whisper writes these as digits; the seed-tts normalization would then count them as errors.
NUMBER_WORDS = set(
    """zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen
    fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty
    ninety hundred hundreds thousand thousands million millions billion billions trillion
    first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth twentieth
    hundredth thousandth dozen dozens half halves quarter quarters once twice thrice single
    double triple couple pair pairs ones twos tens nought nil percent""".split()
)


def write_meta(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "set" / "meta.lst"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_loader_reads_fields_and_skips_comments(tmp_path):
    path = write_meta(
        tmp_path,
        "# comment\n\nu1|hello there|wavs/a.wav|Good morning, everybody.\r\n"
        "   # indented comment\nu2|||Lock the door.\nu3|p|b.wav|See you tomorrow.\n",
    )
    prompts = load_prompts(path)
    assert [p.utt for p in prompts] == ["u1", "u2", "u3"]
    assert prompts[0] == Prompt("u1", "hello there", path.parent / "wavs/a.wav", "Good morning, everybody.")
    assert prompts[1].prompt_wav is None and prompts[1].prompt_text == ""
    assert prompts[2].text == "See you tomorrow."


def test_a_pipe_inside_the_text_is_an_error_naming_the_line_not_a_truncated_text(tmp_path):
    path = write_meta(tmp_path, "u1|p|a.wav|fine\nu2|p|b.wav|left | right\n")
    with pytest.raises(ConfigError) as info:
        load_prompts(path)
    msg = str(info.value)
    assert f"{path}:2: expected 4 fields utt|prompt_text|prompt_wav|text, got 5" in msg, msg
    assert "'|' inside the text" in msg and f"{path}:1" not in msg
    assert info.value.exit_status == 2


def test_a_utf8_byte_order_mark_does_not_end_up_in_the_first_id(tmp_path):
    path = tmp_path / "meta.lst"
    path.write_bytes("u1|p|a.wav|Good morning.\nu2|p|b.wav|Good night.\n".encode("utf-8-sig"))
    assert [p.utt for p in load_prompts(path)] == ["u1", "u2"]


def test_a_non_utf8_prompt_list_names_the_line_of_the_bad_byte(tmp_path):
    path = tmp_path / "meta.lst"
    path.write_bytes(b"u1|p|a.wav|Good morning.\nu2|p|b.wav|Caf\xe9 au lait.\n")
    with pytest.raises(ConfigError) as info:
        load_prompts(path)
    msg = str(info.value)
    assert "not UTF-8" in msg and "line 2" in msg and f"({path}:2)" in msg, msg
    assert "position" not in msg and info.value.exit_status == 2


def test_malformed_lines_are_all_reported_with_file_and_line(tmp_path):
    path = write_meta(tmp_path, "u1|a|b.wav|fine\nonly|three|fields\n# ok\n|p|w|no id\nu4|p|w|\nu1|p|w|again\n")
    with pytest.raises(ConfigError) as info:
        load_prompts(path)
    msg = str(info.value)
    for line, why in ((2, "expected 4 fields"), (4, "empty utt"), (5, "empty text"), (6, "duplicate utt 'u1'")):
        assert f"{path}:{line}: {why}" in msg, msg
    assert ":1:" not in msg and ":3:" not in msg
    assert info.value.exit_status == 2


def test_too_many_fields_is_malformed(tmp_path):
    with pytest.raises(ConfigError, match=r"meta.lst:1: expected 4 fields.*got 6"):
        load_prompts(write_meta(tmp_path, "a|b|c|d|e|f\n"))


def test_empty_list_and_missing_file_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no prompts"):
        load_prompts(write_meta(tmp_path, "# nothing\n"))
    with pytest.raises(ConfigError, match="is not a file"):
        load_prompts(tmp_path / "missing.lst")
    with pytest.raises(ConfigError, match="builtin:seed-tts-en"):
        load_prompts("builtin:nope")


def prompts_n(n: int) -> list[Prompt]:
    return parse_meta("".join(f"u{i}|p|w.wav|text {i}\n" for i in range(n)), source=Path("m/meta.lst"))


def test_fixed_order_takes_the_file_order():
    got = select_prompts(prompts_n(5), 3, shuffle=False, seed=7)
    assert [p.request_id for p in got] == ["u0", "u1", "u2"]


def test_shuffle_is_seeded_and_a_permutation():
    ps = prompts_n(20)
    a = select_prompts(ps, 20, shuffle=True, seed=1)
    assert [p.utt for p in a] == [p.utt for p in select_prompts(ps, 20, shuffle=True, seed=1)]
    assert [p.utt for p in a] != [p.utt for p in select_prompts(ps, 20, shuffle=True, seed=2)]
    assert sorted(p.utt for p in a) == sorted(p.utt for p in ps)


def test_cycling_past_the_set_gives_distinct_request_ids():
    got = select_prompts(prompts_n(3), 8, shuffle=False)
    ids = [p.request_id for p in got]
    assert ids == ["u0", "u1", "u2", "u0#2", "u1#2", "u2#2", "u0#3", "u1#3"]
    assert len(set(ids)) == len(ids)
    assert got[3].text == got[0].text and got[3].utt == "u0"


def test_cycled_shuffle_keeps_ids_unique():
    ids = [p.request_id for p in select_prompts(prompts_n(7), 30, shuffle=True, seed=3)]
    assert len(set(ids)) == 30


def test_bad_count_is_config_error():
    with pytest.raises(ConfigError, match="--num-prompts"):
        select_prompts(prompts_n(3), 0, shuffle=False)


# ---- the packaged English set -------------------------------------------------------------


@pytest.fixture(scope="module")
def builtin() -> list[Prompt]:
    return load_prompts("builtin:seed-tts-en")


def words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z']+", text)


def test_builtin_set_is_listed_and_large_enough(builtin):
    assert "seed-tts-en" in builtin_sets()
    assert resolve_meta("builtin:seed-tts-en").name == "meta.lst"
    assert len(builtin) >= 120
    assert all(re.fullmatch(r"en_\d{4}", p.utt) for p in builtin)
    assert len({p.text for p in builtin}) == len(builtin)  # no repeated sentence


def test_builtin_texts_are_three_to_forty_words_and_varied(builtin):
    counts = [len(words(p.text)) for p in builtin]
    assert min(counts) >= 3 and max(counts) <= 40
    assert sum(c <= 6 for c in counts) >= 10 and sum(c >= 20 for c in counts) >= 10


def test_builtin_set_has_no_digits_and_no_number_words(builtin):
    for p in builtin:
        for text in (p.text, p.prompt_text):
            assert not re.search(r"\d", text), (p.utt, text)
            tokens = {w.lower().strip("'") for w in words(text)}
            tokens |= {t.removesuffix("'s") for t in tokens}
            assert not tokens & NUMBER_WORDS, (p.utt, tokens & NUMBER_WORDS)


def test_builtin_set_uses_only_plain_punctuation(builtin):
    # Symbols (%, &, $, -) make Whisper's spelling unpredictable.
    for p in builtin:
        assert re.fullmatch(r"[A-Za-z ,.?!']+", p.text), (p.utt, p.text)


def test_builtin_reference_wavs_exist_and_are_six_seconds_24k_mono(builtin):
    wavs = {p.prompt_wav for p in builtin}
    assert 1 <= len(wavs) <= 5
    for path in wavs:
        with wave.open(str(path)) as fh:
            assert (fh.getnchannels(), fh.getsampwidth(), fh.getframerate()) == (1, 2, 24000)
            assert fh.getnframes() == 6 * 24000


def test_builtin_prompt_texts_match_the_reference_script(builtin):
    module = importlib.import_module("scripts.make_reference_wavs")
    for p in builtin:
        k = int(re.fullmatch(r"ref_(\d+)\.wav", p.prompt_wav.name).group(1))
        assert p.prompt_text == module.REFERENCES[k]


def test_every_prompt_wav_is_checked_before_generating_and_errors_name_the_line(tmp_path):
    from tts_bench.inputs.prompts import check_prompt_wavs

    good = Path(__file__).resolve().parents[2] / "tts_bench/data/seed-tts-en/prompts/ref_0.wav"
    (tmp_path / "good.wav").write_bytes(good.read_bytes())
    (tmp_path / "x.wav").write_text("this is a text file named x.wav")
    meta = tmp_path / "meta.lst"
    meta.write_text("a|t|good.wav|Hello there.\n# a comment\nb|t|x.wav|Bye now.\nc|t|good.wav|Again.\n")
    prompts = load_prompts(meta)
    check_prompt_wavs([prompts[0], prompts[2]], source=meta)  # readable: no error
    with pytest.raises(ConfigError, match=r"'b' cannot be read as audio.*meta.lst:3"):
        check_prompt_wavs(prompts, source=meta)
    (tmp_path / "good.wav").unlink()
    with pytest.raises(ConfigError, match=r"'a' does not exist .*meta.lst:1"):
        check_prompt_wavs(prompts, source=meta)


def test_a_prompt_wav_of_nan_samples_is_refused_before_generating(tmp_path):
    # A float WAV may hold NaN: it decodes, and only the stages' voice rules refused it, after
    # the run had started (exit 5). The check now refuses it as the stages would.
    import soundfile as sf

    from tts_bench.inputs.prompts import check_prompt_wavs

    sf.write(tmp_path / "nan.wav", np.full(48000, np.nan, dtype=np.float32), 24000, subtype="FLOAT")
    sf.write(tmp_path / "ok.wav", np.zeros(48000, dtype=np.float32), 24000, subtype="FLOAT")
    meta = tmp_path / "meta.lst"
    meta.write_text("a|t|ok.wav|Hello there.\nb|t|nan.wav|Bye now.\n")
    prompts = load_prompts(meta)
    check_prompt_wavs(prompts[:1], source=meta)
    with pytest.raises(ConfigError, match=r"'b' has NaN/inf samples .*meta.lst:2"):
        check_prompt_wavs(prompts, source=meta)


def test_lines_end_only_at_line_breaks_not_at_unicode_separators(tmp_path):
    # str.splitlines() also splits at U+2028, NEL, form feed, ...: characters an editor shows
    # inside a line. They stay in the text; CR, LF and CRLF still end lines.
    meta = write_meta(tmp_path, "a|t|a.wav|one\u2028two\fthree\rb|t|b.wav|x\r\nc|t|c.wav|y\n")
    prompts = load_prompts(meta)
    assert [p.utt for p in prompts] == ["a", "b", "c"]
    assert prompts[0].text == "one\u2028two\fthree"


def test_a_fifth_field_naming_the_ground_truth_recording_is_accepted_and_unused(tmp_path):
    meta = write_meta(tmp_path, "a|t|p.wav|Hello there.|gt/a.wav\nb|t|p.wav|Hi|there\n")
    with pytest.raises(ConfigError, match=r"meta.lst:2: expected 4 fields .* got 5") as exc:
        load_prompts(meta)
    assert "meta.lst:1" not in str(exc.value)
    (prompt,) = load_prompts(write_meta(tmp_path, "a|t|p.wav|Hello there.|gt/a.WAV\n"))
    assert (prompt.text, prompt.prompt_wav.name) == ("Hello there.", "p.wav")


@pytest.mark.parametrize(
    "utt, why",
    [
        ("../u1", "is a path"),
        ("a/b", "is a path"),
        ("a\\b", "is a path"),
        ("..", "is a path"),
        ("u\u200b1", "invisible character"),
        ("\ufeffu2", "invisible character"),  # a second BOM: two files concatenated
        ("x" * 201, "201 bytes long"),
        ("é" * 101, "202 bytes long"),
    ],
)
def test_ids_that_cannot_name_a_file_are_refused(tmp_path, utt, why):
    # `tts-bench wer` writes wavs/<arm>/<id>.wav: '../u1' in both arms wrote one file outside the
    # run, and the base arm was scored on the test arm's audio.
    meta = write_meta(tmp_path, f"ok|t|a.wav|fine\n{utt}|t|a.wav|text\n")
    with pytest.raises(ConfigError, match=re.escape(why)) as exc:
        load_prompts(meta)
    assert "meta.lst:2" in str(exc.value)
    assert load_prompts(write_meta(tmp_path, "en_0001.v2-x|t|a.wav|fine\n"))[0].utt == "en_0001.v2-x"


def _wav(path: Path, seconds: float, channels: int = 1, rate: int = 24000, width: int = 2) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(b"\x01\x00" * (width // 2) * int(seconds * rate) * channels if width == 2 else
                      b"\x80" * int(seconds * rate) * channels)


def test_with_a_stage_limit_the_check_applies_the_stages_voice_rules(tmp_path):
    from tts_bench.inputs.prompts import check_prompt_wavs

    _wav(tmp_path / "long.wav", 61.0)
    _wav(tmp_path / "nine.wav", 1.0, channels=9)
    _wav(tmp_path / "ok.wav", 2.0, channels=2)
    meta = tmp_path / "meta.lst"
    meta.write_text("a|t|ok.wav|One.\nb|t|long.wav|Two.\nc|t|nine.wav|Three.\n")
    prompts = load_prompts(meta)
    check_prompt_wavs(prompts, source=meta)  # no stage limit (e.g. the http backend): decodable is enough
    check_prompt_wavs(prompts[:1], source=meta, limit_seconds=60.0)
    with pytest.raises(ConfigError, match=r"'b' is 61.0 s long, the limit is code2wav.ref_audio_limit_seconds=60.*meta.lst:2"):
        check_prompt_wavs(prompts[:2], source=meta, limit_seconds=60.0)
    with pytest.raises(ConfigError, match=r"'c' has 9 channels; give 1-8 channels.*meta.lst:3"):
        check_prompt_wavs([prompts[0], prompts[2]], source=meta, limit_seconds=60.0)


def _arm(backend: str, voices: str, limit: float = 60.0):
    from types import SimpleNamespace

    # runner.weights set: the talker's length check (random weights only) is not what these test.
    return SimpleNamespace(backend=backend, prompts=SimpleNamespace(voices=voices, meta="meta.lst"),
                           stages=SimpleNamespace(code2wav=SimpleNamespace(ref_audio_limit_seconds=limit),
                                                  runner=SimpleNamespace(weights="weights", max_seq_len=1)))


def test_bench_voices_are_checked_for_the_backends_that_send_them(tmp_path):
    from tts_bench.inputs.prompts import check_bench_prompts

    meta = tmp_path / "meta.lst"
    meta.write_text("a|t|gone.wav|One.\n")
    prompts = load_prompts(meta)
    for backend in ("synthetic", "piper"):  # voices are not sent: nothing to read
        check_bench_prompts({"base": _arm(backend, "file"), "test": _arm(backend, "file")}, prompts)
    check_bench_prompts({"base": _arm("http", "default"), "test": _arm("http", "default")}, prompts)
    for backend in ("http", "embedded"):
        with pytest.raises(ConfigError, match="'a' does not exist"):
            check_bench_prompts({"base": _arm("synthetic", "file"), "test": _arm(backend, "file")}, prompts)


def test_distinct_voices_need_16_bit_wavs_before_the_run(tmp_path):
    from tts_bench.inputs.prompts import check_bench_prompts

    _wav(tmp_path / "u8.wav", 1.0, width=1)
    _wav(tmp_path / "ok.wav", 1.0)
    meta = tmp_path / "meta.lst"
    meta.write_text("a|t|ok.wav|One.\nb|t|u8.wav|Two.\n")
    prompts = load_prompts(meta)
    check_bench_prompts({"base": _arm("synthetic", "distinct")}, prompts[:1])
    with pytest.raises(ConfigError, match="8-bit .*prompts.voices=distinct"):
        check_bench_prompts({"base": _arm("synthetic", "file"), "test": _arm("synthetic", "distinct")}, prompts)


def test_texts_too_long_for_an_embedded_talker_are_refused_before_the_run(tmp_path):
    from types import SimpleNamespace

    from stages.talker.config import TalkerConfig
    from stages.talker.length import cache_positions
    from tts_bench.inputs.prompts import check_text_lengths

    meta = tmp_path / "meta.lst"
    meta.write_text("a|t|a.wav|Hello there.\nb|t|a.wav|" + "word " * 300 + "\n")
    prompts = load_prompts(meta)
    talker = TalkerConfig()
    limit = cache_positions(prompts[0].text, talker) + 10

    def arm(backend="embedded", weights=None):
        return SimpleNamespace(backend=backend, stages=SimpleNamespace(
            talker=talker, runner=SimpleNamespace(weights=weights, max_seq_len=limit)))

    check_text_lengths([arm()], prompts[:1], source=meta)
    check_text_lengths([arm("synthetic"), arm(weights="/w")], prompts, source=meta)  # not judged here
    with pytest.raises(ConfigError, match=r"meta.lst:2: 'b' needs \d+ talker cache positions, runner.max_seq_len is"):
        check_text_lengths([arm("synthetic"), arm()], prompts, source=meta)
    with pytest.raises(ConfigError, match=r"error: 1 text\(s\) are too long") as err:  # not once per arm
        check_text_lengths([arm(), arm()], prompts, source=meta)
    assert str(err.value).count("meta.lst:2:") == 1
