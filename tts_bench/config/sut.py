"""What identifies the system under test in a config: the hash baselines and calibrations are
filed under.

Only values that change what is measured count: a key left at its default, a judging knob
(`bench.min_effect_pct`, …) or the `wer:` / `mem:` sections do not change the hash, so a
baseline made before such a key existed still matches.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tts_bench.config.files import config_to_dict
from tts_bench.config.schema import BenchConfig

# Bench keys that only change how results are judged, not what is measured.
_JUDGING_KEYS = ("min_effect_pct", "bootstrap_resamples", "bootstrap", "duration_mismatch_pct",
                 "max_failure_fraction", "until_resolved_min_repeats")
_NOT_SUT = ("wer", "mem")


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out or {prefix.rstrip("."): {}}
    return {prefix.rstrip("."): d}


def sut_hash(config: dict[str, Any]) -> str:
    """12 hex chars over the non-default, measurement-relevant values of a config dict."""
    defaults = _flatten(config_to_dict(BenchConfig()))
    flat = _flatten({k: v for k, v in config.items() if k not in _NOT_SUT})
    kept = {k: v for k, v in flat.items()
            if defaults.get(k, object()) != v and k.removeprefix("bench.") not in _JUDGING_KEYS}
    blob = json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]
