"""`--plot` and `tts-bench plot`: drawn for a real synthetic A/B (2 tiers x 2 repeats, about 2 s)
and a memory run; files checked for existence and size, figures through matplotlib's objects."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cli.in_process import invoke_app
from tests.cli.test_wer_cli import _wer, fake_world  # noqa: F401  (a fixture)
from tests.virtual_clock import on_virtual_time
from tts_bench.cli import app
from tts_bench.errors import ExitStatus
from tts_bench.report.plots import plot_run, pyplot, run_figures
from tts_bench.rundir.results import RunDir

ROOT = Path(__file__).resolve().parents[2]
SYNTH = str(ROOT / "configs/ab/synthetic.yaml")
AB_PNGS = ("ecdf_audio_rtf.png", "ecdf_audio_ttfp_ms.png", "block_deltas_audio_rtf.png",
           "block_deltas_audio_ttfp_ms.png", "throughput.png")


@pytest.fixture(scope="module")
def ab_run(tmp_path_factory) -> Path:
    """On virtual time (tests/virtual_clock.py): the 1.5x arm reads "slower" on any machine
    load (a loaded box made it "within noise")."""
    out = tmp_path_factory.mktemp("plots")
    with on_virtual_time():
        result, status = invoke_app(app, "ab", "--config", SYNTH, "--tiers", "4x1,8x2", "--num-prompts", "8",
                                    "--repeats", "2", "--format", "md", "--result-dir", str(out), "--plot",
                                    "--test-set", "synthetic.delay_scale=1.5")
    assert status == ExitStatus.OK, result.output
    return Path(re.search(r"^run: (.+)$", result.stdout, re.M).group(1))


def test_ab_plot_writes_every_png_and_a_self_contained_report(ab_run):
    for name in AB_PNGS:
        assert (ab_run / name).stat().st_size > 1000, name
    html = (ab_run / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(AB_PNGS)
    assert "src='http" not in html and "4x1 audio_rtf: slower" in html


def test_figures_have_a_panel_per_tier_and_a_line_per_arm(ab_run):
    run = RunDir.open(ab_run)
    figures = run_figures(run.doc, run.read_requests())
    try:
        assert set(figures) == set(AB_PNGS)
        rtf = figures["ecdf_audio_rtf.png"].axes
        assert [ax.get_title() for ax in rtf] == ["audio RTF (lower is faster), tier 4x1",
                                                  "audio RTF (lower is faster), tier 8x2"]
        assert all(len(ax.get_lines()) == 2 for ax in rtf)  # base, test
        assert rtf[0].get_ylabel() == "fraction of requests <= x"
        assert [line.get_label() for line in rtf[0].get_lines()] == ["base (n=16)", "test (n=16)"]
        deltas = figures["block_deltas_audio_rtf.png"].axes
        assert deltas[0].get_title() == "audio RTF per-block Δ, tier 4x1: slower"
        points = deltas[0].get_lines()[0]
        assert len(points.get_xdata()) == 2 and all(y > 20 for y in points.get_ydata())  # 1.5x delays
        labels = [line.get_label() for line in deltas[0].get_lines()]
        assert any(lab.startswith("±MDE") for lab in labels) and any(lab.startswith("Δ mean +") for lab in labels)
        assert len(deltas[0].patches) == 1  # the 95% interval band
        ttfp = figures["block_deltas_audio_ttfp_ms.png"].axes
        assert ttfp[1].get_title().startswith("audio TTFP per-block Δ, tier 8x2: ")
        assert len(ttfp[1].get_lines()[0].get_xdata()) == 2
        tput = figures["throughput.png"].axes
        assert tput[1].get_ylabel() == "audio s per wall s" and len(tput[1].get_lines()) == 4  # 2 arms x 2 repeats
    finally:
        for fig in figures.values():
            pyplot().close(fig)


def test_plot_command_redraws_an_old_run(ab_run):
    for name in (*AB_PNGS, "report.html"):
        (ab_run / name).unlink()
    result, status = invoke_app(app, "plot", str(ab_run))
    assert status == ExitStatus.OK, result.output
    assert result.stdout.strip() == str(ab_run / "report.html")
    assert all((ab_run / name).stat().st_size > 1000 for name in AB_PNGS)


def test_mem_plot_reuses_its_timeline_in_the_report(tmp_path):
    result, status = invoke_app(app, "mem", "--config", SYNTH, "--tier", "4x1", "--warm-tier", "none",
                                "--interval", "0.1", "--sampler", "rss", "--num-prompts", "8",
                                "--result-dir", str(tmp_path), "--format", "md", "--plot")
    assert status == ExitStatus.OK, result.output
    run = next(tmp_path.iterdir())
    timelines = sorted(run.glob("mem_timeline*.png"))
    assert timelines
    plots = plot_run(run)
    assert plots.pngs[-len(timelines):] == timelines
    assert "mem_timeline_4x1_rss" in plots.html.read_text()


def test_plot_of_a_directory_that_is_no_run_exits_2(tmp_path):
    from tts_bench.errors import ConfigError

    with pytest.raises(ConfigError, match="not a run directory"):
        plot_run(tmp_path / "missing")


def test_wer_plot_draws_its_generation_requests(fake_world):
    tmp_path, cfg = fake_world
    result = _wer(["--config", str(cfg), "--plot"], tmp_path)
    assert result.return_value == ExitStatus.OK, result.output
    run = next((tmp_path / "runs").iterdir())
    assert (run / "report.html").stat().st_size > 1000
    assert (run / "ecdf_audio_rtf.png").stat().st_size > 1000


def test_the_command_line_loads_without_matplotlib():
    """Plots import matplotlib inside their functions: `tts-bench --help` and runs without --plot
    never pay for it."""
    import subprocess
    import sys

    code = "import sys, tts_bench.cli, tts_bench.report.plots, tts_bench.bisect; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"
