"""Stage configs for the scripts: a stage YAML through the harness's strict loader, and the
shipped tiny one (`configs/stages/minicpmo45-tiny.yaml`), so `--tiny` runs exactly the dims the
CPU tests and a CPU-only host run instead of a hand-kept copy of them.

    cfg = load_stages("configs/stages/minicpmo45.yaml")
    talker = tiny_stages().talker
    voices = prompt_voices()          # the builtin seed-tts set's reference voices, as bytes
"""

from __future__ import annotations

from pathlib import Path

from stages.config import StageConfig
from tts_bench.config.loader import load_dataclass, load_yaml_file
from tts_bench.config.files import TINY_STAGES
from tts_bench.inputs.prompts import load_prompts
from tts_bench.config.shipped import resolve_config_path, shipped_config


def load_stages(path: str | Path) -> StageConfig:
    """A stage config file (`configs/...` falls back to the shipped one from any folder)."""
    path = resolve_config_path(path)
    return load_dataclass(StageConfig, load_yaml_file(path), source=str(path), base_dir=path.parent)


def tiny_stages() -> StageConfig:
    return load_stages(shipped_config(TINY_STAGES))


def prompt_wav_paths(meta: str = "builtin:seed-tts-en") -> list[Path]:
    """The distinct prompt wavs of a meta.lst, in file order."""
    return list(dict.fromkeys(p.prompt_wav for p in load_prompts(meta) if p.prompt_wav is not None))


def prompt_voices(meta: str = "builtin:seed-tts-en") -> list[bytes]:
    """The distinct prompt wavs of a meta.lst, in file order, as encoded bytes (what a request
    carries as its reference voice)."""
    return [path.read_bytes() for path in prompt_wav_paths(meta)]
