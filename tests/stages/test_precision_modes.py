"""Precision modes say what runs in what: each code2wav TF32 mode sets both of torch's TF32 flags
(cuBLAS matmuls and cuDNN convolutions) in its regions and restores them; threads of one process
never see each other's flags; the run record's precision is read off torch's live flags.

On the CPU nothing runs in TF32, so these tests force the platform's CUDA answer
(`platform_override(cuda=True)`: no device is created) and read torch's flags, which exist on a
CPU build too."""

from __future__ import annotations

import threading

import pytest
import torch

from stages.code2wav.options import Code2WavOptions, resolve_tf32_mode
from stages.flags import FlagError
from stages.platform import FP32, Tf32Flags, platform_override, precision_scope, strict_fp32_baseline
from stages.precision import FIDELITY, LOSSY_BELOW_DB, TALKER_TF32, code2wav_precision, fidelity, region_scope

CPU = torch.device("cpu")
T, F = True, False
# (matmul, cudnn) in the flow and in HiFT, per mode: what docs/runner.md's precision table says.
EXPECTED = {
    "off": ((F, F), (F, F)),
    "conv": ((F, T), (F, T)),
    "flow": ((T, T), (F, T)),
    "all": ((T, T), (T, T)),
}


def _flags() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


@pytest.fixture
def torch_defaults():
    """torch's own defaults (TF32 matmuls off, TF32 cuDNN convolutions on), restored after."""
    before = _flags()
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, True
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.fixture
def on_cuda(torch_defaults):
    with platform_override(cuda=True):
        yield


def test_off_runs_no_tf32_anywhere_cudnn_convolutions_included(on_cuda):
    for region in ("flow", "hift"):
        with region_scope("off", CPU, region=region):
            assert _flags() == (False, False)
    assert _flags() == (False, True)  # torch's defaults again after the scopes


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_each_mode_sets_its_row_in_each_region_and_restores_it(on_cuda, mode):
    flow, hift = EXPECTED[mode]
    with region_scope(mode, CPU, region="flow"):
        assert _flags() == flow
    with region_scope(mode, CPU, region="hift"):
        assert _flags() == hift
    assert _flags() == (False, True)


def test_conv_mode_is_parsed_by_the_strict_parser():
    assert resolve_tf32_mode({"token2wav_allow_tf32": " CONV "}, {}) == "conv"
    assert resolve_tf32_mode({"token2wav_allow_tf32": "cudnn"}, {}) == "conv"
    assert Code2WavOptions.from_extra({}, {}).tf32_mode == "off"  # the default: no TF32
    with pytest.raises(FlagError, match="off/conv/flow/all"):
        resolve_tf32_mode({"token2wav_allow_tf32": "convs"}, {})


def test_scopes_change_nothing_off_cuda(torch_defaults):
    with region_scope("all", CPU, region="flow"):
        assert _flags() == (False, True)


def test_a_scope_that_wants_other_flags_waits_until_the_holders_leave(on_cuda):
    # The talker (fp32) beside a replica thread running code2wav's "all" flow region, as with
    # runner.execution: single: the talker's launches must never run under the replica's TF32.
    held, release, seen = threading.Event(), threading.Event(), {}

    def replica():
        with region_scope("all", CPU, region="flow"):
            held.set()
            release.wait(5)
            seen["replica"] = _flags()

    def talker():
        with precision_scope(CPU, TALKER_TF32):
            seen["talker"] = _flags()

    r = threading.Thread(target=replica)
    r.start()
    assert held.wait(5)
    t = threading.Thread(target=talker)
    t.start()
    t.join(0.2)
    assert t.is_alive() and "talker" not in seen  # it waits while the replica holds TF32
    release.set()
    r.join(5)
    t.join(5)
    assert seen == {"replica": (True, True), "talker": (False, False)}
    assert _flags() == (False, True)


