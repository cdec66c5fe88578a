"""`tts-bench serve`: any backend behind an OpenAI-compatible `/v1/audio/speech` server.

- `request`: parsing and checking a request body, and the OpenAI-style JSON errors;
- `app`: the aiohttp server (`SpeechServer`), `serve_config` (the command as one call) and
  `running_server`, a background-thread server for tests and scripts.

The audio wire formats and the `/metrics` text are `tts_bench.wire`'s, shared with the `http`
backend (which never imports this package). This package's `__init__` imports nothing.

    tts-bench serve --config configs/ab/synthetic.yaml --port 8091 --replicas 2
    curl -sN localhost:8091/v1/audio/speech -d '{"input": "Hello.", "stream": true}' > a.pcm
"""
