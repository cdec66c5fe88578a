"""Offline CPU speech recognition for the WER gate (faster-whisper default, openai-whisper reference)."""
