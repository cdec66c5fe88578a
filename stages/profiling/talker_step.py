"""The talker workload of `tts-bench profile`: one steady decode step with B active rows.

The engine it runs on is built for the profile (`build.build_talker`): its cache holds
`talker_cache_len(talker_positions(text, chunks), max_seq_len)` positions, what the profiled
steps need rounded up to the decode's kv_len bucket. Every row decodes the same text (`profile_text`) with its own seed; rows never finish during
the measurement (their code budget outlasts it) and are cancelled afterwards.

    engine = build_talker(stages, place, rows=8, text=profile_text(0), chunks=3)
    m = measure_talker_step(engine, 8, chunks=3)   # launches + TALKER_RANGE time per step
"""

from __future__ import annotations

from torch.profiler import record_function

from stages.profiling.launches import WARMUP, Measured, measure
from stages.profiling.ranges import RANGES, TALKER_RANGE
from stages.talker.engine import KV_LEN_BUCKET, TalkerEngine, TalkerRequest

PROFILE_TEXT = "Launch accounting runs the same words for every row of the batch."


def profile_text(context: int) -> str:
    """The profile request's text: PROFILE_TEXT, or its words repeated so the condition holds
    about `context` rows (the stand-in tokenizer gives one id per word, plus text_eos and
    audio_bos)."""
    words = PROFILE_TEXT.rstrip(".").split()
    if context <= len(words) + 3:
        return PROFILE_TEXT
    return " ".join(words[i % len(words)] for i in range(context - 2))


def talker_budget(chunks: int) -> int:
    """Codes per profiled row: prefill step + warmup + profiled steps, plus one so no row
    finishes (and leaves the batch) inside the measurement."""
    return 1 + WARMUP + chunks + 1


def talker_positions(text: str, chunks: int) -> int:
    """KV positions one profiled row needs: its condition and every step it takes."""
    return len(text.split()) + 8 + talker_budget(chunks)  # + text_eos, audio_bos, punctuation


def talker_cache_len(positions: int, max_seq_len: int) -> int:
    """`positions` rounded up to the decode's kv_len bucket, so the profiled attention reads
    what a full-length cache would read at that length; never past `max_seq_len`."""
    padded = -(-positions // KV_LEN_BUCKET) * KV_LEN_BUCKET
    return min(padded, max_seq_len)


def measure_talker_step(
    engine: TalkerEngine, rows: int, chunks: int, *, text: str = PROFILE_TEXT
) -> Measured:
    """Launches and TALKER_RANGE time of one steady talker decode step with `rows` active rows."""
    budget = talker_budget(chunks)
    ids = [f"profile-talker-{rows}-{r}" for r in range(rows)]
    for r, rid in enumerate(ids):
        engine.add(TalkerRequest(rid, text, seed=r, max_codes=budget))
    engine.step()  # admission: every row prefilled, code #0 sampled

    def step() -> None:
        with record_function(TALKER_RANGE):
            engine.step()

    try:
        return measure(step, device=engine.device, repeats=chunks, warmup=WARMUP,
                       ranges=RANGES["talker_step"])  # fmt: skip
    finally:
        for rid in ids:
            engine.cancel(rid)
