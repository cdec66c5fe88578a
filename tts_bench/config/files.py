"""Config files: read, include the tiny stages where no accelerator is, apply arms and `--set`
overrides, hash.

The schema they are read into is `tts_bench.config.schema`; the package docstring shows the flow.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stages.config import StageConfig
from tts_bench.config.loader import load_dataclass, load_yaml_file, parse_yaml_value, set_path, to_data
from tts_bench.config.paths import FILE_NAME_WORD_RULE, is_file_name_word
from tts_bench.config.schema import BenchConfig
from tts_bench.config.shipped import resolve_config_path, shipped_config
from tts_bench.errors import ConfigError

log = logging.getLogger(__name__)


TINY_STAGES = "stages/minicpmo45-tiny.yaml"  # shipped; the stage config of a CPU-only host


# Bench keys still accepted but no longer read, with what replaced them.
RETIRED_BENCH_KEYS = {
    "bootstrap": "the A/B interval is a t interval over paired repeats now",
    "bootstrap_resamples": "the A/B interval is a t interval over paired repeats now",
}


def warn_retired_keys(keys: Sequence[str], source: str) -> None:
    """One warning per bench key in `keys` that is accepted but no longer read."""
    for key in keys:
        if key in RETIRED_BENCH_KEYS:
            log.warning("bench.%s (%s) is no longer read: %s; remove it", key, source, RETIRED_BENCH_KEYS[key])


def with_default_stages(raw: dict[str, Any]) -> dict[str, Any]:
    """A config file's mapping, with the host's default stage config where it names none.

    The dataclass defaults are the real MiniCPM-o 4.5 dims: right for a GPU, and on a CPU a
    talker KV cache of 20 layers x 128 slots x 4096 positions that the OOM killer ends. So an
    embedded config without a `stages:` section (an empty file, too) runs the shipped tiny dims
    when this host has no accelerator. Other backends do not run stages: left as they are.
    """
    if "stages" in raw or raw.get("backend", "embedded") != "embedded":
        return raw
    from stages.platform import accelerator_available  # lazy: loads torch; `tts-bench --help` loads config

    if accelerator_available():
        return raw
    return {**raw, "stages": str(shipped_config(TINY_STAGES))}


def load_config(path: Path | str | None, sets: Sequence[str] = ()) -> BenchConfig:
    """Load a bench config file (None -> all defaults), then apply `--set` overrides in order.

    `configs/...` paths fall back to the shipped configs (`tts_bench.config.shipped`); a file with no
    `stages:` section gets the host's default stage config (`with_default_stages`). An A/B
    config's `arms:` are checked but not applied: the result is what both arms share
    (`load_arm` / `load_arms` apply them)."""
    return apply_overrides(_read_config(path).config, sets)


DEFAULT_ARMS = ("base", "test")


@dataclass(frozen=True)
class _ConfigFile:
    config: BenchConfig  # the file without its `arms:`
    arms: dict[str, list[str]]  # arm name -> the file's overrides for it (base/test: none)
    source: str


def _read_config(path: Path | str | None) -> _ConfigFile:
    """The one reader of a config file, for `load_config` and `load_arms`."""
    if path is None:  # through the loader, so an error (a bad env flag) is a ConfigError too
        return _ConfigFile(load_dataclass(BenchConfig, {}, source="defaults"),
                           {name: [] for name in DEFAULT_ARMS}, "defaults")
    path = resolve_config_path(path)  # configs/... names a shipped config from any folder
    raw = load_yaml_file(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"error: the config must be a mapping ({path}); write key: value lines")
    raw = with_default_stages(dict(raw))
    if isinstance(raw.get("bench"), dict):
        warn_retired_keys(list(raw["bench"]), str(path))
    arms = _yaml_arms(raw, str(path))
    return _ConfigFile(load_dataclass(BenchConfig, raw, source=str(path), base_dir=path.parent), arms, str(path))


def _yaml_arms(raw: dict[str, Any], source: str) -> dict[str, list[str]]:
    """The optional top-level `arms: {base: [sets...], test: [sets...]}` of an A/B config
    (popped from `raw`)."""
    arms = raw.pop("arms", None)
    if arms is None:
        return {name: [] for name in DEFAULT_ARMS}
    ok = isinstance(arms, dict) and len(arms) == 2 and all(
        isinstance(v, list | type(None)) and all(isinstance(x, str) for x in v or []) for v in arms.values()
    )
    if not ok:
        raise ConfigError(
            f"error: arms must map exactly two arm names to lists of overrides ({source}: arms); "
            f"write arms: {{base: [], test: [\"code2wav.extra.x=false\"]}}"
        )
    for name in arms:
        if not is_file_name_word(name):
            raise ConfigError(
                f"error: arm name {name!r} ({source}: arms) must be {FILE_NAME_WORD_RULE}: it names files of a "
                "run (wavs/<arm>/) and table rows")
    return {str(k): list(v or []) for k, v in arms.items()}



def load_arms(
    path: Path | None, sets: Sequence[str] = (), base_sets: Sequence[str] = (),
    test_sets: Sequence[str] = (),
) -> dict[str, BenchConfig]:
    """Both arms' configs: file -> `--set` (both) -> the file's `arms:` lists -> `--base-set` /
    `--test-set`. Without `arms:` in the file the arms are named base and test."""
    file = _read_config(path)
    cfg = apply_overrides(file.config, sets)
    arms = {name: _arm(file, cfg, name, cli_sets, flag)
            for name, cli_sets, flag in zip(file.arms, (base_sets, test_sets), ("--base-set", "--test-set"))}
    check_shared_sections(arms, file.source)
    return arms


# The measurement plan: both arms run it as one (same prompts, seeds, tiers, repeats, samplers),
# and the sessions read it from the first arm, so a per-arm value would be recorded but not used.
SHARED_SECTIONS = ("bench", "wer", "mem")


def check_shared_sections(arms: dict[str, BenchConfig], source: str) -> None:
    first_name, first = next(iter(arms.items()))
    for name, arm in arms.items():
        for section in SHARED_SECTIONS:
            if getattr(arm, section) != getattr(first, section):
                raise ConfigError(
                    f"error: arm {name!r} sets {section}.* differently from arm {first_name!r} ({source}: "
                    f"arms, --base-set / --test-set); {section}.* is the plan both arms share: set it at the "
                    f"top level or with --set"
                )


def load_arm(path: Path, sets: Sequence[str] = (), arm: str | None = None) -> BenchConfig:
    """One arm of a config (default: the first, e.g. `base`): a plain bench config, or one arm
    of an A/B config with that arm's overrides applied."""
    file = _read_config(path)
    name = arm if arm is not None else next(iter(file.arms))
    if name not in file.arms:
        raise ConfigError(f"error: no arm {name!r} in {path} (--arm); valid: {', '.join(file.arms)}")
    return _arm(file, apply_overrides(file.config, sets), name, (), "")


