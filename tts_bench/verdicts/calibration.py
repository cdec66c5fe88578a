"""Calibrations: what A/A runs measured about a case's noise on one hardware profile.

`tts-bench calibrate CASE --runs N` (library: `tts_bench.gate.calibrate`) runs N A/As of a case and
writes `results/baselines/<case>.<profile>.calibration.json` next to the case's baseline. Per
tier and metric (`audio_rtf`, `audio_ttfp_ms`) it holds:

- `sd_mean` / `sd_median`: the run-to-run SD of one block's log ratio d = ln(test / base) over
  every A/A block (true d = 0, so sqrt(mean d^2), with as many degrees of freedom as blocks);
  `tts-bench ab` uses it for the interval and MDE of a single-block run and prints the MDE it
  implies at other repeat counts;
- `phase_sd`: the SD of one phase's log center (median RTF/TTFP, mean throughput) over every A/A
  phase: how far a whole run moves on this machine; `tts-bench gate` tests a run's shift
  against it, not only against per-request noise;
- the false-verdict counts the runs produced, with Clopper-Pearson 95% intervals.

A calibration is only valid under the conditions it was made in. It records them (`conditions`:
the 1-minute load average over its A/As, the CPU count and machine; the hardware profile, the
tier shapes CxR as its tier entries, the prompt count and the key below), and a run whose own
conditions differ is *refused* rather than given a widened SD: how a spread grows with load is
not known (an A/A audit saw one-repeat A/As read faster/slower 10.4 % of the time with a
calibration made minutes earlier at a lower load), and a wrong widening would be a guess with a
95 % label. The run's load may exceed the calibration's highest by `LOAD_SLACK_REL` x +
`LOAD_SLACK_ABS`; a different CPU count or machine, or a calibration that does not say, is
refused. And a calibrated spread is used for a metric only when the calibration's own
leave-one-out one-block A/As read faster/slower at most `MAX_ONE_BLOCK_FALSE_RATE` of the time
over at least `MIN_ONE_BLOCK_JUDGED` blocks: a one-repeat verdict meets the same <= 5 % A/A rate
as a t interval, or stays `unresolved (1 repeat)`.

A calibration applies to a config when its *calibration key* matches: the system-under-test hash
(`tts_bench.gate.samples.sut_hash`: non-default, measurement-relevant config values) with the
repeat count and the tier list left out (the calibration is per tier; K is the run's own) and
the measured prompt count of the run put in. `Calibration.mismatch` is that test, and says what
differs: the automatic lookup skips a file that fails it, an explicit `--calibration` is refused.

    cal = find_calibration([base_cfg_dict, test_cfg_dict], profile="cpu-2core", num_prompts=12)
    cal.mismatch(configs, profile="cpu-2core", num_prompts=12, conditions=RunConditions.now())
    cal.spread("2x1", "audio_rtf")          # CalibratedSpread for a one-block interval
    cal.mde_pct("2x1", "audio_rtf", blocks=4)
"""

from __future__ import annotations

import logging
import math
import os
import platform
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tts_bench.config.sut import sut_hash
from tts_bench.rundir.provenance import load_avg
from tts_bench.rundir.versioned_json import VersionedJson
from tts_bench.errors import ConfigError
from tts_bench.verdicts.stats import CalibratedSpread, mde_log, pct

CALIBRATION_VERSION = 2
CALIBRATION_FILE = VersionedJson(
    "calibration", "calibration_version", CALIBRATION_VERSION, flag="--calibration",
    record_hint="record one with tts-bench calibrate <case> --runs N",
    stale_hint="rerun tts-bench calibrate",
)
DEFAULT_DIR = Path("results/baselines")
SUFFIX = ".calibration.json"
log = logging.getLogger(__name__)
_PER_TIER_KEYS = ("repeats", "tiers")
LOAD_SLACK_REL = 1.25  # a run's load may reach 1.25 x the calibration's highest + 0.25
LOAD_SLACK_ABS = 0.25
MAX_ONE_BLOCK_FALSE_RATE = 0.05  # the A/A rate every verdict must meet
MIN_ONE_BLOCK_JUDGED = 20  # fewer judged one-block A/As cannot show it


