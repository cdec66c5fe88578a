"""Moved: reading a reference voice is `stages.audio` (public, torch-free) and its shape rules
are `stages.admission.voice_problem`. These names remain only for the scripts that still import
them from here; import from `stages.audio`, and delete this module once none does."""

from stages.audio import FORMATS, PromptError, decode_audio, probe_audio

__all__ = ["FORMATS", "PromptError", "decode_audio", "probe_audio"]
