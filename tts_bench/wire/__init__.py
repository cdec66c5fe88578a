"""What crosses a wire: audio bytes (int16 PCM, WAV, server-sent events) and the /metrics text.

- `audio`: float audio -> int16 PCM (`pcm16`, `encode_pcm16`) and WAV headers and files
  (`wav_header`, `write_wav`), all the stages' one rounding rule (`stages.code2wav.pcm`: audio
  hashes agree across HTTP only because every writer uses it), and the incremental decoders a
  benchmark client needs (PCM, WAV, SSE with base64 audio);
- `exposition`: the Prometheus text of `tts-bench serve`'s `/metrics` (rendered by the server,
  parsed by the `http` backend).

Used by the load generator (hashes), the server, the `http` backend and the WER gate (WAV
files); nothing here imports a backend or the server, so both can use it without a cycle.
This package's `__init__` imports nothing.
"""
