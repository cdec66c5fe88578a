"""What crosses a wire: audio bytes (PCM, WAV, server-sent events) and the /metrics text.

- `audio`: float audio -> int16 PCM, WAV headers, and the incremental decoders a benchmark
  client needs (PCM, WAV, SSE with base64 audio);
- `exposition`: the Prometheus text of `tts-bench serve`'s `/metrics` (rendered by the server,
  parsed by the `http` backend).

Used by the server and the `http` backend; nothing here imports a backend or the server, so
both can use it without a cycle (the `http` backend used to import `tts_bench.serve`, which
imports the backends). This
package's `__init__` imports nothing.
"""
