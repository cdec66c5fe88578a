"""What a run sends: prompt sets (built-in seed-tts lists or a `meta.lst`), voices and text rules."""