@dataclass(frozen=True)
class RunConditions:
    """What the machine is doing when a run starts (compared with a calibration's)."""

    load_1min: float | None
    cpu_count: int | None
    machine: str | None

    @classmethod
    def now(cls) -> RunConditions:
        load = load_avg()
        return cls(load[0] if load else None, os.cpu_count(), platform.machine() or None)

    def to_dict(self) -> dict[str, Any]:
        return {"load_1min": self.load_1min, "cpu_count": self.cpu_count, "machine": self.machine}


@dataclass(frozen=True)
class CalibrationConditions:
    """What the machine was doing over a calibration's A/As (None: the file does not say)."""

    load_1min_max: float | None = None
    cpu_count: int | None = None
    machine: str | None = None

    def mismatch(self, run: RunConditions) -> str | None:
        """Why this calibration's noise does not describe a run under `run`; None when it does."""
        if self.load_1min_max is None:
            return "it does not record the load it was made under (recalibrate with this version)"
        if self.cpu_count is not None and run.cpu_count is not None and self.cpu_count != run.cpu_count:
            return f"it was made on {self.cpu_count} CPUs, this machine has {run.cpu_count}"
        if self.machine and run.machine and self.machine != run.machine:
            return f"it was made on a {self.machine} machine, this one is {run.machine}"
        allowed = LOAD_SLACK_REL * self.load_1min_max + LOAD_SLACK_ABS
        if run.load_1min is not None and run.load_1min > allowed:
            return (f"the machine is busier now (1-min load {run.load_1min:g}) than when it was made (at most "
                    f"{self.load_1min_max:g}; allowed up to {allowed:.2f}): wait for a quiet machine or recalibrate")
        return None


def calibration_key(config: dict[str, Any], *, num_prompts: int | None = None) -> str:
    """The key a calibration is filed under (see the module docstring)."""
    bench = {k: v for k, v in (config.get("bench") or {}).items() if k not in _PER_TIER_KEYS}
    if num_prompts is not None:
        bench["num_prompts"] = num_prompts
    return sut_hash({**config, "bench": bench})


def calibration_path(case: str, profile: str, directory: Path | str = DEFAULT_DIR) -> Path:
    # Not Path.with_suffix: it would replace `.calibration` and overwrite the baseline.
    return Path(directory) / f"{case}.{profile}{SUFFIX}"


@dataclass(frozen=True)
class TierCalibration:
    spreads: dict[str, CalibratedSpread]  # per metric: block log-ratio SDs
    phase_sd: dict[str, float]  # per metric: SD of a phase's log center
    phase_df: int
    one_block: dict[str, tuple[int, int]] = field(default_factory=dict)  # metric: (false, judged), LOO


