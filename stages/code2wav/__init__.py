"""Stage 2, code2wav (token2wav): flow encoder -> CFM/DiT -> HiFT vocoder, streamed in chunks."""
