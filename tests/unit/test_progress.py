"""Progress on stderr: lines every N seconds off a terminal (done, left, ETA), a rich bar on one,
nothing without an open reporter; the long commands report through it."""

from __future__ import annotations

import io
import re
from pathlib import Path

from typer.testing import CliRunner

from tts_bench.report import progress
from tts_bench.cli import app

ROOT = Path(__file__).resolve().parents[2]
SYNTH = ["--config", str(ROOT / "configs/ab/synthetic.yaml"), "--set", "synthetic.chunk_delay_s=0.001",
         "--set", "synthetic.first_chunk_delay_s=0.001", "--set", "bench.warmup=0"]
LINE = re.compile(r"^progress: (\w+) (.+): (\d+)/(\d+) done, (\d+) left, ETA (.+) \(elapsed (.+)\)$")


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_off_a_terminal_a_line_every_interval_says_done_left_and_eta():
    out, clock = io.StringIO(), _Clock()
    reporter = progress._Reporter("wer", stream=out, interval_s=10, clock=clock)
    reporter.task("generate base", total=8)
    for _ in range(4):
        clock.now += 3  # 3 s a request
        reporter.advance()
    lines = out.getvalue().splitlines()
    assert lines == ["progress: wer generate base: 4/8 done, 4 left, ETA 12 s (elapsed 12 s)"]


def test_module_functions_do_nothing_without_a_reporter_and_report_inside_one(monkeypatch):
    progress.task("x", 3)
    progress.advance()  # no reporter: nothing, no error
    assert progress.current() is None
    monkeypatch.setenv("TTS_BENCH_PROGRESS_S", "0")
    out = io.StringIO()
    with progress.reporting("mem", stream=out, tty=False):
        progress.task("base 2x1", 2)
        progress.advance()
        progress.current().advance()
    assert [LINE.match(x).group(3, 4) for x in out.getvalue().splitlines()] == [("1", "2"), ("2", "2")]
    assert progress.current() is None


def test_on_a_terminal_a_rich_bar_is_drawn():
    out = io.StringIO()
    with progress.reporting("ab", stream=out, tty=True):
        progress.task("2x1 base r0", 2)
        progress.advance()
        progress.advance()
    assert "ab 2x1 base r0" in out.getvalue() and "2/2" in out.getvalue()


def _stderr_lines(args: list[str], tmp_path: Path) -> list[re.Match]:
    result = CliRunner().invoke(app, [*args, "--result-dir", str(tmp_path)],
                                env={"TTS_BENCH_PROGRESS_S": "0", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return [m for m in map(LINE.match, result.stderr.splitlines()) if m]


def test_ab_and_mem_report_progress_per_request_off_a_terminal(tmp_path):
    ab = _stderr_lines(["ab", *SYNTH, "--tiers", "2x1", "--num-prompts", "4", "--repeats", "1"], tmp_path)
    assert {m.group(1) for m in ab} == {"ab"} and len(ab) == 8  # 4 requests x 2 arms
    assert ab[-1].group(3, 4, 5) == ("4", "4", "0")
    mem = _stderr_lines(["mem", *SYNTH, "--sampler", "rss", "--interval", "0.05", "--tier", "2x1",
                         "--warm-tier", "none", "--num-prompts", "4"], tmp_path)
    assert {m.group(2) for m in mem} == {"base 2x1", "test 2x1"} and mem[-1].group(3, 5) == ("4", "0")


def test_a_duration_phase_without_a_count_reports_what_is_done_instead_of_failing():
    out, clock = io.StringIO(), _Clock()
    reporter = progress._Reporter("ab", stream=out, interval_s=10, clock=clock)
    reporter.task("2x1 base r0", total=None)  # what run_ab starts for a duration-mode phase
    for _ in range(4):
        clock.now += 3
        reporter.advance()
    assert out.getvalue().splitlines() == ["progress: ab 2x1 base r0: 4 done, until the window ends (elapsed 12 s)"]


def test_the_eta_counts_from_the_first_finished_request_not_from_the_tasks_start():
    """A phase spends its first 30 s starting a backend and running the first wave of a closed
    loop; then requests finish every 0.5 s. One finished: no rate yet. Then the ETA is the rate
    since the first finished, 0.5 s a request, not 31 left at 36 s a request (18 min)."""
    out, clock = io.StringIO(), _Clock()
    reporter = progress._Reporter("ab", stream=out, interval_s=0, clock=clock)
    reporter.task("32x1 base r0", total=32)
    clock.now = 36.0
    reporter.advance()
    for _ in range(3):
        clock.now += 0.5
        reporter.advance()
    etas = [LINE.match(x).group(6) for x in out.getvalue().splitlines()]
    assert etas == ["unknown", "15 s", "14 s", "14 s"]  # 30, 29, 28 left at 2 a second
