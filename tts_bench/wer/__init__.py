"""The seed-tts WER gate: generate all audio first, then transcribe on CPU, score and gate."""
