"""Every config key, every edge value: the loader answers with a value or a ConfigError (exit 2)
naming the key, never another exception (exit 1). Exhaustive, not sampled: ~150 keys x 14
values, a few seconds; the hypothesis fuzz (tests/cli/test_fuzz_inputs.py) covers combinations
and what runs after the load."""

from __future__ import annotations

import pytest

from tts_bench.config import BenchConfig, config_to_dict, load_config
from tts_bench.errors import ConfigError

EDGES = ["0", "-1", "1", "99999999999999999999", "1e999", "-1e999", ".nan", "''", "null", "yes",
         "[]", "{}", "x", "[0, -1]"]


def leaf_keys(doc: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in doc.items():
        if isinstance(v, dict) and v:
            out += leaf_keys(v, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}")
    return out


KEYS = leaf_keys(config_to_dict(BenchConfig()))


def test_the_schema_has_the_keys_we_mean_to_cover():
    assert len(KEYS) > 140 and "stages.talker.num_heads" in KEYS and "prompts.shuffle_seed" in KEYS


@pytest.mark.parametrize("key", KEYS)
def test_every_edge_value_of_every_key_loads_or_is_a_config_error(key):
    for value in EDGES:
        try:
            load_config(None, [f"{key}={value}"])
        except ConfigError as exc:
            assert str(exc).startswith("error: ") and exc.exit_status == 2
            assert "Input should" not in str(exc)  # pydantic's own words never reach the user
            # it names the key, or its section for a rule across keys ("code2wav rates disagree")
            parts = [p for p in key.split(".") if p != "stages"]
            assert any(p in str(exc) for p in parts), (key, value, str(exc))
