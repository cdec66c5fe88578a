"""The A/A false-verdict script runs, seeded, and the rules only ever remove false verdicts."""

from __future__ import annotations

import importlib

import numpy as np



def script():
    return importlib.import_module("scripts.aa_false_verdicts")  # scripts/ is importable from the repository root


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
