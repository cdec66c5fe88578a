"""Property-based fuzz of what users type: config files, `--set` strings, meta.lst lines and
`tts-bench serve` request bodies (hypothesis), YAML anchors and aliases up to "billion laughs"
(nine levels of ten aliases) in config files and `--set` values included.

Properties, whatever the input:
- the CLI exits 0 or 2 (a usage/config error), never 1 (a bug) or 5, and prints no traceback;
- no run directory is left with status `running`;
- the server answers a 2xx or a 4xx with OpenAI-style JSON, never a 500, and stays healthy.

The CLI runs in-process through `tts_bench.cli.main` (the exit-code boundary) on the synthetic
backend with zero delays. Random `--set` strings and config files come before fixed overrides
(`FAST`), so each fuzzed value is parsed and validated while the runs that pass stay tiny; the
edge-value test puts the fuzzed keys last, so what runs is the fuzzed value. Examples are bounded
(`max_examples`) and derandomized (the same examples every run: a CI failure reproduces), no
database is written, and the whole file runs in well under a minute on 2 cores. To explore
further, raise `max_examples` and set `derandomize=False` locally. `tests/unit/test_config_edges.py`
complements this with every key x every edge value at load time.
"""

from __future__ import annotations

import json
import string
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from stages.runner.fakes import fake_factories
from tests.cli.in_process import main_in_process
from tts_bench.backends.embedded import EmbeddedBackend
from tts_bench.config import BenchConfig, config_to_dict, load_config
from tts_bench.serve.app import running_server

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = dict(deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
# Appended after the fuzzed overrides: whatever passed validation runs as one tiny request.
FAST = ["backend=synthetic", "synthetic.first_chunk_delay_s=0", "synthetic.chunk_delay_s=0",
        "synthetic.delay_scale=1", "synthetic.chunk_seconds=1", "synthetic.seconds_per_word=0.25",
        "synthetic.sample_rate=8000", "synthetic.fail_every=0", "bench.warmup=0",
        "bench.prompts_per_client=null", "bench.bootstrap_resamples=50", "bench.timeout_s=30",
        "bench.max_failure_fraction=0"]
FIXED_ARGS = ["--tiers", "1x1", "--num-prompts", "1", "--repeats", "1", "--format", "json"]


def _flat_keys(doc: dict, prefix: str = "") -> list[str]:
    keys = []
    for k, v in doc.items():
        key = f"{prefix}{k}"
        keys.append(key)
        if isinstance(v, dict):
            keys += _flat_keys(v, key + ".")
    return keys


KEYS = sorted(set(_flat_keys(config_to_dict(BenchConfig())))
              | {"talker.extra.talker_codec_fused_prelude", "code2wav.extra.token2wav_device_spk",
                 "code2wav.extra.token2wav_allow_tf32", "runner.max_seq_len", "talker.num_heads",
                 "code2wav.extra.nope", "bench.nope", "nope"})
GOOD = ["1", "2", "3", "0.5", "true", "false", "null", "2x1", "[2x1]", "cpu", "'x'", "10", "0.0"]
SCALARS = ["yes", "no", "on", "off", "y", "n", "true", "False", "null", "~", "", "[]", "{}", "0",
           "-1", "1e999", ".nan", "-.inf", "2x1", "[1x1, 99999999999999999999x1]", "'quoted'",
           '"dq\\"', "[a, b]", "{a: 1}", ": :", "- x", "!!python/object:os.system", "&a [*a]",
           "'", "\\", "\t", "{a: &x [1, 2], b: *x}", "[&y lol, *y, *y]", "*undefined",
           "{a: &b [x, x], c: &d [*b, *b, *b], e: [*d, *d, *d]}", "configs/stages/minicpmo45-tiny.yaml", "builtin:seed-tts-en",
           "builtin:nope", "\u00e9\u00e8", "#comment", "0x10", "0o17", "1_000", "+1"]
values = st.one_of(
    st.sampled_from(GOOD),
    st.sampled_from(SCALARS),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(alphabet=string.printable, max_size=12),
)
keys = st.one_of(st.sampled_from(KEYS), st.sampled_from(KEYS),
                 st.text(alphabet=string.ascii_lowercase + "._", max_size=14))
set_strings = st.one_of(st.tuples(keys, values).map("=".join), st.tuples(keys, values).map("=".join),
                        st.text(max_size=16))


def run_cli(args: list[str]) -> tuple[int, str, str]:
    """`tts-bench <args>` in this process: (exit code, stdout, stderr)."""
    proc = main_in_process(*args)
    return proc.returncode, proc.stdout, proc.stderr


def check(args: list[str], result_dir: Path) -> int:
    code, out, err = run_cli([*args, "--result-dir", str(result_dir)])
    event(f"exit {code}")
    assert code in (0, 2), (code, args, err[-2000:])
    assert "Traceback" not in err, err
    for run_json in result_dir.glob("*/run.json"):
        assert json.loads(run_json.read_text())["status"] != "running", run_json
    return code


@settings(max_examples=60, **SETTINGS)
@given(st.lists(set_strings, min_size=1, max_size=3))
def test_any_set_strings_exit_0_or_2_without_traceback(sets):
    with tempfile.TemporaryDirectory() as tmp:
        args = ["ab", "--config", "configs/ab/synthetic.yaml", *FIXED_ARGS]
        for s in [*sets, *FAST, "prompts.meta=builtin:seed-tts-en"]:
            args += ["--set", s]
        check(args, Path(tmp) / "runs")


# Keys a synthetic A/B reads while it runs, with the values at their edges. Left out: delays and
# timeouts (a valid huge delay is a slow run, not an error), fail_every / max_failure_fraction
# (failures make a legitimately invalid run, exit 5) and prompts_per_client (K x C requests).
RUNTIME_KEYS = ["bench.tiers", "bench.num_prompts", "bench.warmup", "bench.repeats",
                "bench.min_effect_pct", "bench.bootstrap_resamples", "bench.bootstrap", "bench.seed",
                "bench.disable_shuffle", "bench.duration_mismatch_pct", "prompts.meta",
                "prompts.shuffle_seed", "synthetic.chunk_seconds", "synthetic.seconds_per_word",
                "synthetic.sample_rate"]
EDGES = ["0", "-1", "1", "2", "1e-9", "60", "61", "99999999999999999999", "1e999", ".nan", "null",
         "''", "yes", "true", "[]", "[1x1]", "[4096x64]", "4611686018427387904", "9223372036854775807",
         "384000", "stratified", "builtin:seed-tts-en", "builtin:x"]


@settings(max_examples=60, **SETTINGS)
@given(st.lists(st.tuples(st.sampled_from(RUNTIME_KEYS), st.one_of(st.sampled_from(EDGES), values)),
                min_size=1, max_size=3))
def test_edge_values_that_a_synthetic_ab_runs_with_exit_0_or_2(pairs):
    fuzzed = {k for k, _ in pairs}
    fast = [f for f in FAST if f.split("=", 1)[0] not in fuzzed]
    with tempfile.TemporaryDirectory() as tmp:
        args = ["ab", "--config", "configs/ab/synthetic.yaml", "--tiers", "1x1", "--format", "json"]
        for s in [*fast, *(f"{k}={v}" for k, v in pairs)]:  # fuzzed last: they are what runs
            args += ["--set", s]
        check(args, Path(tmp) / "runs")


yaml_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
              st.text(max_size=10), st.sampled_from(SCALARS)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6)),
                                            inner, max_size=3)),
    max_leaves=8,
)
sections = st.dictionaries(
    st.sampled_from(["backend", "stages", "synthetic", "prompts", "bench", "wer", "mem", "http",
                     "piper", "arms", "nope"]),
    yaml_values, max_size=4,
)


