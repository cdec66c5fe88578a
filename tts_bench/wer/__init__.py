"""The seed-tts WER gate: generate all audio first, then transcribe on CPU, score and gate.

Pipeline (one module each): `generate` (phase 1: every arm's backend, WAVs in the run directory)
-> `transcribe` (phase 2, after every backend stopped: ASR with a transcript cache) -> `score`
(per-utterance jiwer WER after `normalize`, or CER on a Chinese set: `language`; mean / median / corpus; paired ΔWER with a t
interval) -> `gate` (history under results/wer-history/, provenance check, exact or
non-inferiority mode, verdict and exit code) -> `report` (table and JSON). `advice` says before
a non-inferiority run whether its prompt count can resolve the margin. `runner` strings them
together; `tts-bench wer` is its CLI.

    tts-bench wer --config configs/wer/seed-tts-en.yaml          # exit 0 pass, 4 regression, 5 invalid
    tts-bench wer --config configs/wer/seed-tts-zh.yaml          # a Chinese set: CER (wer.language: zh)

`testing` holds test doubles (a backend that encodes text into samples, a transcriber that
decodes them) so the whole gate runs in milliseconds in tests.
"""
