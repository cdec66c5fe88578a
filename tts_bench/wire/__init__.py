"""What crosses a wire: audio bytes (int16 PCM, WAV, server-sent events) and the /metrics text.

- `audio`: float audio -> int16 PCM bytes (`encode_pcm16`, by the stages' one rounding rule
  `stages.audio.to_pcm16`: audio hashes agree across HTTP only because every writer uses it),
  server-sent events, and the incremental decoders a benchmark client needs (PCM, WAV, SSE with
  base64 audio);
- `exposition`: the Prometheus text of `tts-bench serve`'s `/metrics` (rendered by the server,
  parsed by the `http` backend).

Used by the server and the `http` backend; nothing here imports a backend or the server, so
both can use it without a cycle.
This package's `__init__` imports nothing.
"""