@dataclass(frozen=True)
class Calibration:
    path: str
    case: str
    profile: str
    key: str
    runs: int
    tiers: dict[str, TierCalibration]
    sut_hash: str | None = None  # the config it was made with (None: a perturbed test arm)
    num_prompts: int | None = None  # measured prompts per tier (None: a file that did not say)
    conditions: CalibrationConditions = field(default_factory=CalibrationConditions)

    def spread(self, tier: str, metric: str = "audio_rtf") -> CalibratedSpread | None:
        """The calibrated one-block spread, only where its own one-block A/As met the <= 5 % rate."""
        t = self.tiers.get(tier)
        if t is None or self.one_block_unusable(tier, metric):
            return None
        return t.spreads.get(metric)

    def raw_spread(self, tier: str, metric: str = "audio_rtf") -> CalibratedSpread | None:
        """The recorded spread, whatever its one-block false-verdict rate (MDE planning)."""
        t = self.tiers.get(tier)
        return None if t is None else t.spreads.get(metric)

    def one_block_unusable(self, tier: str, metric: str) -> str | None:
        """Why a one-block verdict may not use this tier's spread of `metric` (None: it may)."""
        t = self.tiers.get(tier)
        false, judged = (t.one_block.get(metric) if t else None) or (0, 0)
        if judged < MIN_ONE_BLOCK_JUDGED:
            return f"its one-block A/As of {metric} at {tier} judged {judged} blocks (< {MIN_ONE_BLOCK_JUDGED})"
        if false > MAX_ONE_BLOCK_FALSE_RATE * judged:
            return (f"its one-block A/As of {metric} at {tier} read faster/slower {false}/{judged} times "
                    f"(> {MAX_ONE_BLOCK_FALSE_RATE:.0%})")
        return None

    def mde_pct(self, tier: str, metric: str = "audio_rtf", *, blocks: int = 1) -> float | None:
        """The MDE a K-block run can expect at the calibrated block SD: one block uses the
        calibration's degrees of freedom, K >= 2 blocks their own K - 1 (as `compare` does)."""
        s = self.raw_spread(tier, metric)
        if s is None:
            return None
        return pct(mde_log(s.sd_mean, blocks, s.df if blocks == 1 else blocks - 1))

    def mismatch(self, configs: Iterable[dict[str, Any]], *, profile: str,
                 num_prompts: int | None = None, conditions: RunConditions | None = None) -> str | None:
        """What differs between this calibration and a run of `configs` (an A/B's arms: an A/A of
        either arm describes the noise) on `profile` under `conditions` (None: not checked), as a
        phrase; None when it applies."""
        if self.profile != profile:
            return (f"it was recorded on hardware profile {self.profile}, this run's profile is "
                    f"{profile} (--profile)")
        configs = list(configs)
        keys = {calibration_key(c, num_prompts=num_prompts) for c in configs}
        if self.key in keys:
            return None if conditions is None else self.conditions.mismatch(conditions)
        if (self.num_prompts not in (None, num_prompts)
                and self.key in {calibration_key(c, num_prompts=self.num_prompts) for c in configs}):
            return (f"it was measured with {self.num_prompts} prompts per tier, this run measures "
                    f"{num_prompts} (--num-prompts)")
        return (f"it was recorded for another config (case {self.case}, key {self.key}; this run's "
                f"arms have key {' / '.join(sorted(keys))})")

    def describe(self) -> dict[str, Any]:
        return {"path": self.path, "case": self.case, "profile": self.profile, "key": self.key,
                "runs": self.runs, "conditions": {"load_1min_max": self.conditions.load_1min_max,
                                                  "cpu_count": self.conditions.cpu_count,
                                                  "machine": self.conditions.machine}}


class _Unusable(Exception):
    """A calibration document's key is missing or holds the wrong kind of value."""


_REQUIRED = object()


def _get(doc: dict[str, Any], key: str, kind: str, where: str = "", *, default: Any = _REQUIRED) -> Any:
    """`doc[key]` checked as `kind`: "str", "count" (an int >= 0), "sd" (a finite number >= 0)
    or "map" (an object); `default` when absent or null (without one, that is unusable)."""
    if doc.get(key) is None:
        if default is _REQUIRED:
            raise _Unusable(f"it has no {where}{key!r}")
        return default
    value = doc[key]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = {"str": isinstance(value, str), "count": number and isinstance(value, int) and value >= 0,
          "sd": number and math.isfinite(value) and value >= 0, "map": isinstance(value, dict)}[kind]
    if not ok:
        words = {"str": "a string", "count": "a whole number >= 0", "sd": "a finite number >= 0",
                 "map": "an object"}[kind]
        raise _Unusable(f"{where}{key} is {value!r}, not {words}")
    return value


