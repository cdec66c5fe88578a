"""Upper bounds on the sizes a user can ask for, so a typo is a usage error, not a machine that
runs out of memory.

`--tiers=99999999999999999999x1` used to plan that many warmup requests (and C client
coroutines) and grow until killed. Every count a command takes from a flag or a config is
checked against these bounds where it is parsed (the config dataclasses, the CLI options), with
a message naming the key or the option. The bounds are far above any real benchmark (the
largest tier measured is 128x8 with 256 prompts) and far below what exhausts a host.

    check_range("bench.num_prompts", 0, 1, MAX_PROMPTS)   # ValueError naming the key
"""

from __future__ import annotations

MAX_CONCURRENCY = 4096  # C of a tier: client coroutines, requests in flight
MAX_REPLICAS = 64  # R of a tier: stage-2 processes started
MAX_PROMPTS = 100_000  # measured requests per tier, arm and repeat; WER prompts per arm
MAX_REPEATS = 100  # interleaved repeats per arm
MAX_CALIBRATION_RUNS = 10_000  # A/A runs of one `calibrate` (the shipped figures used 200)
MAX_PROFILE_ROWS = 4096  # batch size B of one `profile` step
MAX_WARMUP = 10_000  # warmup requests per phase
MAX_RESAMPLES = 100_000  # bootstrap resamples
MAX_SAMPLE_RATE = 384_000  # Hz: above any audio format in use (an absurd rate allocates absurdly)
# Per-request seeds are `seed + request index` and become torch generator seeds (< 2**63 on
# every device); 2**62 leaves room for the index.
MAX_SEED = 2**62


def check_range(name: str, value: int, low: int, high: int) -> None:
    """Raise ValueError naming `name` unless low <= value <= high."""
    if not low <= value <= high:
        raise ValueError(f"{name} must be in {low}..{high}, got {value}")

# `tts-bench serve`: the longest `input` (characters; OpenAI's speech API allows 4096) and the
# largest request body (bytes) accepted; a 1 MB input used to grow the server by ~2 MiB/s. The
# body holds the voice as base64 (4/3 of the file): 16 MiB fits the stages' longest voice
# (code2wav.ref_audio_limit_seconds, 60 s) as 48 kHz 16-bit stereo WAV, 14.7 MiB encoded. At
# 1 MiB a 6 s 48 kHz stereo voice was already refused.
MAX_INPUT_CHARS = 4096
MAX_BODY_BYTES = 16 * 1024**2
