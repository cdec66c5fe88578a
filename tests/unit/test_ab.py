"""A/B orchestration on the synthetic backend: verdicts, interleaving, resume, validity."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tts_bench.ab import plan_from_run, run_ab
from tts_bench.config import config_to_dict, load_arms, load_config, parse_tiers
from tts_bench.errors import ConfigError, ExitStatus
from tts_bench.rundir.results import RunDir

# One 0.1 s chunk per word, 4 ms per chunk: every request has the same implied RTF (0.04), so
# the spread the bootstrap sees is timing jitter, not prompt length; 12-160 ms per request.
SYNTH = ["backend=synthetic", "synthetic.chunk_seconds=0.1", "synthetic.seconds_per_word=0.1",
         "synthetic.first_chunk_delay_s=0.004", "synthetic.chunk_delay_s=0.004", "bench.warmup=2"]
# Every run here on virtual time (tests/virtual_clock.py): the verdicts see the delays' own
# spread, never a load burst on a shared machine.
pytestmark = pytest.mark.usefixtures("virtual_clock")


def arms(base=(), test=()):
    return {"base": load_config(None, [*SYNTH, *base]), "test": load_config(None, [*SYNTH, *test])}


def new_run(tmp_path: Path, a) -> RunDir:
    return RunDir.create(tmp_path, "ab", command_line=["test"],
                         configs={n: config_to_dict(c) for n, c in a.items()},
                         extra={"ab": {"tiers": ["2x1"], "repeats": 1, "num_prompts": 4}})


class Recorder:
    def __init__(self):
        self.calls = []

    def on_phase(self, arm, tier, repeat, phase, backend):
        self.calls.append((arm, tier, repeat, phase))


def test_a_a_is_within_noise_on_every_tier(tmp_path):
    # 10% instead of the default 2%: this suite shares two cores with whatever else runs, and a
    # load burst during one phase shifts that phase's RTF by several percent (with two blocks a
    # t interval is significant 5% of the time per tier by design). An orchestration bug (arms
    # swapped, configs leaking across arms, unequal prompts) shows up far above 10%.
    a = arms(base=["bench.min_effect_pct=10"], test=["bench.min_effect_pct=10"])
    result = run_ab(a, parse_tiers("2x1,4x2,8x4"), repeats=2, num_prompts=16, run_dir=new_run(tmp_path, a))
    for tier in result.tiers:
        assert tier.rtf.verdict == "within noise", tier.to_dict()
        assert tier.identical_outputs == tier.paired_outputs == 32
        assert not tier.duration_mismatch
    assert result.valid and result.exit_status == ExitStatus.OK


def test_twenty_percent_more_delay_is_slower_with_a_ci_excluding_zero(tmp_path):
    # Four blocks (t with 3 df): with two (12.7 x s) a load burst on a shared CPU can hide 20%.
    a = arms(test=["synthetic.delay_scale=1.2"])
    result = run_ab(a, parse_tiers("4x1"), repeats=4, num_prompts=24, run_dir=new_run(tmp_path, a))
    (tier,) = result.tiers
    assert tier.rtf.verdict == "slower"
    assert tier.rtf.ci95_pct[0] > 0
    assert 10 < tier.rtf.delta_mean_pct < 30


def test_arms_alternate_first_position_per_repeat_on_fresh_backends(tmp_path):
    a, hooks = arms(), Recorder()
    run_ab(a, parse_tiers("2x1,4x1"), repeats=3, num_prompts=4, run_dir=new_run(tmp_path, a), hooks=hooks)
    measured = [c[:3] for c in hooks.calls if c[3] == "measure"]
    assert measured == [("base", "2x1", 0), ("test", "2x1", 0), ("test", "2x1", 1), ("base", "2x1", 1),
                        ("base", "2x1", 2), ("test", "2x1", 2),
                        ("base", "4x1", 0), ("test", "4x1", 0), ("test", "4x1", 1), ("base", "4x1", 1),
                        ("base", "4x1", 2), ("test", "4x1", 2)]
    assert [c[3] for c in hooks.calls[:3]] == ["warmup", "measure", "end"]


def test_warmups_are_recorded_but_excluded(tmp_path):
    a = arms()
    run = new_run(tmp_path, a)
    result = run_ab(a, parse_tiers("2x1"), repeats=1, num_prompts=4, run_dir=run)
    lines = run.read_requests()
    assert sum(r["warmup"] for r in lines) == 4  # 2 per arm
    assert result.tiers[0].arms["base"].completed == 4


def test_resume_finishes_without_repeating_completed_requests(tmp_path):
    a = arms()
    run = new_run(tmp_path, a)
    tiers = parse_tiers("2x1")
    full = run_ab(a, tiers, repeats=2, num_prompts=6, run_dir=run)
    lines = run.requests_path.read_text().splitlines(keepends=True)
    kept = lines[: len(lines) // 2] + [lines[len(lines) // 2][:20]]  # a torn last line, as after SIGKILL
    run.requests_path.write_text("".join(kept))
    resumed = run_ab(a, tiers, repeats=2, num_prompts=6, run_dir=RunDir.open(run.path), resume=True)
    ids = [r["request_id"] for r in RunDir.open(run.path).read_requests()]
    assert max(Counter(ids).values()) == 1
    for name in ("base", "test"):
        assert resumed.tiers[0].arms[name].completed == full.tiers[0].arms[name].completed == 12


def test_resume_of_a_complete_run_sends_nothing(tmp_path):
    a, hooks = arms(), Recorder()
    run = new_run(tmp_path, a)
    run_ab(a, parse_tiers("2x1"), repeats=1, num_prompts=4, run_dir=run)
    run_ab(a, parse_tiers("2x1"), repeats=1, num_prompts=4, run_dir=run, resume=True, hooks=hooks)
    assert hooks.calls == []


def test_too_many_failures_make_the_run_invalid(tmp_path):
    a = arms(test=["synthetic.fail_every=2"])
    result = run_ab(a, parse_tiers("2x1"), repeats=1, num_prompts=8, run_dir=new_run(tmp_path, a))
    assert not result.valid and result.exit_status == ExitStatus.INVALID_RUN
    assert "test" in result.invalid_reasons[0]
    assert result.tiers[0].arms["test"].failed_by_kind == {"backend_error": 4}  # requests 4, 6, 8, 10 (2 warmups first)


def test_longer_audio_in_one_arm_is_flagged(tmp_path):
    a = arms(test=["synthetic.seconds_per_word=0.12"])
    result = run_ab(a, parse_tiers("2x1"), repeats=1, num_prompts=4, run_dir=new_run(tmp_path, a))
    tier = result.tiers[0]
    assert tier.duration_mismatch and tier.duration_delta_pct == pytest.approx(20.0, abs=2)
    assert tier.identical_outputs == 0


def test_json_document_has_the_documented_shape(tmp_path):
    a = arms()
    doc = run_ab(a, parse_tiers("2x1"), repeats=1, num_prompts=4, run_dir=new_run(tmp_path, a)).to_dict()
    json.dumps(doc)
    tier = doc["tiers"][0]
    assert tier["tier"] == "2x1" and set(tier["arms"]) == {"base", "test"}
    assert {"mean_audio_rtf", "median_audio_rtf", "completed", "failed"} <= set(tier["arms"]["base"])
    assert {"delta_mean_pct", "ci95_pct", "verdict"} <= set(tier)


def test_arms_from_yaml_then_cli_overrides(tmp_path):
    path = tmp_path / "ab.yaml"
    path.write_text("backend: synthetic\narms:\n  eager: [synthetic.delay_scale=1.5]\n"
                    "  fused: [synthetic.delay_scale=2.0]\n")
    a = load_arms(path, ["bench.repeats=3"], [], ["synthetic.delay_scale=3.0"])
    assert list(a) == ["eager", "fused"]
    assert a["eager"].synthetic.delay_scale == 1.5 and a["fused"].synthetic.delay_scale == 3.0
    assert a["eager"].bench.repeats == a["fused"].bench.repeats == 3


def test_bad_arms_section_is_a_config_error(tmp_path):
    path = tmp_path / "ab.yaml"
    path.write_text("arms:\n  only: []\n")
    with pytest.raises(ConfigError, match="exactly two"):
        load_arms(path)


def test_plan_round_trips_through_the_run_record(tmp_path):
    a = arms(test=["synthetic.delay_scale=1.2"])
    plan = plan_from_run(RunDir.open(new_run(tmp_path, a).path))
    assert plan.arms == a and [t.label for t in plan.tiers] == ["2x1"]
    assert (plan.repeats, plan.num_prompts) == (1, 4)


def test_a_tier_with_too_many_failures_has_verdict_invalid_not_a_speed_call():
    from tts_bench.ab import TierResult
    from tts_bench.verdicts.stats import compare

    slower = compare([[1.0, 1.01, 0.99] * 10, [1.0, 1.02, 0.98] * 10],
                     [[1.5, 1.51, 1.49] * 10, [1.5, 1.52, 1.48] * 10], min_effect_pct=2.0)
    assert slower.verdict == "slower"
    tier = TierResult(tier="2x1", arms={}, rtf=slower, ttfp=None, duration_delta_pct=None,
                      duration_mismatch=False, identical_outputs=0, paired_outputs=0,
                      invalid_reasons=("2x1 test: 5 of 8 requests failed",))
    assert tier.to_dict()["verdict"] == "invalid"


def test_the_calibrated_spread_of_the_tier_reaches_a_one_block_comparison(monkeypatch):
    import tts_bench.ab.summary as ab_mod
    from tts_bench.config import BenchParams
    from tts_bench.verdicts.stats import CalibratedSpread

    class Cal:
        def spread(self, tier, metric):
            return CalibratedSpread(0.01, 0.02, 100, f"{tier}:{metric}")

    seen = {}

    def spy(base, test, **kw):
        seen.update(kw)
        raise ab_mod.InvalidRunError("stop here")

    monkeypatch.setattr(ab_mod, "compare", spy)
    assert ab_mod._compare([], [], "audio_rtf", BenchParams(), ab_mod._spread(Cal(), "2x1", "audio_rtf")) is None
    assert seen["calibrated"].source == "2x1:audio_rtf"
    assert ab_mod._spread(None, "2x1", "audio_rtf") is None


def _record(arm: str, utt: str, **hashes):
    from tts_bench.rundir.records import RequestRecord

    return RequestRecord(arm=arm, tier="2x1", repeat=0, request_id=f"{arm}:2x1:r0:{utt}", utt=utt, warmup=False,
                         phase_id="p", t_send_s=0.0, t_end_s=1.0, audio_rtf=0.5, audio_seconds=2.0, **hashes)


def test_output_identity_counts_each_stage_apart_and_a_changed_mel_is_not_identical():
    from tts_bench.ab.summary import _identity
    from tts_bench.commands.ab import _identity_text

    same = {"codes_sha256": "c", "mel_sha256": "m", "audio_sha256": "a"}
    base = [_record("base", u, **same) for u in ("0000", "0001", "0002")]
    # 0001: code2wav's flow moved but its audio hash did not (a vocoder that hides it);
    # 0002: the talker moved, so everything after it did.
    test = [_record("test", "0000", **same), _record("test", "0001", **{**same, "mel_sha256": "m2"}),
            _record("test", "0002", codes_sha256="c2", mel_sha256="m2", audio_sha256="a2")]
    ident = _identity(base, test)
    assert (ident.outputs, ident.codes, ident.mel, ident.paired) == (1, 2, 1, 3)
    text = _identity_text({"tier": "2x1", "identical_outputs": 1, "paired_outputs": 3, "identical_codes": 2,
                           "identical_mel": 1})
    assert text == "2x1: 1/3 (codes 2/3, mel 1/3)"


def test_output_identity_reports_no_mel_or_codes_count_for_a_backend_without_them():
    from tts_bench.ab.summary import _identity

    base = [_record("base", "0000", audio_sha256="a")]
    ident = _identity(base, [_record("test", "0000", audio_sha256="a")])
    assert (ident.outputs, ident.codes, ident.mel) == (1, None, None)
