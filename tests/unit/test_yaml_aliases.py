"""YAML alias bombs ("billion laughs") are refused by size before they are expanded: exit 2
within a second, naming the key, from a config file, `http.extra_body` or a `--set` value."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tts_bench.config import load_config
from tts_bench.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def bomb_block(levels: int = 9, width: int = 10, indent: str = "") -> str:
    """`a0: &a0 [lol]`, then each level an anchored list of `width` aliases of the one before."""
    lines = [f"{indent}a0: &a0 [lol]"]
    for i in range(1, levels + 1):
        lines.append(f"{indent}a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def bomb_flow(levels: int = 9, width: int = 10) -> str:
    parts = ["a0: &a0 [lol]"] + [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]"
                                  for i in range(1, levels + 1)]
    return "{" + ", ".join(parts) + "}"


def load_in_child(path: str | None, sets: list[str]) -> dict:
    """load_config in a fresh process (a bomb that is not refused would never return): the
    error and the CPU seconds the load took (process time: other processes on a loaded machine
    do not count, as they did in wall-clock seconds)."""
    code = (
        "import json, sys, time\n"
        "from tts_bench.config import load_config\n"
        "from tts_bench.errors import ConfigError\n"
        "path, sets = json.loads(sys.argv[1])\n"
        "t = time.process_time()\n"
        "try:\n"
        "    load_config(path, sets); err, status = None, 0\n"
        "except ConfigError as exc:\n"
        "    err, status = str(exc), int(exc.exit_status)\n"
        "print(json.dumps({'error': err, 'status': status, 's': time.process_time() - t}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, json.dumps([path, sets])], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # a hang guard
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("where", ["top", "extra_body"])
def test_an_alias_bomb_in_a_config_file_is_refused_within_a_second_naming_the_key(tmp_path, where):
    path = tmp_path / "bomb.yaml"
    if where == "top":
        path.write_text(bomb_block())
    else:
        path.write_text("http:\n  extra_body:\n" + bomb_block(indent="    "))
    got = load_in_child(str(path), [])
    assert got["status"] == 2 and got["s"] < 1.0, got
    key = "a5" if where == "top" else "http.extra_body.a5"
    assert got["error"].startswith(f"error: {key} expands YAML aliases"), got
    assert str(path) in got["error"] and "nest fewer aliases" in got["error"]


def test_an_alias_bomb_in_a_set_value_is_refused_within_a_second_naming_the_key():
    got = load_in_child(None, [f"http.extra_body={bomb_flow()}"])
    assert got["status"] == 2 and got["s"] < 1.0, got
    assert "(--set http.extra_body)" in got["error"] and "expands YAML aliases" in got["error"]


def test_an_alias_bomb_in_a_list_names_the_value(tmp_path):
    with pytest.raises(ConfigError, match=r"error: the value expands YAML aliases .*\(--set bench.tiers\)"):
        load_config(None, ["bench.tiers=[" + bomb_flow(levels=6) + "]"])


def test_ordinary_anchors_and_merge_keys_still_load(tmp_path):
    path = tmp_path / "anchors.yaml"
    path.write_text("http:\n  extra_body: &body {max_new_tokens: 64, tags: [a, b]}\n"
                    "arms:\n  base: []\n  test: [\"bench.seed=7\"]\n"
                    "synthetic: &syn {chunk_seconds: 0.5}\n")
    cfg = load_config(path)
    assert cfg.http.extra_body == {"max_new_tokens": 64, "tags": ["a", "b"]}
    assert load_config(None, ["http.extra_body={a: &x [1, 2], b: *x}"]).http.extra_body == {"a": [1, 2], "b": [1, 2]}
