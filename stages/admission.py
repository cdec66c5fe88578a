"""What the stages admit: the rules a request's text and voice must pass, as public checks.

The stages refuse a request whose text does not fit the talker's cache or whose seed is outside
[0, MAX_SEED) (`invalid_request`), and a voice they cannot use (`bad_prompt`). The harness asks the same questions earlier, with these
functions: over a whole prompt list before a run starts (a ConfigError naming the line instead
of failed requests minutes in), and per request at the embedded backend's and the server's edge
(a 400 before any stage sees it). One rule, two callers: what the check passes is what the
stages run. Each check returns why the input is refused, as a phrase the caller puts in its own
message, or None.

torch-free (numpy and soundfile, through `stages.audio`): the piper and http backends check
voices without loading torch.

    text_problem("Hello there.", stage_cfg)             # None, or "needs 5000 talker cache positions, ..."
    voice_problem(channels=2, samples=48000, sample_rate=24000, limit_seconds=30.0)   # None
    voice_file_problem(Path("ref.wav"), limit_seconds=30.0)                           # None, or "has NaN/inf samples"
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from stages.audio import PromptError, decode_audio
from stages.talker.length import cache_positions

if TYPE_CHECKING:
    from stages.config import StageConfig

MAX_CHANNELS = 8  # a reference voice of more channels is refused (mixed down to mono otherwise)
# Per-request seeds seed the talker's sampling generators, which take a seed below 2**63 on
# every device (a larger one overflows inside `manual_seed`): the engine refuses the rest.
MAX_SEED = 2**63


def text_problem(text: str, stages: StageConfig) -> str | None:
    """Why `text` cannot run on these stages, or None. With random weights (the stand-in
    tokenizer and the length model) its talker cache positions (text tokens + codes) must fit
    `runner.max_seq_len`, which the engine enforces per request; with real weights the length
    is the model's own and not known here, so every text passes."""
    runner = stages.runner
    if runner.weights is not None:
        return None
    needed = cache_positions(text, stages.talker)
    if needed <= runner.max_seq_len:
        return None
    return f"needs {needed} talker cache positions, runner.max_seq_len is {runner.max_seq_len}"


def voice_problem(channels: int, samples: int, sample_rate: int, limit_seconds: float) -> str | None:
    """Why decoded audio of this shape cannot be a reference voice, or None: 1-8 channels, some
    samples, at most `limit_seconds` (`code2wav.ref_audio_limit_seconds`) long. The prompt
    builder applies it to every voice it decodes."""
    if not 1 <= channels <= MAX_CHANNELS:
        return f"has {channels} channels; give 1-{MAX_CHANNELS} channels of audio"
    if samples == 0:
        return f"is empty (0 samples); give 1-{MAX_CHANNELS} channels of audio"
    if sample_rate < 1 or samples > limit_seconds * sample_rate:
        return (f"is {samples / max(sample_rate, 1):.1f} s long, the limit is "
                f"code2wav.ref_audio_limit_seconds={limit_seconds:g}; give a shorter clip (it is cut "
                "to ref_audio_max_seconds anyway)")
    return None


def voice_file_problem(path: Path, *, limit_seconds: float | None = None) -> str | None:
    """Why the audio file at `path` cannot be a reference voice, or None: it must exist, decode
    (`stages.audio.decode_audio`: not empty) and hold finite samples; with `limit_seconds` (an
    embedded arm's `code2wav.ref_audio_limit_seconds`) also `voice_problem`'s channel and length
    rules; without it (no embedded arm) the server at the other end applies its own."""
    if not path.is_file():
        return "does not exist"
    try:
        wav, rate = decode_audio(path)  # [C, N]
    except PromptError as exc:
        return f"cannot be read as audio: {str(exc).removeprefix('error: ')}"
    if not np.isfinite(wav).all():  # float files can hold them; the stages refuse such a voice
        return "has NaN/inf samples"
    if limit_seconds is not None:
        return voice_problem(wav.shape[0], wav.shape[1], rate, limit_seconds)
    return None
