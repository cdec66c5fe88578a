"""The strict YAML loader, `--set` overrides and the BenchConfig schema."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from stages.config import StageConfig
from tts_bench.config import (
    BenchConfig,
    BenchParams,
    Tier,
    apply_overrides,
    config_hash,
    config_to_dict,
    load_arm,
    load_arms,
    load_config,
    load_dataclass,
    parse_tier,
    parse_tiers,
)
from tts_bench.config.loader import load_yaml_file
from tts_bench.errors import ConfigError, ExitStatus

REPO = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def config_error(path: Path | None, sets=()) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, sets)
    assert info.value.exit_status == ExitStatus.USAGE
    msg = str(info.value)
    assert msg.startswith("error: ")
    return msg


def test_no_file_gives_all_defaults():
    assert load_config(None) == BenchConfig()


def test_yaml_sections_are_typed(tmp_path):
    path = write(
        tmp_path / "a.yaml",
        """
backend: synthetic
synthetic: {chunk_seconds: 2, delay_scale: 1.2}
bench:
  tiers: [32x1, 64x4]
  num_prompts: 5
  warmup: null
stages:
  talker: {rms_norm_eps: 1e-5, extra: {talker_codec_fused_prelude: "false"}}
  code2wav:
    hift: {resblock_dilation_sizes: [[1, 2], [3, 4]]}
