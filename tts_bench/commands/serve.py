"""`tts-bench serve`: any backend of a bench config behind an OpenAI-compatible speech server.

    tts-bench serve --config configs/ab/default.yaml --replicas 2          # embedded tiny, base arm
    tts-bench serve --config configs/ab/default.yaml --arm test --port 8092
    tts-bench serve --config configs/ab/piper.yaml --port 8092
    tts-bench ab --config configs/ab/synthetic.yaml --set backend=http \\
        --set http.base_url=http://127.0.0.1:8091                          # drive it

An A/B config serves one of its arms (`--arm`, default: the first, e.g. `base`), with the
arm's overrides applied, so two `serve` instances can stand for the two arms. Binds to
127.0.0.1 unless `--host` says otherwise. Serves until SIGINT/SIGTERM, then gives requests in
flight a few seconds and stops the backend. The served model name is the config's
`http.model`, so a client using the same config sends the right name. Endpoints and the failure
contract: `tts_bench.serve.app`, whose `serve_config` is the library call behind this command;
every error is OpenAI-style JSON (`tts_bench.serve.request`), inputs over `--max-input-chars`
(default 4096, OpenAI's limit) are a 400 and bodies over `--max-body-bytes` a 413.
`--concurrency C` says how many requests clients will keep in flight: the memory check counts C
and the embedded runner's replicas size their slot pools for C at start, so the expected load
never regrows a pool (which drops its captured code2wav graphs). Logs (including the
`listening on <url>` line) go to stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from tts_bench.errors import ConfigError, ExitStatus
from tts_bench.config.limits import MAX_BODY_BYTES, MAX_CONCURRENCY, MAX_INPUT_CHARS, MAX_REPLICAS


def serve(
    config: Path = typer.Option(..., "--config", "-c", help="Bench config YAML whose backend is served."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind (loopback by default)."),
    port: int = typer.Option(8091, "--port", help="TCP port; 0 picks a free one (see the log line)."),
    replicas: int = typer.Option(1, "--replicas", min=1, max=MAX_REPLICAS, help="Stage-2 replicas the backend starts with."),
    sets: list[str] = typer.Option([], "--set", help="Config override dotted.key=value (repeatable)."),
    arm: Optional[str] = typer.Option(None, "--arm", help="Which arm of an A/B config (default: the first)."),
    max_input_chars: int = typer.Option(MAX_INPUT_CHARS, "--max-input-chars", min=1, max=10**6, help="Longest 'input' accepted (characters); longer is a 400."),
    max_body_bytes: int = typer.Option(MAX_BODY_BYTES, "--max-body-bytes", min=1024, max=1 << 30, help="Largest request body accepted (bytes); larger is a 413."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", min=1, max=MAX_CONCURRENCY, help="Requests clients will keep in flight: the memory check counts them and the embedded runner sizes its slot pools for them at start (more still work; the pools grow). Default: the check counts the talker's admission limit and the pools grow on demand."),
) -> ExitStatus:
    """Serve a config's backend at /v1/audio/speech, /v1/models and /metrics."""
    from tts_bench.serve.app import serve_config

    if replicas < 1:
        raise ConfigError(f"error: bad --replicas {replicas} (tts-bench serve); use --replicas >= 1")
    if not 0 <= port <= 65535:
        raise ConfigError(f"error: bad --port {port} (tts-bench serve); use a port in 0..65535 (0: any free one)")
    serve_config(config, sets=sets, arm=arm, replicas=replicas, host=host, port=port, concurrency=concurrency,
                 max_input_chars=max_input_chars, max_body_bytes=max_body_bytes)
    return ExitStatus.OK
