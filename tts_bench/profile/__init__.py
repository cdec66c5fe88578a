"""`tts-bench profile`: one stage step, timed and traced on a fresh runner (`run`), and the cost
of the batched cache split against its per-row twin (`split`)."""
