"""The stage YAMLs load through the strict loader and say what they claim (real vs tiny dims)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from stages.config import RunnerConfig, StageConfig
from tts_bench.config import load_config
from tts_bench.errors import ConfigError
from tts_bench.config.loader import load_dataclass, load_yaml_file

ROOT = Path(__file__).resolve().parents[2]
FULL = ROOT / "configs/stages/minicpmo45.yaml"
TINY = ROOT / "configs/stages/minicpmo45-tiny.yaml"


def load_stage(path: Path) -> StageConfig:
    return load_dataclass(StageConfig, load_yaml_file(path), source=str(path), base_dir=path.parent)


def without_extra(cfg):
    return dataclasses.replace(cfg, extra={})


def test_full_yaml_spells_out_exactly_the_real_defaults():
    full, real = load_stage(FULL), StageConfig()
    assert without_extra(full.talker) == real.talker
    assert without_extra(full.code2wav) == real.code2wav
    # Every flag it writes out is the default (and the file names every talker flag).
    from stages.code2wav.options import Code2WavOptions
    from stages.talker.options import KNOWN_KEYS, TalkerOptions

    assert TalkerOptions.from_extra(full.talker.extra) == TalkerOptions()
    assert set(full.talker.extra) == KNOWN_KEYS
    assert Code2WavOptions.from_extra(full.code2wav.extra, env={}) == Code2WavOptions()


def test_tiny_yaml_shrinks_widths_but_keeps_vocab_ids_chunking_steps_and_rates():
    tiny, real = load_stage(TINY), StageConfig()
    assert tiny.talker.hidden_size < real.talker.hidden_size
    assert tiny.talker.num_layers < real.talker.num_layers
    assert tiny.code2wav.dit.depth < real.code2wav.dit.depth
    for name in ("num_text_tokens", "num_audio_tokens", "audio_bos_token_id",
                 "text_eos_token_id", "eos_token_id", "sampling", "length"):
        assert getattr(tiny.talker, name) == getattr(real.talker, name), name
    c, r = tiny.code2wav, real.code2wav
    for name in ("codec_chunk_frames", "codec_left_context_frames", "silence_code",
                 "n_timesteps", "cfg_rate", "token_rate_hz", "mel_rate_hz", "sample_rate"):
        assert getattr(c, name) == getattr(r, name), name
    assert c.flow.vocab_size == r.flow.vocab_size
    assert c.hift.samples_per_frame == r.hift.samples_per_frame


def test_a_bench_config_includes_a_stage_yaml(tmp_path):
    bench = tmp_path / "arm.yaml"
    bench.write_text(f"backend: embedded\nstages: {TINY}\n")
    cfg = load_config(bench, ["runner.max_num_seqs=4"])
    assert cfg.stages.talker.hidden_size == 64
    assert cfg.stages.runner.max_num_seqs == 4


def test_an_unknown_runner_key_is_rejected_with_the_nearest_name(tmp_path):
    bad = tmp_path / "stage.yaml"
    bad.write_text("runner:\n  max_num_seq: 4\n")
    with pytest.raises(ConfigError, match="max_num_seqs"):
        load_stage(bad)


def test_runner_config_validates_its_fields():
    with pytest.raises(ValueError, match="max_num_seqs"):
        RunnerConfig(max_num_seqs=0)
    with pytest.raises(ValueError, match="max_seq_len"):
        RunnerConfig(max_seq_len=0)


def test_replicas_per_process_needs_the_processes_execution_and_a_count_of_one_or_more():
    assert RunnerConfig(replicas_per_process=2).replicas_per_process == 2  # auto resolves to processes
    assert RunnerConfig(execution="processes", replicas_per_process=4).replicas_per_process == 4
    for execution in ("threads", "single"):
        with pytest.raises(ValueError, match="needs runner.execution: processes.*replicas_per_process=1"):
            RunnerConfig(execution=execution, replicas_per_process=2)
    with pytest.raises(ValueError, match="replicas_per_process must be >= 1"):
        RunnerConfig(replicas_per_process=0)
