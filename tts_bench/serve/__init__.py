"""`tts-bench serve`: any backend behind an OpenAI-compatible `/v1/audio/speech` server.

- `wire`: the audio wire formats both ends speak (PCM s16le, WAV, SSE with base64 audio),
  decoded incrementally so a client can stamp audio as it arrives;
- `exposition`: Prometheus text for `/metrics` (render on the server, parse on the client);
- `app`: the aiohttp server (`SpeechServer`) and `running_server`, a background-thread server
  for tests and scripts.

This package's `__init__` imports nothing, so the `http` backend can use `wire` without pulling
in the server.

    tts-bench serve --config configs/ab/synthetic.yaml --port 8091 --replicas 2
    curl -sN localhost:8091/v1/audio/speech -d '{"input": "Hello.", "stream": true}' > a.pcm
"""