""",
    )
    cfg = load_config(path)
    assert cfg.backend == "synthetic"
    # int accepted where float is expected, and stored as float
    assert cfg.synthetic.chunk_seconds == 2.0 and isinstance(cfg.synthetic.chunk_seconds, float)
    assert cfg.bench.tiers == ("32x1", "64x4")
    assert cfg.bench.warmup is None
    assert cfg.stages.talker.rms_norm_eps == 1e-5  # YAML 1.1 would have read "1e-5" as a string
    assert cfg.stages.code2wav.hift.resblock_dilation_sizes == ((1, 2), (3, 4))
    # stage extra is free-form: the string stays a string (stages parse it strictly later)
    assert cfg.stages.talker.extra == {"talker_codec_fused_prelude": "false"}
    assert cfg.prompts == BenchConfig().prompts


def test_unknown_key_names_file_dotted_key_and_suggestion(tmp_path):
    path = write(tmp_path / "a.yaml", "bench:\n  num_promts: 4\n")
    msg = config_error(path)
    assert str(path) in msg and "'bench.num_promts'" in msg and "'bench.num_prompts'" in msg


def test_unknown_nested_stage_key_is_suggested(tmp_path):
    path = write(tmp_path / "a.yaml", "stages:\n  talker:\n    sampling:\n      temprature: 0.5\n")
    msg = config_error(path)
    assert "stages.talker.sampling.temprature" in msg and "stages.talker.sampling.temperature" in msg


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("bench: {num_prompts: abc}", "bench.num_prompts", "int"),
        ("bench: {num_prompts: true}", "bench.num_prompts", "int"),  # bool is never an int
        ("bench: {num_prompts: 2.5}", "bench.num_prompts", "int"),
        ("bench: {timeout_s: false}", "bench.timeout_s", "float"),
        ("bench: {disable_shuffle: 1}", "bench.disable_shuffle", "bool"),
        ("bench: {tiers: 2x1}", "bench.tiers", "list of str"),
        ("backend: pipr", "backend", "one of 'embedded', 'piper', 'synthetic', 'http'"),
        ("http: {extra_body: [1]}", "http.extra_body", "mapping"),
        ("stages: {runner: {weights: 3}}", "stages.runner.weights", "str or null"),
        ("stages: {code2wav: {hift: {upsample_rates: [8, x]}}}", "stages.code2wav.hift.upsample_rates[1]", "int"),
        ("bench: 3", "bench", "mapping"),
    ],
)
def test_wrong_type_names_key_and_expected_type(tmp_path, text, key, expected):
    msg = config_error(write(tmp_path / "a.yaml", text + "\n"))
    assert f"{key} must be {expected}" in msg, msg
    assert str(tmp_path / "a.yaml") in msg


def test_post_init_value_error_becomes_config_error_with_file(tmp_path):
    path = write(tmp_path / "a.yaml", "stages:\n  talker:\n    sampling: {top_p: 1.5}\n")
    msg = config_error(path)
    assert "top_p" in msg and str(path) in msg


def test_bad_tier_in_config_is_rejected(tmp_path):
    msg = config_error(write(tmp_path / "a.yaml", "bench: {tiers: [2x1, 4y2]}\n"))
    assert "bench.tiers" in msg and "4y2" in msg


def test_duplicate_key_and_bad_yaml_are_config_errors(tmp_path):
    assert "duplicate key" in config_error(write(tmp_path / "d.yaml", "backend: piper\nbackend: http\n"))
    assert "invalid YAML" in config_error(write(tmp_path / "y.yaml", "bench: [unclosed\n"))
    assert "not found" in config_error(tmp_path / "missing.yaml")
    assert "must be a mapping" in config_error(write(tmp_path / "l.yaml", "- a\n- b\n"))


def test_empty_file_gives_defaults_with_the_hosts_stage_config(tmp_path):
    from stages.platform import platform_override

    path = write(tmp_path / "e.yaml", "# nothing\n")
    with platform_override(cuda=True):  # an accelerator host: the real dims (dataclass defaults)
        assert load_config(path) == BenchConfig()
    with platform_override(cuda=False, npu=False):  # a CPU-only host: the shipped tiny dims
        cfg = load_config(path)
    tiny = load_config(None, ["stages=configs/stages/minicpmo45-tiny.yaml"]).stages
    assert cfg.stages == tiny and cfg.stages.talker.num_layers < BenchConfig().stages.talker.num_layers
    assert dataclasses.replace(cfg, stages=BenchConfig().stages) == BenchConfig()
    with platform_override(cuda=False, npu=False):  # other backends run no stages: untouched
        assert load_config(write(tmp_path / "s.yaml", "backend: synthetic\n")).stages == BenchConfig().stages


def test_include_is_relative_to_including_file(tmp_path):
    write(tmp_path / "stages/tiny.yaml", "talker: {hidden_size: 64, num_heads: 4, num_kv_heads: 2}\n")
    path = write(tmp_path / "ab/arm.yaml", "stages: ../stages/tiny.yaml\nbackend: embedded\n")
    cfg = load_config(path)
    assert cfg.stages.talker.hidden_size == 64 and cfg.stages.talker.num_kv_heads == 2
    assert cfg.stages.code2wav == StageConfig().code2wav


def test_error_inside_include_names_the_included_file(tmp_path):
    inc = write(tmp_path / "stages/tiny.yaml", "talker: {hiden_size: 64}\n")
    msg = config_error(write(tmp_path / "ab/arm.yaml", "stages: ../stages/tiny.yaml\n"))
    assert str(inc) in msg and "talker.hidden_size" in msg


def test_missing_include_is_config_error(tmp_path):
    msg = config_error(write(tmp_path / "ab/arm.yaml", "stages: ../nope.yaml\n"))
    assert "stages" in msg and "../nope.yaml" in msg


def test_overrides_are_typed_and_routed_to_stages():
    cfg = load_config(
        None,
        [
            "bench.num_prompts=4",
            "bench.tiers=[32x1, 64x4, 128x8]",
            "code2wav.extra.token2wav_device_spk=false",
            'code2wav.extra.code2wav_batched_cache_split="false"',
            "talker.sampling.temperature=1",
            "runner.weights=null",
        ],
    )
    assert cfg.bench.num_prompts == 4
    assert cfg.bench.tiers == ("32x1", "64x4", "128x8")
    # a quoted value stays a string; the stage's strict parser reads it as false
    assert cfg.stages.code2wav.extra == {
        "token2wav_device_spk": False, "code2wav_batched_cache_split": "false"
    }
    assert cfg.stages.talker.sampling.temperature == 1.0
    assert isinstance(cfg.stages.talker.sampling.temperature, float)


def test_override_into_nested_extra_mapping_keeps_other_keys():
    cfg = apply_overrides(BenchConfig(), ["http.extra_body.a=1", "http.extra_body.b.c=x", "http.extra_body.k=[1, 2]"])
    cfg = apply_overrides(cfg, ["http.extra_body.b.d=true", "talker.extra.talker_decode_graph=1"])
    assert cfg.http.extra_body == {"a": 1, "b": {"c": "x", "d": True}, "k": [1, 2]}  # free-form
    assert cfg.stages.talker.extra == {"talker_decode_graph": 1}  # kept as parsed, known key


def test_overrides_never_mutate_the_input():
    base = BenchConfig()
    new = apply_overrides(base, ["bench.num_prompts=3", "code2wav.extra.token2wav_device_spk=true"])
    assert base == BenchConfig() and base.stages.code2wav.extra == {}
    assert new.bench.num_prompts == 3


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("bench.num_promts=3", "did you mean 'bench.num_prompts'"),
        ("code2wav.hift.upsample_rats=[1]", "did you mean 'stages.code2wav.hift.upsample_rates'"),
        ("bench.num_prompts=three", "bench.num_prompts must be int"),
        ("bench.num_prompts.x=1", "bench.num_prompts is int"),
        ("talker.sampling.top_p=2", "top_p"),
        ("no_equals_sign", "write dotted.key=value"),
        ("backend=tts", "one of"),
    ],
)
def test_bad_overrides_are_config_errors(override, fragment):
    msg = config_error(None, [override])
    assert fragment in msg and "(--set)" in msg, msg


def test_config_to_dict_is_json_safe_and_round_trips():
    cfg = load_config(None, ["bench.tiers=[2x1]", "code2wav.extra.token2wav_device_spk=false"])
    data = config_to_dict(cfg)
    assert data["bench"]["tiers"] == ["2x1"]
    assert isinstance(data["stages"]["code2wav"]["hift"]["resblock_dilation_sizes"][0], list)
    json.loads(json.dumps(data))
    assert load_dataclass(BenchConfig, data, source="round-trip") == cfg


def test_config_hash_is_stable_and_tracks_changes():
    a, b = BenchConfig(), BenchConfig()
    assert config_hash(a) == config_hash(b)
    assert len(config_hash(a)) == 12 and int(config_hash(a), 16) >= 0
    assert config_hash(apply_overrides(a, ["code2wav.extra.token2wav_device_spk=false"])) != config_hash(a)


def test_parse_tier():
    assert parse_tier("64x4") == Tier(concurrency=64, replicas=4)
    assert parse_tier(" 32 x 1 ").label == "32x1"
    assert parse_tiers("2x1,4x2") == (Tier(2, 1), Tier(4, 2))
    for bad in ("64", "0x1", "4x0", "ax2", "4x2x1", ""):
        with pytest.raises(ConfigError, match="bad tier"):
            parse_tier(bad)


def test_bootstrap_method_is_a_checked_choice():
    assert load_config(None, ["bench.bootstrap=stratified"]).bench.bootstrap == "stratified"
    assert "one of 'hierarchical', 'stratified'" in config_error(None, ["bench.bootstrap=paired"])


def test_retired_bootstrap_keys_still_load_but_warn_once_each(tmp_path, caplog):
    path = tmp_path / "old.yaml"
    path.write_text("backend: synthetic\nbench:\n  bootstrap_resamples: 500\n  repeats: 2\n")
    with caplog.at_level("WARNING", logger="tts_bench.config"):
        cfg = load_config(path, ["bench.bootstrap=stratified", "bench.seed=3"])
    assert cfg.bench.repeats == 2 and cfg.bench.seed == 3
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2
    assert "bench.bootstrap_resamples" in warned[0] and str(path) in warned[0] and "no longer read" in warned[0]
    assert "bench.bootstrap " in warned[1] and "--set" in warned[1]


def test_current_bench_keys_do_not_warn(caplog):
    with caplog.at_level("WARNING", logger="tts_bench.config"):
        load_config("configs/ab/graphs.yaml", ["bench.repeats=2", "bench.min_effect_pct=1"])
    assert not caplog.records


def test_warmup_defaults_to_max_two_and_concurrency():
    assert BenchParams().warmup_for(1) == 2
    assert BenchParams().warmup_for(64) == 64
    assert BenchParams(warmup=0).warmup_for(64) == 0
    assert BenchParams(tiers=("2x1", "8x2")).tier_list == (Tier(2, 1), Tier(8, 2))


def test_schema_is_frozen_dataclasses():
    cfg = BenchConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.backend = "piper"  # type: ignore[misc]


BENCH_CONFIGS = sorted((REPO / "configs").glob("ab/*.yaml")) + sorted((REPO / "configs").glob("wer/*.yaml"))


@pytest.mark.parametrize("path", BENCH_CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_bench_configs_load(path):
    # `arms:` (lists of overrides per A/B arm) is read by tts_bench.ab, not by the schema;
    # the overrides themselves must apply cleanly to the file's config.
    raw = dict(load_yaml_file(path))
    arms = raw.pop("arms", None) or {}
    cfg = load_dataclass(BenchConfig, raw, source=str(path), base_dir=path.parent)
    for name, sets in arms.items():
        assert isinstance(apply_overrides(cfg, sets or [], source=f"{path}: arms.{name}"), BenchConfig)


def test_overrides_work_on_any_section_dataclass():
    from tts_bench.config.wer import WerParams

    params = apply_overrides(WerParams(), ["beam_size=3", "vad=false"])
    assert (params.beam_size, params.vad) == (3, False)
    with pytest.raises(ConfigError, match="did you mean 'beam_size'"):
        apply_overrides(WerParams(), ["beam_sise=3"])


def test_section_override_with_a_path_includes_relative_to_cwd(tmp_path, monkeypatch):
    write(tmp_path / "configs/stages/small.yaml", "runner: {max_num_seqs: 2}\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["stages=configs/stages/small.yaml", "runner.seed=7"])
    assert cfg.stages.runner.max_num_seqs == 2 and cfg.stages.runner.seed == 7


def test_override_values_keep_equals_signs_and_empty_means_null():
    cfg = load_config(None, ["http.base_url=http://h:1/v1?a=b", "bench.warmup=", "runner.weights="])
    assert cfg.http.base_url == "http://h:1/v1?a=b"
    assert cfg.bench.warmup is None and cfg.stages.runner.weights is None


def test_post_init_flag_error_is_not_double_prefixed():
    from dataclasses import dataclass

    from stages.flags import read_bool_flag

    @dataclass(frozen=True)
    class WithFlag:
        on: str = "true"

        def __post_init__(self) -> None:
            read_bool_flag({"on": self.on}, "on", True)

    msg = str(pytest.raises(ConfigError, load_dataclass, WithFlag, {"on": "ture"}, source="x.yaml").value)
    assert msg.startswith("error: stage flag 'on'") and "(x.yaml)" in msg


def test_prompts_per_client_scales_each_tier_and_defaults_to_num_prompts():
    from tts_bench.config import BenchParams

    assert BenchParams(num_prompts=5).prompts_for(64) == 5
    assert BenchParams(num_prompts=5, prompts_per_client=2).prompts_for(64) == 128
    with pytest.raises(ValueError, match="prompts_per_client"):
        BenchParams(prompts_per_client=0)


def test_a_date_looking_scalar_is_the_string_it_looks_like(tmp_path):
    # YAML 1.2 core has no timestamps (1.1 made `2026-12-01` a date, which no str field takes).
    assert load_config(write(tmp_path / "a.yaml", "http: {voice: 2026-12-01}\n")).http.voice == "2026-12-01"


def test_a_nested_override_runs_the_checks_of_every_enclosing_section():
    # code2wav's own __post_init__ relates hift's rate to the flow's: an override deep inside
    # hift must meet it, as the same key in a file would.
    msg = config_error(None, ["code2wav.hift.sampling_rate=16000"])
    assert "code2wav rates disagree" in msg and "(--set)" in msg


@pytest.mark.parametrize(
    ("sets", "fragment"),
    [
        (["backend=&a [*a]"], "backend[0] contains itself (a YAML alias cycle)"),
        (["http.extra_body.x=" + "[" * 80 + "]" * 80], "http.extra_body.x nests lists or mappings more than 64 deep"),
        (["http.extra_body.x=" + "[" * 5000 + "]" * 5000], "nested too deeply"),
        (["http.extra_body=!!binary aGVsbG8="], "http.extra_body holds a bytes, not plain YAML data"),
        (["http.extra_body={1: 2}"], "key 1 under http.extra_body must be a string"),
    ],
)
def test_yaml_that_is_not_plain_data_is_a_config_error(sets, fragment):
    msg = config_error(None, sets)
    assert fragment in msg and "(--set" in msg, msg


def test_loaded_configs_are_plain_dataclasses_that_replace_validates():
    cfg = load_config(None, ["bench.num_prompts=4"])
    assert type(cfg) is BenchConfig and dataclasses.is_dataclass(cfg)
    assert dataclasses.asdict(cfg)["bench"]["num_prompts"] == 4
    assert dataclasses.replace(cfg.bench, num_prompts=5).num_prompts == 5
    with pytest.raises(ValueError, match="num_prompts"):  # __post_init__ still guards replace()
        dataclasses.replace(cfg.bench, num_prompts=0)


@pytest.mark.parametrize(
    "text",
    ["bench: {num_prompts: abc, repeats: x}\n", "bench: {nope: 1}\n", "stages: {talker: {sampling: {top_p: 9}}}\n",
     "stages: {runner: {devices: [0, x]}}\n", "stages: {code2wav: {hift: {resblock_dilation_sizes: [[1, 2], 3]}}}\n"],
)
def test_validation_errors_are_ours_never_pydantics(tmp_path, text):
    msg = config_error(write(tmp_path / "a.yaml", text))
    for raw in ("pydantic", "Input should", "validation error", "errors.pydantic.dev"):
        assert raw not in msg, msg
    assert msg.endswith(("fix the value", "?")) or "valid keys here" in msg, msg


def test_load_config_reads_an_ab_config_as_what_both_arms_share(tmp_path):
    path = write(tmp_path / "ab.yaml", "backend: synthetic\nbench: {num_prompts: 3}\n"
                                       "arms: {base: [synthetic.delay_scale=1.1], test: [synthetic.delay_scale=1.2]}\n")
    shared = load_config(path)
    arms = load_arms(path)
    assert shared.bench.num_prompts == 3 and shared.synthetic.delay_scale == BenchConfig().synthetic.delay_scale
    assert dataclasses.replace(arms["test"], synthetic=shared.synthetic) == shared
    assert load_config("configs/ab/default.yaml").backend == "embedded"  # as the docs use it
    bad = write(tmp_path / "bad.yaml", "arms: {base: [], test: 3}\n")
    assert "arms must map exactly two arm names" in config_error(bad)  # checked, though not applied


def test_load_arm_builds_only_the_arm_asked_for(tmp_path):
    path = write(tmp_path / "ab.yaml", "backend: synthetic\narms: {base: [bench.seed=1], test: [bench.sed=2]}\n")
    assert load_arm(path).bench.seed == 1  # the test arm's typo is not evaluated
    assert load_arm(path, ["bench.num_prompts=3"], arm="base").bench.num_prompts == 3
    with pytest.raises(ConfigError, match="unknown key 'bench.sed'"):
        load_arm(path, arm="test")
    with pytest.raises(ConfigError, match="no arm 'other'"):
        load_arm(path, arm="other")


def test_wer_arms_are_chosen_by_name_and_kept_in_the_config_order(tmp_path):
    # --arms once paired its names with the config's arms by position: `--arms test` ran the
    # base arm under the test arm's name, and a name the config lacks ran anyway.
    from tts_bench.errors import ConfigError
    from tts_bench.wer.session import load_wer_arms

    path = tmp_path / "wer.yaml"
    path.write_text("backend: synthetic\narms:\n  base: []\n  test: [synthetic.delay_scale=1.2]\n")
    only = load_wer_arms(path, "test")
    assert list(only) == ["test"] and only["test"].synthetic.delay_scale == 1.2
    both = load_wer_arms(path, "test,base")
    assert list(both) == ["base", "test"] and both["base"].synthetic.delay_scale == 1.0
    with pytest.raises(ConfigError, match="no arm named 'nope'.*base, test"):
        load_wer_arms(path, "test,nope")


def test_arms_may_not_set_the_shared_plan_differently(tmp_path):
    from tts_bench.config import load_arms
    from tts_bench.errors import ConfigError

    path = tmp_path / "ab.yaml"
    path.write_text("backend: synthetic\narms:\n  base: []\n  test: [bench.seed=7]\n")
    with pytest.raises(ConfigError, match="arm 'test' sets bench"):
        load_arms(path)
    assert load_arms(path, sets=["bench.seed=7"], base_sets=["bench.seed=7"])["base"].bench.seed == 7
    with pytest.raises(ConfigError, match="mem"):
        load_arms(tmp_path / "ab.yaml", base_sets=["bench.seed=7"], test_sets=["mem.interval_s=3"])


@pytest.mark.parametrize("name", ["../../../escape", "a b/c", "", ".hidden", "x" * 65, "tab\there"])
def test_arm_names_that_cannot_name_a_folder_are_refused(tmp_path, name):
    # `tts-bench wer` writes wavs/<arm>/<id>.wav: '../../../escape' wrote outside the run.
    path = write(tmp_path / "ab.yaml", f"backend: synthetic\narms: {{{json.dumps(name)}: [], test: []}}\n")
    with pytest.raises(ConfigError, match="must be 1-64 letters, digits"):
        load_config(path)
    ok = write(tmp_path / "ok.yaml", "backend: synthetic\narms: {before-1.x: [], After_2: []}\n")
    assert load_config(ok).backend == "synthetic"


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "1e400"])
def test_infinite_or_nan_numbers_are_refused_from_files_and_sets(tmp_path, value):
    # `> 0` range checks let .inf through: every synthetic request then waited out its timeout.
    path = write(tmp_path / "c.yaml", f"backend: synthetic\nsynthetic: {{delay_scale: {value}}}\n")
    assert "synthetic.delay_scale must be a finite number" in config_error(path)
    with pytest.raises(ConfigError, match=r"bench.timeout_s must be a finite number, got .* \(--set\)"):
        apply_overrides(load_config(write(tmp_path / "ok.yaml", "backend: synthetic\n")), [f"bench.timeout_s={value}"])
