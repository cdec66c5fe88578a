"""Moved: the float -> 16-bit PCM rule and the WAV writer are `stages.audio` (public,
torch-free). These names remain only for the scripts that still import them from here; import
from `stages.audio`, and delete this module once none does."""

from stages.audio import PCM16_SCALE, to_pcm16, wav_header, write_wav16

__all__ = ["PCM16_SCALE", "to_pcm16", "wav_header", "write_wav16"]
