"""Prompt sets in the seed-tts `meta.lst` format and the selection every command shares (the
requests a phase sends from them: `tts_bench.load.plan`).

A meta.lst line is `utt|prompt_text|prompt_wav|text`: an utterance id, the transcript of a
reference recording, that recording's path (relative to the meta.lst directory) and the text to
synthesize. A fifth field that names an audio file (`...|text|gt.wav`, the ground-truth recording
some seed-tts-eval tools list) is accepted and not used. Lines starting with `#` and blank lines
are skipped; anything else that is not four fields is reported with its file:line. A `|` inside
the text is such a line: it cannot be told from a separator, and guessing (dropping or joining
the rest) would synthesize something other than what the file says, so it is an error. The file
must be UTF-8 (a byte-order mark is dropped); a bad byte is reported by line. Lines end at
`\n`, `\r\n` or `\r` only (not at the Unicode separators `str.splitlines` also splits on,
which an editor does not show as line breaks). Utterance ids name files (`tts-bench wer` writes
`wavs/<arm>/<id>.wav`), so an id with a path separator, `..`, a control character or over 200
bytes is refused.

`builtin:seed-tts-en` is the packaged English set (tts_bench/data/seed-tts-en/): sentences of
3 to 40 words with no digits and no number words, because Whisper writes numbers as digits and
the seed-tts normalization would count them as errors.

    prompts = load_prompts("builtin:seed-tts-en")
    batch = select_prompts(prompts, 20, shuffle=False, seed=0)   # fixed file order
    batch[0].request_id                                           # 'en_0001'

When `n` exceeds the set, selection cycles and the copies get distinct request ids
(`en_0001#2`), so results never hold the same id twice.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from stages.admission import text_problem, voice_file_problem
from tts_bench.inputs.text import read_utf8
from tts_bench.inputs.voices import check_distinct_voices
from tts_bench.errors import ConfigError

if TYPE_CHECKING:
    from tts_bench.config import BenchConfig

BUILTIN_PREFIX = "builtin:"
_MAX_REPORTED = 10  # malformed lines listed in one error


@dataclass(frozen=True)
class Prompt:
    """One utterance to synthesize; `copy` > 1 marks a cycled repeat within one selection."""

    utt: str
    prompt_text: str
    prompt_wav: Path | None
    text: str
    copy: int = 1
    line: int = field(default=0, compare=False)  # its meta.lst line (0: not read from one)

    @property
    def request_id(self) -> str:
        return self.utt if self.copy == 1 else f"{self.utt}#{self.copy}"


def builtin_dir() -> Path:
    """Directory holding the packaged prompt sets (one sub-directory per set)."""
    return Path(str(resources.files("tts_bench") / "data"))


def builtin_sets() -> list[str]:
    root = builtin_dir()
    return sorted(p.parent.name for p in root.glob("*/meta.lst"))


def resolve_meta(meta: str | Path) -> Path:
    """`builtin:<name>` -> packaged meta.lst; anything else is a path to a meta.lst."""
    text = str(meta)
    if text.startswith(BUILTIN_PREFIX):
        name = text[len(BUILTIN_PREFIX):]
        path = builtin_dir() / name / "meta.lst"
        if not path.is_file():
            valid = ", ".join(BUILTIN_PREFIX + s for s in builtin_sets())
            raise ConfigError(f"error: unknown prompt set {text!r} (prompts.meta); valid: {valid}")
        return path
    path = Path(text)
    if not path.is_file():
        raise ConfigError(
            f"error: prompt list {text!r} is not a file (prompts.meta; a relative path is read from "
            f"the working directory, not from the config's folder); pass a seed-tts meta.lst or "
            f"builtin:seed-tts-en"
        )
    return path


_AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg")
_MAX_UTT_BYTES = 200  # ids become file names (<id>.wav, <id>#2.wav): stay well under 255 bytes
_LINE_BREAK = re.compile(r"\r\n|\n|\r")


def _is_audio_path(field: str) -> bool:
    return bool(field) and " " not in field and field.lower().endswith(_AUDIO_SUFFIXES)


def _utt_problem(utt: str) -> str | None:
    if not utt:
        return "empty utt id"
    if "/" in utt or "\\" in utt or utt in (".", "..") or utt.startswith(".."):
        return f"utt id {utt!r} is a path, not a name (ids name the files of a WER run); use letters, digits, '-', '_', '.'"
    if any(unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") for ch in utt):
        return f"utt id {utt!r} holds a control or invisible character; remove it"
    if len(utt.encode("utf-8")) > _MAX_UTT_BYTES:
        return f"utt id is {len(utt.encode('utf-8'))} bytes long, over {_MAX_UTT_BYTES} (ids name files); shorten it"
    return None


def _parse_line(line: str, base: Path) -> Prompt | str:
    """A Prompt, or the reason the line is malformed."""
    fields = line.split("|")
    if len(fields) == 5 and _is_audio_path(fields[4].strip()):
        fields = fields[:4]  # utt|prompt_text|prompt_wav|text|gt_wav: the recording is not used
    if len(fields) > 4:
        return (f"expected 4 fields utt|prompt_text|prompt_wav|text, got {len(fields)}: a '|' "
                f"inside the text cannot be told from a separator; remove it from the text")
    if len(fields) < 4:
        return f"expected 4 fields utt|prompt_text|prompt_wav|text, got {len(fields)}"
    utt, prompt_text, wav, text = (f.strip() for f in fields[:4])
    problem = _utt_problem(utt)
    if problem:
        return problem
    if not text:
        return "empty text"
    return Prompt(utt, prompt_text, (base / wav) if wav else None, text)


def parse_meta(text: str, *, source: Path, base: Path | None = None) -> list[Prompt]:
    """Parse meta.lst content; all malformed lines are reported together as file:line."""
    base = source.parent if base is None else base
    prompts: list[Prompt] = []
    errors: list[str] = []
    seen: dict[str, int] = {}
    for lineno, raw in enumerate(_LINE_BREAK.split(text.removeprefix("\ufeff")), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parsed = _parse_line(line, base)
        if isinstance(parsed, str):
            errors.append(f"{source}:{lineno}: {parsed}")
        elif parsed.utt in seen:
            first = seen[parsed.utt]
            why = f"duplicate utt {parsed.utt!r} (first on line {first})"
            errors.append(f"{source}:{lineno}: {why}")
        else:
            seen[parsed.utt] = lineno
            prompts.append(dataclasses.replace(parsed, line=lineno))
    if errors:
        shown = "\n  ".join(errors[:_MAX_REPORTED])
        hidden = len(errors) - _MAX_REPORTED
        more = f"\n  ... and {hidden} more" if hidden > 0 else ""
        raise ConfigError(
            f"error: malformed prompt list ({source}):\n  {shown}{more}\n"
            f"fix those lines (format utt|prompt_text|prompt_wav|text, # for comments)"
        )
    if not prompts:
        raise ConfigError(
            f"error: prompt list has no prompts ({source}); "
            f"add utt|prompt_text|prompt_wav|text lines"
        )
    return prompts


def check_prompt_wavs(prompts: Sequence[Prompt], *, source: str | Path = "prompts.meta",
                      limit_seconds: float | None = None) -> None:
    """Every selected prompt's reference wav exists and decodes to finite audio; else a
    ConfigError (exit 2) naming the meta.lst line. With `limit_seconds` (an embedded arm's
    code2wav.ref_audio_limit_seconds) also the stage's channel and length rules. Each file is
    read once, however many lines share it (`stages.admission.voice_file_problem`: what the
    stages accept as a voice)."""
    checked: dict[Path, str | None] = {}
    for p in prompts:
        if p.prompt_wav is None:
            continue
        if p.prompt_wav not in checked:
            checked[p.prompt_wav] = voice_file_problem(p.prompt_wav, limit_seconds=limit_seconds)
        problem = checked[p.prompt_wav]
        if problem:
            where = f"{source}:{p.line}" if p.line else str(source)
            raise ConfigError(
                f"error: the reference wav of {p.utt!r} {problem} ({where}: {p.prompt_wav}); "
                f"fix or replace it (prompt wav paths are relative to the meta.lst)")


# Backends that send each request's voice (piper ignores it, synthetic has none).
VOICE_BACKENDS = ("embedded", "http")


def check_bench_prompts(arms: dict, prompts: Sequence[Prompt]) -> None:
    """Before a bench run (`ab`, `mem`) exists: the texts and voices its arms will send. Every
    text must fit an embedded arm's talker (`check_text_lengths`); every prompt wav must decode
    when an arm's backend sends voices, and be 16-bit PCM WAV when an arm makes `distinct`
    voices of it; else a ConfigError (exit 2) instead of an invalid run later."""
    base = next(iter(arms.values()))
    check_text_lengths(list(arms.values()), prompts, source=base.prompts.meta)
    if any(c.backend in VOICE_BACKENDS and c.prompts.voices != "default" for c in arms.values()):
        check_prompt_wavs(prompts, source=base.prompts.meta, limit_seconds=embedded_voice_limit(list(arms.values())))
    if any(c.prompts.voices == "distinct" for c in arms.values()):
        check_distinct_voices(p.prompt_wav for p in prompts)


def check_text_lengths(arms: Sequence, prompts: Sequence[Prompt], *, source: str | Path) -> None:
    """Every text fits the talker cache of each embedded arm with random weights (what its
    backend refuses per request, `EmbeddedBackend.check_request`): a ConfigError naming the
    lines, instead of requests failed as `invalid_request` after the run has started."""
    too_long: dict[str, None] = {}  # ordered, once per line even when both arms refuse it
    for cfg in arms:
        if cfg.backend != "embedded":
            continue
        for p in prompts:
            problem = text_problem(p.text, cfg.stages)
            if problem is not None:
                too_long[f"{source}:{p.line}: {p.utt!r} {problem}"] = None
    if too_long:
        shown = "\n  ".join(list(too_long)[:_MAX_REPORTED])
        raise ConfigError(f"error: {len(too_long)} text(s) are too long for the talker:\n  {shown}\n"
                          "shorten them, or raise runner.max_seq_len (the memory check counts it)")


def embedded_voice_limit(arms: Sequence) -> float | None:
    """The strictest reference-audio length limit among the embedded arms (None: no such arm)."""
    limits = [c.stages.code2wav.ref_audio_limit_seconds for c in arms if c.backend == "embedded"]
    return min(limits) if limits else None


def load_prompts(meta: str | Path) -> list[Prompt]:
    """Load a meta.lst (path or `builtin:<name>`) in file order."""
    path = resolve_meta(meta)
    return parse_meta(read_utf8(path, what="prompt list", option="prompts.meta"), source=path)


def select_prompts(
    prompts: Sequence[Prompt], n: int, *, shuffle: bool, seed: int = 0
) -> list[Prompt]:
    """The first `n` prompts in file order, or of a seeded permutation; cycles past the end.

    The same (set, n, shuffle, seed) always gives the same list, so both arms of an A/B and
    every repeat see identical requests.
    """
    if n < 1:
        raise ConfigError(
            f"error: number of prompts must be >= 1, got {n} (--num-prompts); pass a positive count"
        )
    if not prompts:
        raise ConfigError(
            "error: the prompt set is empty (prompts.meta); load a non-empty meta.lst"
        )
    order = np.arange(len(prompts))
    if shuffle:
        order = np.random.default_rng(seed).permutation(len(prompts))
    out = []
    for i in range(n):
        p = prompts[int(order[i % len(prompts)])]
        copy = i // len(prompts) + 1
        out.append(p if copy == 1 else dataclasses.replace(p, copy=copy))
    return out


def select_bench_prompts(cfg: BenchConfig, num_prompts: int) -> list[Prompt]:
    """The prompts every arm of a bench sends (`ab`, `mem`, `gate`), from the first arm's
    prompt config: `num_prompts` of its meta.lst, shuffled unless bench.disable_shuffle."""
    prompts = load_prompts(cfg.prompts.meta)
    return list(select_prompts(prompts, num_prompts, shuffle=not cfg.bench.disable_shuffle,
                               seed=cfg.prompts.shuffle_seed))