@settings(max_examples=50, **SETTINGS)
@given(st.one_of(sections.map(lambda d: yaml.safe_dump(d, allow_unicode=True)),
                 st.text(max_size=60), st.binary(max_size=40).map(lambda b: b.decode("latin-1"))))
def test_any_config_file_exits_0_or_2_without_traceback(text):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.yaml"
        path.write_text(text, encoding="utf-8" if text.isascii() else "latin-1", errors="replace")
        args = ["ab", "--config", str(path), *FIXED_ARGS]
        for s in [*FAST, "prompts.meta=builtin:seed-tts-en"]:
            args += ["--set", s]
        check(args, Path(tmp) / "runs")


def alias_text(levels: int, width: int, section: str, flow: bool) -> str:
    """Anchors and aliases, `levels` deep and `width` wide ("billion laughs" at 9 x 10), under a
    section (`http.extra_body`, `stages.talker.extra`, ...) as block or flow YAML."""
    items = ["a0: &a0 [lol, 1]"] + [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]"
                                     for i in range(1, levels + 1)]
    body = "{" + ", ".join(items) + "}"
    if not flow:
        body = "\n".join(items)
    for part in reversed(section.split(".") if section else []):
        body = f"{{{part}: {body}}}" if flow else f"{part}:\n" + "\n".join("  " + line for line in body.splitlines())
    return body + "\n"


ALIAS_SECTIONS = ["", "http.extra_body", "stages.talker.extra", "bench", "synthetic"]
alias_docs = st.builds(alias_text, st.integers(0, 9), st.integers(1, 10), st.sampled_from(ALIAS_SECTIONS),
                       st.booleans())


@settings(max_examples=30, **SETTINGS)
@given(alias_docs)
def test_any_yaml_alias_structure_in_a_config_file_exits_0_or_2_quickly(text):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "aliases.yaml"
        path.write_text(text, encoding="utf-8")
        args = ["ab", "--config", str(path), *FIXED_ARGS]
        for s in [*FAST, "prompts.meta=builtin:seed-tts-en"]:
            args += ["--set", s]
        started = time.process_time()  # CPU seconds: a loaded machine does not stretch them
        check(args, Path(tmp) / "runs")
        assert time.process_time() - started < 20, text[:200]  # a bomb never gets to expand


