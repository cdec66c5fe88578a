"""Stage 1, the talker: a Llama backbone that turns text conditioning into 25 Hz codec tokens."""