def _tier(doc: Any, tier: str, source: str) -> TierCalibration:
    where = f"tiers.{tier}."
    if not isinstance(doc, dict):
        raise _Unusable(f"tiers.{tier} is {doc!r}, not an object")
    spreads, one_block = {}, {}
    for metric, d in _get(doc, "metrics", "map", where).items():
        at = f"{where}metrics.{metric}."
        if not isinstance(d, dict):
            raise _Unusable(f"{at[:-1]} is {d!r}, not an object")
        spreads[metric] = CalibratedSpread(float(_get(d, "sd_mean", "sd", at)), float(_get(d, "sd_median", "sd", at)),
                                           _get(d, "df", "count", at), source)
        rate = _get(d, "false_verdicts_one_block", "map", at, default={})
        one_block[metric] = (_get(rate, "count", "count", at, default=0), _get(rate, "of", "count", at, default=0))
    phase = _get(doc, "phase_sd", "map", where, default={})
    return TierCalibration(spreads, {m: float(_get(phase, m, "sd", f"{where}phase_sd.")) for m in phase},
                           _get(doc, "phase_df", "count", where, default=0), one_block)


def _conditions(doc: dict[str, Any]) -> CalibrationConditions:
    """`conditions`, else the `environment` older files recorded (the same load figures)."""
    c = doc.get("conditions") or doc.get("environment") or {}
    if not isinstance(c, dict):
        return CalibrationConditions()
    load = _get(c, "load_1min_max", "sd", "conditions.", default=None)
    cpus = _get(c, "cpu_count", "count", "conditions.", default=None)
    machine = _get(c, "machine", "str", "conditions.", default=None)
    return CalibrationConditions(None if load is None else float(load), cpus, machine)


def load_calibration(path: Path | str, *, flag: str = CALIBRATION_FILE.flag) -> Calibration:
    """The calibration at `path`; anything it lacks, or holds in the wrong kind, is a ConfigError
    (exit 2) naming the file and the key, whichever command reads it (`flag`: where it came from)."""
    path = Path(path)
    doc = CALIBRATION_FILE.load(path, flag=flag)
    try:
        num_prompts, sut = _get(doc, "num_prompts", "count", default=None), _get(doc, "sut_hash", "str", default=None)
        return Calibration(str(path), _get(doc, "case", "str"), _get(doc, "profile", "str"), _get(doc, "key", "str"),
                           _get(doc, "runs", "count"),
                           {t: _tier(d, t, str(path)) for t, d in _get(doc, "tiers", "map").items()}, sut, num_prompts,
                           _conditions(doc))
    except _Unusable as exc:
        raise ConfigError(f"error: calibration {path} is not usable: {exc} ({flag}); rerun tts-bench calibrate "
                          f"to record it again") from None


def find_calibration(
    configs: Iterable[dict[str, Any]], *, profile: str, num_prompts: int | None = None,
    directory: Path | str = DEFAULT_DIR, conditions: RunConditions | None = None,
) -> Calibration | None:
    """The calibration of `profile` in `directory` whose key matches one of `configs` (an A/B's
    arms: an A/A of either arm describes the noise), or None. A file there that cannot be read
    is passed over with a warning: it may be any case's, and it is not this run's to refuse
    (named with `--calibration`, or beside a gate's baseline, it is refused)."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    configs = list(configs)
    for path in sorted(directory.glob(f"*.{profile}{SUFFIX}")):
        try:
            cal = load_calibration(path, flag="the automatic lookup of tts-bench ab")
        except ConfigError as exc:
            log.warning("skipped %s", str(exc).removeprefix("error: "))
            continue
        why = cal.mismatch(configs, profile=profile, num_prompts=num_prompts)
        if why is None and conditions is not None:
            why = cal.conditions.mismatch(conditions)
            if why is not None:  # this config's calibration, refused for now: say so
                log.warning("warning: calibration %s not used: %s", path, why)
                continue
        if why is None:
            return cal
    return None
