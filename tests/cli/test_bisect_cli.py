"""`tts-bench bisect` on a git repository built here: five commits of a synthetic bench config,
the third of which makes the backend 10% slower (delay_scale 1.1). Each step serves both
commits with `tts-bench serve` and A/Bs them over HTTP (50 ms per 0.25 s chunk: RTF 0.2, so a
10% slowdown is 5 ms a chunk, resolved in 2-4 blocks on a loaded 2-core CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.in_process import invoke_app
from tts_bench.bisect import decide
from tts_bench.cli import app
from tts_bench.errors import ExitStatus

BENCH = ("backend: synthetic\n"
         "synthetic: {{chunk_seconds: 0.25, first_chunk_delay_s: 0.05, chunk_delay_s: 0.05, seconds_per_word: 0.25, "
         "sample_rate: 24000, delay_scale: {scale}}}\n"
         "bench: {{tiers: [4x1], num_prompts: 8, repeats: 2, warmup: 2, timeout_s: 30, min_effect_pct: 4}}\n")


# The end-to-end bisects serve every step with real `tts-bench serve` processes and decide on real
# timing: over a minute on 2 quiet cores, so they run in CI's second (slow) step.
SERVED = pytest.mark.slow


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> tuple[Path, list[str]]:
    """c1 base, c2 docs, c3 slower (delay_scale 1.1), c4, c5: their shas, oldest first."""
    path = tmp_path_factory.mktemp("bisect-repo")
    _git(path, "init", "-q")
    _git(path, "config", "user.email", "bench@example.com")
    _git(path, "config", "user.name", "bench")
    shas = []
    for name, scale, extra in (("c1 base", "1.0", None), ("c2 docs", "1.0", "notes.txt"), ("c3 slower", "1.1", None),
                               ("c4 docs", "1.1", "more.txt"), ("c5 docs", "1.1", "last.txt")):
        (path / "bench.yaml").write_text(BENCH.format(scale=scale))
        if extra:
            (path / extra).write_text(name)
        _git(path, "add", "-A")
        _git(path, "commit", "-qm", name)
        shas.append(_git(path, "rev-parse", "HEAD"))
    return path, shas


def bisect(repo: Path, out: Path, *args: str):
    return invoke_app(app, "bisect", "--repo", str(repo), "--config", "bench.yaml", "--tier", "4x1",
                      "--max-repeats", "6", "--result-dir", str(out), "--format", "md", *args)


@pytest.fixture(scope="module")
def found(repo, tmp_path_factory):
    path, shas = repo
    out = tmp_path_factory.mktemp("bisect-out")
    t0 = time.monotonic()
    result, status = bisect(path, out, "--good", shas[0], "--bad", shas[-1])
    return result, status, time.monotonic() - t0, next(out.iterdir())


@SERVED
def test_bisect_names_the_commit_that_made_the_backend_10pct_slower_in_under_3_minutes(repo, found):
    path, shas = repo
    result, status, elapsed, bisect_dir = found
    assert status == ExitStatus.OK, result.output
    assert elapsed < 180
    assert f"first bad commit: {shas[2]} 'c3 slower': slower: +" in result.stdout
    doc = json.loads((bisect_dir / "bisect.json").read_text())
    assert doc["status"] == "first bad commit" and doc["result"]["first_bad"] == shas[2]
    assert [(s["sha"], s["decision"]) for s in doc["steps"]] == [(shas[4], "bad"), (shas[2], "bad"), (shas[1], "good")]
    for step in doc["steps"]:  # a run directory per step, a complete ab run
        assert json.loads((Path(step["run_dir"]) / "run.json").read_text())["status"] == "complete"
        assert step["run_dir"] in result.stdout or Path(step["run_dir"]).name in result.stdout
    assert "| step | commit" in result.stdout


@SERVED
def test_bisect_leaves_the_users_checkout_and_worktree_list_alone(repo, found):
    path, shas = repo
    assert _git(path, "rev-parse", "HEAD") == shas[-1]
    assert _git(path, "status", "--porcelain") == ""
    assert len(_git(path, "worktree", "list").splitlines()) == 1


@SERVED
def test_resume_replays_decided_steps_and_finishes_the_cut_short_one(repo, found):
    path, shas = repo
    bisect_dir = found[3]
    doc = json.loads((bisect_dir / "bisect.json").read_text())
    first_runs = [s["run_dir"] for s in doc["steps"]]
    last = doc["steps"][-1]
    for key in ("decision", "verdict", "verdict_text", "delta_pct", "ci95_pct", "mde_pct", "blocks"):
        last.pop(key, None)
    doc.update(status="running", result=None)
    (bisect_dir / "bisect.json").write_text(json.dumps(doc))
    result, status = invoke_app(app, "bisect", "--resume", str(bisect_dir), "--format", "md")
    assert status == ExitStatus.OK, result.output
    again = json.loads((bisect_dir / "bisect.json").read_text())
    assert again["result"]["first_bad"] == shas[2]
    assert [s["run_dir"] for s in again["steps"]] == first_runs  # step 3's ab run resumed, not started over
    assert "bisect step 1" not in result.stderr and "bisect step 3" in result.stderr


@SERVED
def test_a_range_where_nothing_changed_reports_no_regression_resolved_with_the_mde(repo, tmp_path):
    """Served by a --setup command (here tts-bench serve spelled out, as another server's would be)."""
    path, shas = repo
    setup = f"{sys.executable} -m tts_bench.cli serve --config {{config}} --port {{port}} 2>&1 | cat"
    result, status = bisect(path, tmp_path, "--good", shas[2], "--bad", shas[4], "--max-repeats", "4",
                            "--setup", setup)
    assert status == ExitStatus.OK, result.output
    line = next(x for x in result.stdout.splitlines() if x.startswith("no regression resolved"))
    assert "MDE reached" in line and "% at " in line
    doc = json.loads(next(tmp_path.iterdir()).joinpath("bisect.json").read_text())
    assert doc["status"] == "no regression resolved" and len(doc["steps"]) == 1
    assert "listening on" in (next(tmp_path.iterdir()) / "servers" / "step1-test.log").read_text()


@pytest.mark.parametrize(("cmp", "expected"), [
    ({"verdict": "slower", "ci95_pct": [5.0, 15.0]}, "bad"),
    ({"verdict": "within noise", "ci95_pct": [-1.0, 1.5]}, "good"),
    ({"verdict": "faster", "ci95_pct": [-9.0, -3.0]}, "good"),
    ({"verdict": "within noise", "ci95_pct": [-1.0, 6.0]}, "unresolved"),  # a 4% slowdown not excluded
    ({"verdict": "within noise", "ci95_pct": [2.5, 3.5]}, "good"),  # significant, below the minimum effect
    ({"verdict": "unresolved (1 repeat)", "ci95_pct": None}, "unresolved"),
    ({"verdict": "invalid", "ci95_pct": [-1.0, 1.0]}, "unresolved"),
])
def test_a_step_is_bad_only_when_slower_and_good_only_when_the_interval_excludes_the_min_effect(cmp, expected):
    assert decide(cmp, 4.0) == expected


def test_throughput_decides_with_higher_is_better():
    assert decide({"verdict": "within noise", "ci95_pct": [-1.0, 2.0]}, 4.0, higher_is_better=True) == "good"
    assert decide({"verdict": "within noise", "ci95_pct": [-6.0, 2.0]}, 4.0, higher_is_better=True) == "unresolved"


def test_refs_that_are_not_an_ancestor_pair_exit_2(repo, tmp_path):
    path, shas = repo
    result, status = bisect(path, tmp_path, "--good", shas[3], "--bad", shas[1])
    assert status == ExitStatus.USAGE
    assert "is not an ancestor" in str(result.exception)


def test_resume_of_a_folder_that_is_no_bisect_exits_2(tmp_path):
    result, status = invoke_app(app, "bisect", "--resume", str(tmp_path))
    assert status == ExitStatus.USAGE and "is not a bisect directory" in str(result.exception)


def test_missing_refs_exit_2_naming_them(tmp_path):
    result, status = invoke_app(app, "bisect", "--config", "bench.yaml", "--result-dir", str(tmp_path))
    assert status == ExitStatus.USAGE and "--good, --bad, --tier missing" in str(result.exception)


def _canned(monkeypatch, deltas: dict[int, tuple[str, list[float] | None]]):
    """Replace each step's A/B by a canned result: position -> (verdict, interval)."""
    from tts_bench.bisect import search

    def fake_ab(run, step, good_tree, tree):
        verdict, ci = deltas[step["position"]]
        return {"valid": True, "tiers": [{"tier": "4x1", "verdict": verdict, "verdict_detail": verdict,
                                          "delta_mean_pct": 0.0 if ci is None else sum(ci) / 2, "ci95_pct": ci,
                                          "mde_pct": 3.0, "blocks": 6}]}

    monkeypatch.setattr(search, "_ab", fake_ab)


def test_an_unresolved_middle_step_stops_and_names_the_commits_left(repo, tmp_path, monkeypatch):
    path, shas = repo
    _canned(monkeypatch, {4: ("slower", [8.0, 12.0]), 2: ("within noise", [-1.0, 6.0])})
    result, status = bisect(path, tmp_path, "--good", shas[0], "--bad", shas[4])
    assert status == ExitStatus.OK, result.output
    line = next(x for x in result.stdout.splitlines() if x.startswith("unresolved"))
    assert f"the first bad commit is one of: {shas[1][:10]}, {shas[2][:10]}" in line
    doc = json.loads(next(tmp_path.iterdir()).joinpath("bisect.json").read_text())
    assert doc["status"] == "unresolved" and doc["result"]["first_bad"] is None
    assert [s["decision"] for s in doc["steps"]] == ["bad", "unresolved"]


def test_an_unresolved_first_step_says_the_range_itself_is_undecided(repo, tmp_path, monkeypatch):
    path, shas = repo
    _canned(monkeypatch, {4: ("within noise", [-2.0, 9.0])})
    result, status = bisect(path, tmp_path, "--good", shas[0], "--bad", shas[4])
    assert status == ExitStatus.OK, result.output
    assert f"unresolved: could not tell whether {shas[4]} is slower than {shas[0]}" in result.stdout
