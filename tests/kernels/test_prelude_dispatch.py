"""Which prelude runs: the stage flag, the env opt-out, the platform check, and the latch.

The latch is process-global state in stages.talker.prelude; every test starts and ends with it
reset. Nothing here constructs a CUDA/NPU device; the CPU cases that reach the fused path need
triton (skipped with a reason without it) and run the kernel in the interpreter.
"""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from prelude_inputs import assert_bitwise_equal, random_inputs

from stages.flags import FlagError
from stages.talker import prelude
from stages.talker.prelude import (
    penalty_temperature_eager,
    penalty_temperature_fused,
    select_prelude,
)

ROOT = Path(__file__).resolve().parents[2]
# The inputs hold +-3e38 on purpose; the interpreter (numpy) reports the IEEE overflow to inf
# that both paths produce. Triton 3.9 also nags about its fp-fusion default (no fusable ops here).
pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION:UserWarning"),
]


@pytest.fixture(autouse=True)
def _fresh_latch():
    prelude._reset_latch_for_tests()
    yield
    prelude._reset_latch_for_tests()


@pytest.fixture
def interpreter(monkeypatch):
    pytest.importorskip("triton", reason="the fused prelude needs triton (extra: triton)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def eager_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "eager" in r.getMessage()]


def test_flag_false_selects_eager(interpreter, caplog):
    caplog.set_level(logging.INFO, logger=prelude.__name__)
    assert select_prelude(fused=False, device=torch.device("cpu")) is penalty_temperature_eager
    assert any("talker_codec_fused_prelude is false" in m for m in eager_lines(caplog))


def test_env_opt_out_selects_eager(interpreter, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=prelude.__name__)
    monkeypatch.setattr(prelude, "_ENV_OPT_OUT", True)
    assert select_prelude(fused=True, device=torch.device("cpu")) is penalty_temperature_eager
    assert any("TALKER_CODEC_FUSED_PRELUDE" in m for m in eager_lines(caplog))


def _fresh_prelude_module():
    """A private copy of stages/talker/prelude.py, imported now (reads the env now)."""
    spec = importlib.util.spec_from_file_location(
        "prelude_env_probe", ROOT / "stages" / "talker" / "prelude.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("value", ["0", " false ", "FALSE"])
def test_env_opt_out_is_read_at_import(interpreter, monkeypatch, value):
    monkeypatch.setenv("TALKER_CODEC_FUSED_PRELUDE", value)
    probe = _fresh_prelude_module()
    cpu = torch.device("cpu")
    assert probe._ENV_OPT_OUT is True
    assert probe.select_prelude(fused=True, device=cpu) is probe.penalty_temperature_eager
    # Read once: changing the variable after import does not change the decision.
    monkeypatch.setenv("TALKER_CODEC_FUSED_PRELUDE", "1")
    assert probe.select_prelude(fused=True, device=cpu) is probe.penalty_temperature_eager


def test_env_unset_or_true_keeps_fused(interpreter, monkeypatch):
    for value in (None, "1", "true"):
        if value is None:
            monkeypatch.delenv("TALKER_CODEC_FUSED_PRELUDE", raising=False)
        else:
            monkeypatch.setenv("TALKER_CODEC_FUSED_PRELUDE", value)
        probe = _fresh_prelude_module()
        fn = probe.select_prelude(fused=True, device=torch.device("cpu"))
        assert fn is probe.penalty_temperature_fused


def test_env_typo_raises_at_import(monkeypatch):
    monkeypatch.setenv("TALKER_CODEC_FUSED_PRELUDE", "ture")
    with pytest.raises(FlagError, match="TALKER_CODEC_FUSED_PRELUDE"):
        _fresh_prelude_module()


def test_cpu_without_interpreter_selects_eager_and_logs_once(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=prelude.__name__)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert select_prelude(fused=True, device=torch.device("cpu")) is penalty_temperature_eager
    assert select_prelude(fused=True, device=torch.device("cpu")) is penalty_temperature_eager
    lines = [m for m in eager_lines(caplog) if "TRITON_INTERPRET" in m]
    assert len(lines) == 1


def test_device_without_triton_backend_selects_eager():
    assert select_prelude(fused=True, device=torch.device("meta")) is penalty_temperature_eager


def test_platform_override_decides_triton_for_the_prelude(interpreter, caplog):
    from stages.platform import platform_override

    caplog.set_level(logging.INFO, logger=prelude.__name__)
    with platform_override(triton=False):  # the interpreter is on, but the platform says no
        assert select_prelude(fused=True, device=torch.device("cpu")) is penalty_temperature_eager
    assert any("platform_override" in m for m in eager_lines(caplog))
    assert select_prelude(fused=True, device=torch.device("cpu")) is penalty_temperature_fused


def test_cpu_under_interpreter_selects_fused_and_matches_eager(interpreter):
    fn = select_prelude(fused=True, device=torch.device("cpu"))
    assert fn is penalty_temperature_fused
    case = random_inputs(2, seed=3)
    assert_bitwise_equal(fn(*case.args()), penalty_temperature_eager(*case.args()))
    assert prelude._latch_tripped is False


@pytest.mark.gpu
def test_cuda_selects_fused():
    pytest.importorskip("triton")
    assert select_prelude(fused=True, device=torch.device("cuda")) is penalty_temperature_fused


def test_launch_failure_latches_once_and_never_retries(interpreter, monkeypatch, caplog):
    from stages.talker import prelude_triton

    calls = []

    def broken_launch(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("simulated launch failure")

    monkeypatch.setattr(prelude_triton, "rep_pen_temp", broken_launch)
    caplog.set_level(logging.WARNING, logger=prelude.__name__)
    fn = select_prelude(fused=True, device=torch.device("cpu"))
    assert fn is penalty_temperature_fused
    for seed in range(3):
        case = random_inputs(2, seed=seed)
        assert_bitwise_equal(fn(*case.args()), penalty_temperature_eager(*case.args()))
    assert len(calls) == 1  # no per-call retry
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "simulated launch failure" in warnings[0].getMessage()
    # Later constructions also get eager without trying the kernel.
    assert select_prelude(fused=True, device=torch.device("cpu")) is penalty_temperature_eager
    assert len(calls) == 1


def test_latched_fallback_still_fills_out_buffer(interpreter, monkeypatch):
    from stages.talker import prelude_triton

    monkeypatch.setattr(prelude_triton, "rep_pen_temp", _raise)
    case = random_inputs(2, seed=5)
    out = torch.full_like(case.logits, float("nan"))
    returned = penalty_temperature_fused(*case.args(), out=out)
    assert returned is out
    assert_bitwise_equal(out, penalty_temperature_eager(*case.args()))


def _raise(*args, **kwargs):
    raise RuntimeError("boom")


def test_real_kernel_error_trips_the_latch(interpreter, caplog):
    """No monkeypatch: a pow table of the wrong width makes the real wrapper raise (eager
    still works with it: gather never reads the extra column)."""
    caplog.set_level(logging.WARNING, logger=prelude.__name__)
    case = random_inputs(2, seed=9)
    bad_table = torch.cat([case.pow_table, torch.ones(2, 1)], dim=1)
    args = (case.logits, case.history, case.history_len, bad_table, case.temperature)
    penalty_temperature_fused(*args)
    assert prelude._latch_tripped is True
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_importing_prelude_imports_no_triton_and_touches_no_device():
    code = (
        "import sys, torch\n"
        "import stages.talker.prelude\n"
        "assert 'triton' not in sys.modules, 'triton imported at import time'\n"
        "assert 'stages.talker.prelude_triton' not in sys.modules\n"
        "assert not torch.cuda.is_initialized()\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
