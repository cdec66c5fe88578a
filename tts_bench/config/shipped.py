"""The configs shipped with tts-bench: package data, found the same way from any folder.

The YAML files under `tts_bench/configs/` (`ab/`, `wer/`, `stages/`, `cases/`) are installed
with the package (a repository checkout also has `configs/` at its root, a link to them). One
rule resolves a config path, wherever a path is taken (`--config`, `--set stages=...`, an
include inside a YAML):

1. the path as given (relative to the working directory, or to the including file);
2. if that does not exist and the path starts with `configs/`, the shipped file of that name.

So `--config configs/ab/default.yaml` means the shipped file from any folder and from a
non-editable install, while a file of your own always wins where it exists. Defaults never
depend on the working directory: `tts-bench ab`, `mem` and `profile` read the shipped
`ab/default.yaml` (`DEFAULT_AB_CONFIG`), `tts-bench wer` the shipped `wer/seed-tts-en.yaml`
(`DEFAULT_WER_CONFIG`).

    shipped_config("ab/default.yaml")                     # .../tts_bench/configs/ab/default.yaml
    resolve_config_path("configs/stages/minicpmo45.yaml")  # the shipped one, unless ./configs has it
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

PREFIX = "configs"
DEFAULT_AB_CONFIG = "ab/default.yaml"  # ab, mem and profile without --config
DEFAULT_WER_CONFIG = "wer/seed-tts-en.yaml"  # wer without --config


def shipped_dir() -> Path:
    """The directory of the shipped configs inside the installed package."""
    return Path(str(resources.files("tts_bench") / PREFIX))


def shipped_config(name: str) -> Path:
    """A shipped config by its name under configs/, e.g. `ab/default.yaml`."""
    return shipped_dir() / name


def shipped_names() -> list[str]:
    """`configs/<dir>/<file>.yaml` for every shipped config (for error messages)."""
    root = shipped_dir()
    return sorted(f"{PREFIX}/{p.relative_to(root).as_posix()}" for p in root.glob("*/*.yaml"))


def resolve_config_path(given: str | Path, base_dir: Path | None = None) -> Path:
    """`given` relative to `base_dir` (default: the working directory) when that exists, else
    the shipped config when `given` starts with `configs/`, else the path as given (the caller
    reports it missing). Relative paths stay relative in messages (normpath, not resolve)."""
    path = Path(given)
    full = path if path.is_absolute() or base_dir is None else Path(os.path.normpath(base_dir / path))
    if full.exists() or path.is_absolute():
        return full
    parts = path.parts
    if len(parts) > 1 and parts[0] == PREFIX:
        candidate = shipped_dir().joinpath(*parts[1:])
        if candidate.exists():
            return candidate
    return full