def _arm(file: _ConfigFile, cfg: BenchConfig, name: str, cli_sets: Sequence[str], flag: str) -> BenchConfig:
    arm = apply_overrides(cfg, file.arms[name], source=f"{file.source}: arms.{name}")
    return apply_overrides(arm, cli_sets, source=flag)


def _split_override(text: str, source: str) -> tuple[list[str], Any]:
    key, sep, raw = text.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(p.strip() for p in parts):
        raise ConfigError(
            f"error: bad override {text!r} ({source}); write dotted.key=value, "
            f"e.g. --set bench.num_prompts=4"
        )
    return [p.strip() for p in parts], parse_yaml_value(raw, where=f"{source} {key.strip()}")


class FlagOverride(str):
    """A `--set` override made from a command option (`--interval 0` -> `mem.interval_s=0`):
    an error about it names the option, not `--set`. Everywhere else it is the plain string."""

    flag: str

    def __new__(cls, text: str, flag: str) -> FlagOverride:
        obj = super().__new__(cls, text)
        obj.flag = flag
        return obj


def apply_overrides(cfg: Any, sets: Sequence[str], *, source: str = "--set") -> Any:
    """Apply `a.b.c=value` overrides, each typed by the schema; returns a new config.

    On a BenchConfig, a first segment that names a stage section (`talker`, `code2wav`,
    `runner`) is routed under `stages.` so `--set code2wav.extra.x=false` works as documented.
    """
    bench_fields = {f.name for f in dataclasses.fields(BenchConfig)}
    stage_fields = {f.name for f in dataclasses.fields(StageConfig)}
    for text in sets:
        where = getattr(text, "flag", None) or source  # an option's override names the option
        parts, value = _split_override(text, where)
        if isinstance(cfg, BenchConfig) and len(parts) == 2 and parts[0] == "bench":
            warn_retired_keys(parts[1:], where)
        routed = parts[0] not in bench_fields and parts[0] in stage_fields
        if isinstance(cfg, BenchConfig) and routed:
            parts = ["stages", *parts]
        cfg = set_path(cfg, parts, value, source=where, base_dir=Path.cwd())
    return cfg


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """The config tree as JSON-safe data (tuples as lists); round-trips through load_dataclass."""
    out = to_data(cfg)
    assert isinstance(out, dict), "config_to_dict expects a dataclass instance"
    return out


def config_hash(cfg: Any) -> str:
    """First 12 hex chars of sha256 over the canonical JSON of the resolved config."""
    blob = json.dumps(config_to_dict(cfg), sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:12]