def test_scopes_that_want_the_same_flags_run_side_by_side(on_cuda):
    both_in = threading.Barrier(2, timeout=5)

    def replica():
        with region_scope("off", CPU, region="flow"):
            both_in.wait()  # breaks (raises) if one waited for the other to leave

    threads = [threading.Thread(target=replica) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert not both_in.broken
    assert _flags() == (False, True)


def test_a_nested_scope_asking_other_flags_is_refused(on_cuda):
    with region_scope("off", CPU, region="flow"):
        with region_scope("off", CPU, region="hift"):  # the same flags: fine
            pass
        with pytest.raises(RuntimeError, match="TF32 scope"):
            with precision_scope(CPU, Tf32Flags(matmul=True, cudnn=True)):
                pass
    assert _flags() == (False, True)


def test_the_stage_process_baseline_turns_cudnn_tf32_off(torch_defaults):
    strict_fp32_baseline()
    assert _flags() == (False, False)


def test_describe_reads_the_live_flags_inside_the_regions(on_cuda, monkeypatch):
    class Estimator:
        gemm_kernel, attention_kernel = "tf32x3", "triton<=4"

    conv = Code2WavOptions.from_extra({"token2wav_allow_tf32": "conv"}, {})
    facts = code2wav_precision(CPU, conv, Estimator())
    assert facts["flow"] == facts["hift"] == {"cudnn_conv": "tf32", "matmul": "fp32"}
    assert facts["dit_gemm"] == "fp32 (Triton 3xTF32)"
    assert facts["fidelity"]["mel_snr_db"] == 72 and facts["fidelity"]["lossy"] is False
    # Flags that do not move (a scope that failed to set them) are what the record says.
    monkeypatch.setattr("stages.platform.precision._write", lambda flags: None)
    off = Code2WavOptions.from_extra({}, {})
    assert code2wav_precision(CPU, off, Estimator())["flow"]["cudnn_conv"] == "tf32"  # torch's default
    all_mode = Code2WavOptions.from_extra({"token2wav_allow_tf32": "all"}, {})
    assert code2wav_precision(CPU, all_mode, Estimator())["hift"]["matmul"] == "fp32"


def test_fidelity_labels_come_from_the_one_table():
    for row in FIDELITY.values():
        assert row.lossy is (row.mel_snr_db < LOSSY_BELOW_DB)
    with platform_override(cuda=True):
        assert fidelity(CPU, "conv", "bfloat16")["lossy"] is True  # 21 dB
        assert fidelity(CPU, "flow", "float32")["lossy"] is False  # 66 dB
        assert fidelity(CPU, "off", "float32")["mel_snr_db"] == 106
        assert fidelity(CPU, "all", "bfloat16")["lossy"] is True  # not measured; bf16 DiT
    assert fidelity(CPU, "all", "float32")["mel_snr_db"] == 107  # the CPU runs no TF32


def test_a_tiny_token2wav_on_the_cpu_reports_fp32_everywhere():
    from stages.code2wav.token2wav import Token2Wav
    from tests.stages.code2wav_tiny import tiny_config

    t2w = Token2Wav(tiny_config(), device=CPU, dtype=torch.float32, init_seed=0)
    facts = t2w.describe()["precision"]
    assert facts["flow"] == facts["hift"] == {"cudnn_conv": "fp32", "matmul": "fp32"}
    assert facts["fidelity"]["lossy"] is False
    assert FP32 == Tf32Flags(False, False)


def test_the_talker_reports_its_precision_from_the_live_flags(torch_defaults, monkeypatch):
    from tests.stages.test_talker_engine import engine

    eng = engine(max_batch=2, max_seq_len=64)
    assert eng.describe()["precision"] == {"matmul": "fp32", "attention": "sdpa float32",
                                           "triton": "elementwise, fp32 math"}
    with platform_override(cuda=True):
        monkeypatch.setattr("stages.precision.TALKER_TF32", Tf32Flags(matmul=True, cudnn=False))
        assert eng.describe()["precision"]["matmul"] == "tf32"  # what the scope set, not a name


def test_a_voice_setup_runs_under_the_flow_flags_not_whatever_another_thread_holds(torch_defaults, monkeypatch):
    from stages.code2wav.prompt import prompt_id_of
    from stages.code2wav.streaming import Chunker
    from stages.code2wav.token2wav import Token2Wav
    from tests.stages.code2wav_tiny import tiny_config
    from tests.stages.test_token2wav import _voice

    t2w = Token2Wav(tiny_config(extra={"token2wav_allow_tf32": "flow"}), device=CPU, dtype=torch.float32, init_seed=0)
    seen = []
    build = t2w._prompts.build_bytes
    monkeypatch.setattr(t2w._prompts, "build_bytes", lambda data: seen.append(_flags()) or build(data))
    monkeypatch.setattr("stages.platform.precision.is_cuda", lambda device: True)  # the scopes act
    audio = _voice("ref_0.wav")
    t2w.prepare(Chunker(t2w.cfg, "r", prompt_id_of(audio), seed=1, prompt_audio=audio).push(list(range(30)))[0])
    assert seen == [(True, True)]  # the speaker embedding and prompt mel under "flow"'s flow flags
    assert _flags() == (False, True)


def test_the_talker_launches_its_step_under_its_own_flags(torch_defaults, monkeypatch):
    from stages.talker.engine import TalkerRequest
    from tests.stages.test_talker_engine import engine

    eng = engine(max_batch=2, max_seq_len=64)
    seen = []
    logits = eng._logits
    monkeypatch.setattr(eng, "_logits", lambda rows: seen.append(_flags()) or logits(rows))
    monkeypatch.setattr("stages.platform.precision.is_cuda", lambda device: True)  # the scopes act
    torch.backends.cuda.matmul.allow_tf32 = True  # as code2wav's "all" left it before scopes restored
    eng.add(TalkerRequest("r", "one two three", max_codes=3))
    eng.step()
    assert seen == [(False, False)]
    assert _flags() == (True, True)  # restored: the flags the process held before the step


def test_the_ready_line_says_the_mode_its_fidelity_and_what_tf32_does_to_identity(on_cuda):
    from stages.precision import ready_phrase

    class Estimator:
        gemm_kernel, attention_kernel = "torch", "sdpa"

    def facts(mode, dtype="float32"):
        options = Code2WavOptions.from_extra({"token2wav_allow_tf32": mode, "code2wav_dit_dtype": dtype}, {})
        return {"tf32_mode": mode, "precision": code2wav_precision(CPU, options, Estimator())}

    assert ready_phrase(facts("off"), deterministic=True) == (
        "code2wav TF32 off (106 dB mel SNR against the official fp32 decoder), deterministic kernels on")
    assert "72 dB" in ready_phrase(facts("conv"), deterministic=True)
    assert "identical requests are not promised" in ready_phrase(facts("conv"), deterministic=True)
    assert "identical requests" not in ready_phrase(facts("conv"), deterministic=False)
    assert ", lossy)" in ready_phrase(facts("conv", "bfloat16"), deterministic=False)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_a_cuda_token2wav_reports_each_modes_flags(mode):
    from stages.code2wav.token2wav import Token2Wav
    from tests.stages.code2wav_tiny import tiny_config

    cfg = tiny_config(extra={"token2wav_allow_tf32": mode, "code2wav_device_graph": False})
    facts = Token2Wav(cfg, device=torch.device("cuda"), dtype=torch.float32, init_seed=0).describe()["precision"]
    words = {True: "tf32", False: "fp32"}
    for region, (matmul, cudnn) in zip(("flow", "hift"), EXPECTED[mode]):
        assert facts[region] == {"cudnn_conv": words[cudnn], "matmul": words[matmul]}
