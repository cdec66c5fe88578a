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

A calibration applies to a config when its *calibration key* matches: the system-under-test hash
(`tts_bench.gate.samples.sut_hash`: non-default, measurement-relevant config values) with the
repeat count and the tier list left out (the calibration is per tier; K is the run's own) and
the measured prompt count of the run put in. `Calibration.mismatch` is that test, and says what
differs: the automatic lookup skips a file that fails it, an explicit `--calibration` is refused.

    cal = find_calibration([base_cfg_dict, test_cfg_dict], profile="cpu-2core", num_prompts=12)
    cal.spread("2x1", "audio_rtf")          # CalibratedSpread for a one-block interval
    cal.mde_pct("2x1", "audio_rtf", blocks=4)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tts_bench._versioned_json import VersionedJson
from tts_bench.errors import ConfigError
from tts_bench.stats import CalibratedSpread, mde_log, pct

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


def calibration_key(config: dict[str, Any], *, num_prompts: int | None = None) -> str:
    """The key a calibration is filed under (see the module docstring)."""
    from tts_bench.gate.samples import sut_hash

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

    def spread(self, tier: str, metric: str = "audio_rtf") -> CalibratedSpread | None:
        t = self.tiers.get(tier)
        return None if t is None else t.spreads.get(metric)

    def mde_pct(self, tier: str, metric: str = "audio_rtf", *, blocks: int = 1) -> float | None:
        """The MDE a K-block run can expect at the calibrated block SD: one block uses the
        calibration's degrees of freedom, K >= 2 blocks their own K - 1 (as `compare` does)."""
        s = self.spread(tier, metric)
        if s is None:
            return None
        return pct(mde_log(s.sd_mean, blocks, s.df if blocks == 1 else blocks - 1))

    def mismatch(self, configs: Iterable[dict[str, Any]], *, profile: str,
                 num_prompts: int | None = None) -> str | None:
        """What differs between this calibration and a run of `configs` (an A/B's arms: an A/A of
        either arm describes the noise) on `profile`, as a phrase; None when it applies."""
        if self.profile != profile:
            return (f"it was recorded on hardware profile {self.profile}, this run's profile is "
                    f"{profile} (--profile)")
        configs = list(configs)
        keys = {calibration_key(c, num_prompts=num_prompts) for c in configs}
        if self.key in keys:
            return None
        if (self.num_prompts not in (None, num_prompts)
                and self.key in {calibration_key(c, num_prompts=self.num_prompts) for c in configs}):
            return (f"it was measured with {self.num_prompts} prompts per tier, this run measures "
                    f"{num_prompts} (--num-prompts)")
        return (f"it was recorded for another config (case {self.case}, key {self.key}; this run's "
                f"arms have key {' / '.join(sorted(keys))})")

    def describe(self) -> dict[str, Any]:
        return {"path": self.path, "case": self.case, "profile": self.profile, "key": self.key,
                "runs": self.runs}


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
    spreads = {}
    for metric, d in _get(doc, "metrics", "map", where).items():
        at = f"{where}metrics.{metric}."
        if not isinstance(d, dict):
            raise _Unusable(f"{at[:-1]} is {d!r}, not an object")
        spreads[metric] = CalibratedSpread(float(_get(d, "sd_mean", "sd", at)), float(_get(d, "sd_median", "sd", at)),
                                           _get(d, "df", "count", at), source)
    phase = _get(doc, "phase_sd", "map", where, default={})
    return TierCalibration(spreads, {m: float(_get(phase, m, "sd", f"{where}phase_sd.")) for m in phase},
                           _get(doc, "phase_df", "count", where, default=0))


def load_calibration(path: Path | str, *, flag: str = CALIBRATION_FILE.flag) -> Calibration:
    """The calibration at `path`; anything it lacks, or holds in the wrong kind, is a ConfigError
    (exit 2) naming the file and the key, whichever command reads it (`flag`: where it came from)."""
    path = Path(path)
    doc = CALIBRATION_FILE.load(path, flag=flag)
    try:
        num_prompts, sut = _get(doc, "num_prompts", "count", default=None), _get(doc, "sut_hash", "str", default=None)
        return Calibration(str(path), _get(doc, "case", "str"), _get(doc, "profile", "str"), _get(doc, "key", "str"),
                           _get(doc, "runs", "count"),
                           {t: _tier(d, t, str(path)) for t, d in _get(doc, "tiers", "map").items()}, sut, num_prompts)
    except _Unusable as exc:
        raise ConfigError(f"error: calibration {path} is not usable: {exc} ({flag}); rerun tts-bench calibrate "
                          f"to record it again") from None


def find_calibration(
    configs: Iterable[dict[str, Any]], *, profile: str, num_prompts: int | None = None,
    directory: Path | str = DEFAULT_DIR,
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
        if cal.mismatch(configs, profile=profile, num_prompts=num_prompts) is None:
            return cal
    return None