@settings(max_examples=30, **SETTINGS)
@given(st.sampled_from(["http.extra_body", "stages.talker.extra", "talker.extra", "bench.tiers", "bench",
                        "synthetic", "prompts.meta"]),
       st.integers(0, 9), st.integers(1, 10))
def test_any_set_value_with_aliases_exits_0_or_2_quickly(key, levels, width):
    with tempfile.TemporaryDirectory() as tmp:
        args = ["ab", "--config", "configs/ab/synthetic.yaml", *FIXED_ARGS,
                "--set", f"{key}={alias_text(levels, width, '', flow=True).strip()}"]
        for s in [*FAST, "prompts.meta=builtin:seed-tts-en"]:
            args += ["--set", s]
        started = time.process_time()  # CPU seconds: a loaded machine does not stretch them
        check(args, Path(tmp) / "runs")
        assert time.process_time() - started < 20, (key, levels, width)


meta_fields = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
meta_lines = st.one_of(
    st.lists(meta_fields, min_size=1, max_size=6).map("|".join),
    st.tuples(st.text(string.ascii_letters, min_size=1, max_size=5), meta_fields,
              st.sampled_from(["", "ref.wav", "missing.wav"]),
              st.text(max_size=20)).map("|".join),
)


@settings(max_examples=40, **SETTINGS)
@given(st.lists(meta_lines, min_size=0, max_size=5), st.booleans(), st.booleans(),
       st.sampled_from(["ab", "wer"]))
def test_any_meta_lst_exits_0_or_2_without_traceback(lines, bom, latin1, command):
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "ref.wav").write_bytes(b"RIFF")
        text = "\n".join(lines) + "\n"
        data = text.encode("latin-1", errors="replace") if latin1 else text.encode("utf-8")
        meta = Path(tmp) / "meta.lst"
        meta.write_bytes((b"\xef\xbb\xbf" if bom else b"") + data)
        sets = [*FAST, f"prompts.meta={json.dumps(str(meta))}"]
        if command == "ab":
            args = ["ab", "--config", "configs/ab/synthetic.yaml", *FIXED_ARGS]
        else:  # phase 1 only, on the synthetic backend: the meta.lst and prompt wav checks
            args = ["wer", "--config", "configs/wer/seed-tts-en.yaml", "--generate-only", "--arms", "base",
                    "--num-prompts", "2", "--set", f"wer.history_dir={json.dumps(str(Path(tmp) / 'h'))}"]
        for s in sets:
            args += ["--set", s]
        check(args, Path(tmp) / "runs")


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**80), 2**80), st.floats(allow_nan=False),
              st.text(max_size=30)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=6,
)
speech_bodies = st.fixed_dictionaries(
    {},
    optional={"input": st.one_of(st.text(max_size=40), st.just("word " * 300), json_values),
              "seed": st.one_of(st.integers(-(2**70), 2**70), json_values),
              "stream": st.one_of(st.booleans(), json_values),
              "response_format": st.one_of(st.sampled_from(["pcm", "wav", "mp3"]), json_values),
              "stream_format": st.one_of(st.sampled_from(["audio", "sse", "x"]), json_values),
              "model": st.one_of(st.just("minicpmo45"), json_values),
              "ref_text": json_values, "speed": json_values},
)


@pytest.fixture(scope="module")
def servers():
    """The synthetic backend and the embedded runner on fake engines (short max_seq_len)."""
    synth = load_config(ROOT / "configs/ab/synthetic.yaml", [
        "synthetic.chunk_seconds=0.1", "synthetic.seconds_per_word=0.1",
        "synthetic.first_chunk_delay_s=0", "synthetic.chunk_delay_s=0"])
    cfg = load_config(None, ["backend=embedded", "runner.device=cpu", "runner.torch_threads=1",
                             "runner.max_seq_len=512"])
    with running_server(synth, max_input_chars=1000) as a, \
            running_server(cfg, backend=EmbeddedBackend(cfg, factories=fake_factories())) as b:
        yield [a.url, b.url]


def post(url: str, body: bytes, content_type: str) -> tuple[int, bytes, str]:
    req = urllib.request.Request(url + "/v1/audio/speech", data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers.get("Content-Type", "")


@settings(max_examples=80, **SETTINGS)
@given(st.one_of(speech_bodies.map(lambda d: json.dumps(d).encode()),
                 json_values.map(lambda v: json.dumps(v).encode()),
                 st.binary(max_size=60)),
       st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain"]),
       st.integers(0, 1))
def test_any_request_body_gets_json_and_never_a_500(servers, body, content_type, which):
    status, payload, got_type = post(servers[which], body, content_type)
    event(f"status {status}")
    assert status in (200, 400, 404, 413, 415), (status, body[:200], payload[:300])
    if status != 200:
        assert got_type.startswith("application/json"), got_type
        assert set(json.loads(payload)["error"]) == {"message", "type", "param", "code"}


def test_the_fuzzed_servers_are_still_healthy(servers):
    for url in servers:
        with urllib.request.urlopen(url + "/health", timeout=10) as resp:
            assert json.load(resp) == {"status": "ok"}
