"""Perf-gate case files: what to run (config + overrides x bench shape) and how to judge it.

A case is the unit CI gates on, in the shape vllm-omni's perf tests use: a bench config plus
overrides, the bench parameters, and per-metric relative thresholds. Its baselines live next to
it in `results/baselines/<name>.<profile>.json`, one per hardware profile (`cpu-2core`, `h200`).

    # configs/cases/tiny-embedded.yaml
    name: tiny-embedded
    config: ../ab/default.yaml        # relative to this file
    arm: test                         # one arm of an A/B config (default: its first arm)
    overrides: []                     # --set style, applied after the config
    bench: {tiers: [2x1], num_prompts: 8, repeats: 1}
    thresholds: {audio_rtf: 15, audio_ttfp_ms: 25, audio_throughput: null}   # percent; null = not gated
    alpha: 0.01

    case = load_case(Path("configs/cases/tiny-embedded.yaml"))
    resolved = resolve_case(case, extra_sets=["synthetic.delay_scale=1.2"])
    baseline_path(case, "cpu-2core")   # results/baselines/tiny-embedded.cpu-2core.json
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tts_bench.config import BenchConfig, apply_overrides, load_arms, load_dataclass, load_yaml_file
from tts_bench.errors import ConfigError
from tts_bench.config.shipped import resolve_config_path

DEFAULT_BASELINE_DIR = Path("results/baselines")
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


@dataclass(frozen=True)
class CaseBench:
    """The bench shape; written into the resolved config's `bench:` section."""

    tiers: tuple[str, ...] = ("2x1",)
    num_prompts: int = 8
    prompts_per_client: int | None = None  # K*C prompts per tier CxR instead of num_prompts
    repeats: int = 1
    warmup: int | None = None
    mem: bool = False  # sample memory (the config's `mem:` samplers) and gate its metrics

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ValueError("bench.tiers must list at least one tier, e.g. [2x1]")
        if self.num_prompts < 1 or self.repeats < 1:
            raise ValueError("bench.num_prompts and bench.repeats must be >= 1")


@dataclass(frozen=True)
class CaseThresholds:
    """Relative thresholds in percent, per metric; null leaves the metric reported, not gated."""

    audio_rtf: float | None = 10.0
    audio_ttfp_ms: float | None = 20.0
    audio_throughput: float | None = 10.0
    steady_mem_mib: float | None = 5.0
    peak_mem_mib: float | None = 10.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None and not value > 0:
                raise ValueError(f"thresholds.{f.name} must be > 0 (percent) or null, got {value}")

    def get(self, metric: str) -> float | None:
        return getattr(self, metric)


@dataclass(frozen=True)
class Case:
    name: str = ""
    description: str = ""
    config: str = ""  # bench config path, relative to the case file
    arm: str | None = None
    overrides: tuple[str, ...] = ()
    bench: CaseBench = field(default_factory=CaseBench)
    thresholds: CaseThresholds = field(default_factory=CaseThresholds)
    alpha: float = 0.01  # Mann-Whitney significance level
    min_samples: int = 8  # fewer successful requests per tier -> invalid run (exit 5)

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError(f"name must be a lowercase file-name-safe word, got {self.name!r}")
        if not self.config:
            raise ValueError("config must name a bench config file (relative to the case file)")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {self.min_samples}")


@dataclass(frozen=True)
class LoadedCase:
    case: Case
    path: Path

    @property
    def config_path(self) -> Path:
        return (self.path.parent / self.case.config).resolve()


@dataclass(frozen=True)
class ResolvedCase:
    """The case's config (what the baseline was recorded with) and the one actually run
    (`extra_sets` on top: deliberate perturbations, recorded and reported by the gate)."""

    loaded: LoadedCase
    arm: str
    case_config: BenchConfig
    config: BenchConfig
    extra_sets: tuple[str, ...]


def load_case(path: Path | str) -> LoadedCase:
    path = resolve_config_path(path)  # `configs/cases/...` names a shipped case from any folder
    if not path.is_file():
        raise ConfigError(f"error: case file not found ({path}); pass a file under configs/cases/")
    data = load_yaml_file(path)
    case = load_dataclass(Case, data, source=str(path), base_dir=path.parent)
    return LoadedCase(case, path)


def _bench_sets(bench: CaseBench) -> list[str]:
    sets = [f"bench.tiers=[{', '.join(bench.tiers)}]", f"bench.num_prompts={bench.num_prompts}",
            f"bench.repeats={bench.repeats}"]
    if bench.warmup is not None:
        sets.append(f"bench.warmup={bench.warmup}")
    if bench.prompts_per_client is not None:
        sets.append(f"bench.prompts_per_client={bench.prompts_per_client}")
    return sets


def resolve_case(loaded: LoadedCase, extra_sets: Sequence[str] = ()) -> ResolvedCase:
    """Config file -> its arm -> case overrides -> case bench shape (-> extra sets)."""
    case = loaded.case
    if not loaded.config_path.is_file():
        raise ConfigError(f"error: config {case.config!r} not found ({loaded.path}: config); "
                          f"give a path relative to the case file")
    arms = load_arms(loaded.config_path)
    arm = case.arm or next(iter(arms))
    if arm not in arms:
        raise ConfigError(f"error: arm {arm!r} not in {loaded.config_path} ({loaded.path}: arm); "
                          f"valid: {', '.join(arms)}")
    cfg = apply_overrides(arms[arm], case.overrides, source=f"{loaded.path}: overrides")
    cfg = apply_overrides(cfg, _bench_sets(case.bench), source=f"{loaded.path}: bench")
    current = apply_overrides(cfg, extra_sets)
    return ResolvedCase(loaded, arm, cfg, current, tuple(extra_sets))


CASES_DIR = Path("configs/cases")


def baseline_path(case: Case, profile: str, directory: Path = DEFAULT_BASELINE_DIR) -> Path:
    return Path(directory) / f"{case.name}.{profile}.json"


def case_path(case: str | Path, cases_dir: Path = CASES_DIR) -> Path:
    """A case file as given, or a case name under configs/cases/ (`synthetic` ->
    configs/cases/synthetic.yaml)."""
    path = Path(case)
    if path.is_file() or path.suffix in (".yaml", ".yml"):
        return path
    return Path(cases_dir) / f"{case}.yaml"
