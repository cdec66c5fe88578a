"""Each stage's options come from one table (`OPTIONS` in stages/talker/options.py and
stages/code2wav/options.py): the options dataclasses' defaults, the keys the parser knows and the
shipped stage YAMLs all agree with it.

The rule for YAML: a base stage config (configs/stages/*.yaml and the packaged copies under
tts_bench/configs/stages/) either leaves a flag out or states the table's default, so reading
it never changes a default behind the table's back. A config that runs a flag the other way is
an arm: it sets the flag in an override list (`arms:` / `--set code2wav.extra.x=false`) of a
bench config, never in an `extra:` mapping of its own.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from stages.code2wav import options as code2wav_options
from stages.flags import Option
from stages.talker import options as talker_options

ROOT = Path(__file__).resolve().parents[2]
STAGES = {"talker": talker_options.TalkerOptions, "code2wav": code2wav_options.Code2WavOptions}
TABLES = {"talker": talker_options.OPTIONS, "code2wav": code2wav_options.OPTIONS}
NO_ENV: dict[str, str] = {}
BASE_STAGE_CONFIGS = sorted([*(ROOT / "configs" / "stages").glob("*.yaml"),
                             *(ROOT / "tts_bench" / "configs" / "stages").glob("*.yaml")])
OTHER_CONFIGS = sorted(p for root in (ROOT / "configs", ROOT / "tts_bench" / "configs") for p in root.rglob("*.yaml")
                       if p not in BASE_STAGE_CONFIGS)


def parse(stage: str, extra: dict):
    cls = STAGES[stage]
    return cls.from_extra(extra, NO_ENV) if stage == "code2wav" else cls.from_extra(extra)


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_the_dataclass_defaults_are_the_tables(stage):
    table = TABLES[stage]
    fields = {f.name: f.default for f in dataclasses.fields(STAGES[stage])}
    assert fields == {row.field: row.default for row in table if row.field is not None}
    assert parse(stage, {}) == STAGES[stage]()  # a missing key means the table's default


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_every_row_is_one_known_key_with_a_one_line_doc(stage):
    table = TABLES[stage]
    keys = [row.key for row in table]
    module = talker_options if stage == "talker" else code2wav_options
    assert len(keys) == len(set(keys)) and set(keys) == module.KNOWN_KEYS
    for row in table:
        assert isinstance(row, Option) and row.doc and "\n" not in row.doc and len(row.doc) <= 120, row


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_each_rows_default_is_what_stating_it_parses_to(stage):
    """Writing a row's default explicitly (or null) changes nothing: the table's default is the
    parser's."""
    for row in TABLES[stage]:
        assert parse(stage, {row.key: None}) == STAGES[stage](), row.key
        if row.default is not None:
            assert parse(stage, {row.key: row.default}) == STAGES[stage](), row.key


def test_decision_ids_name_rows_of_the_decisions_table():
    decided = set(re.findall(r"^\| (D-[A-Z0-9-]+) \|", (ROOT / "results" / "decisions.md").read_text(), re.M))
    cited = {row.decision for table in TABLES.values() for row in table if row.decision}
    assert cited and cited <= decided


def _non_defaults(path: Path) -> list[str]:
    """`stage.extra.key` of every flag a stage YAML states with a value other than its default."""
    doc = yaml.safe_load(path.read_text()) or {}
    return [f"{stage}.extra.{key}" for stage in STAGES for key, value in ((doc.get(stage) or {}).get("extra") or {}).items()
            if parse(stage, {key: value}) != STAGES[stage]()]


@pytest.mark.parametrize("path", BASE_STAGE_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_base_stage_config_omits_each_flag_or_states_its_default(path):
    # Not the default: leave it out, state the default, or make the other value an arm.
    assert _non_defaults(path) == []


def test_the_stage_config_rule_sees_what_it_forbids(tmp_path):
    path = tmp_path / "stages.yaml"
    path.write_text("talker:\n  extra: {talker_decode_graph: true, talker_fused_layers: 'false'}\n"
                    "code2wav:\n  extra: {token2wav_allow_tf32: null, code2wav_dit_dtype: bf16,\n"
                    "            code2wav_matmul_attention_requests: 4, code2wav_allow_tf32: flow}\n")
    assert _non_defaults(path) == ["talker.extra.talker_fused_layers", "code2wav.extra.code2wav_dit_dtype",
                                   "code2wav.extra.code2wav_allow_tf32"]
    assert list(_extras(yaml.safe_load(path.read_text()))) == ["talker.extra", "code2wav.extra"]


def test_base_stage_configs_are_found():
    names = {str(p.relative_to(ROOT)) for p in BASE_STAGE_CONFIGS}
    assert {"configs/stages/minicpmo45.yaml", "configs/stages/minicpmo45-tiny.yaml"} <= names


def _extras(node, where=()):
    """Paths of `extra` mappings anywhere in a YAML document."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "extra" and isinstance(value, dict):
                yield ".".join(map(str, (*where, key)))
            yield from _extras(value, (*where, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _extras(value, (*where, i))


@pytest.mark.parametrize("path", OTHER_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_other_configs_change_flags_only_as_arms(path):
    assert list(_extras(yaml.safe_load(path.read_text()))) == []


def _doc_flag_rows(text: str) -> dict[str, tuple[str, str]]:
    """{`stage.extra.key`: (default cell, decision cell)} of docs/runner.md's flag table."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"`(talker|code2wav)\.extra\.\w+`", cells[0]):
            rows[cells[0].strip("`")] = (cells[1], cells[3])
    return rows


def _doc_problems(table_rows: dict[str, tuple[str, str]]) -> list[str]:
    problems = []
    for stage, table in TABLES.items():
        for row in table:
            if row.field is None:  # an alias: documented beside its key
                continue
            name = f"{stage}.extra.{row.key}"
            if name not in table_rows:
                problems.append(f"{name}: no row")
                continue
            default_cell, decision_cell = table_rows.pop(name)
            shown = "null" if row.default is None else str(row.default).lower()
            if shown not in default_cell.lower():
                problems.append(f"{name}: default {default_cell!r}, the table says {shown}")
            if row.decision and row.decision not in decision_cell:
                problems.append(f"{name}: decision {decision_cell!r}, the table says {row.decision}")
    problems += [f"{name}: no such option" for name in table_rows]
    return problems


def test_the_runner_docs_flag_table_is_the_option_tables():
    rows = _doc_flag_rows((ROOT / "docs" / "runner.md").read_text())
    assert len(rows) >= 10, "docs/runner.md's flag table was not found"
    assert _doc_problems(rows) == []


def test_the_docs_rule_sees_a_wrong_default_a_missing_row_and_an_unknown_flag():
    rows = _doc_flag_rows((ROOT / "docs" / "runner.md").read_text())
    rows["code2wav.extra.code2wav_device_graph"] = ("false", "D-GRAPH-1")
    del rows["talker.extra.talker_fused_layers"]
    rows["code2wav.extra.code2wav_no_such_flag"] = ("true", "—")
    problems = _doc_problems(rows)
    assert any("code2wav_device_graph: default" in p for p in problems)
    assert any("talker_fused_layers: no row" in p for p in problems)
    assert any("code2wav_no_such_flag: no such option" in p for p in problems)
