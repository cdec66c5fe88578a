"""The A/A false-verdict script runs, seeded, and the rules only ever remove false verdicts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "aa_false_verdicts.py"


def script():
    spec = importlib.util.spec_from_file_location("aa_false_verdicts", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


def test_a_busier_machine_refuses_the_calibration_and_the_rules_never_add_a_false_verdict():
    aa = script()
    rng = np.random.default_rng(0)
    cal = {t.name: aa.calibrate(t, rng, runs=30) for t in aa.TIERS}
    for blocks, load in ((1, 2.0), (2, 2.0), (3, 1.0)):
        for _ in range(5):
            res = aa.one_aa(blocks, load, cal, rng, quiet_max=1.0)
            assert all(res["before"][m] or not res["after"][m] for m in res["after"])
            if blocks == 1 and load > 1.0:  # refused: no interval, no verdict
                assert not res["after"]["any"]
