"""`tts-bench bisect`: the binary search, one same-day A/B per step, and its record.

Commits c_1..c_n follow --good (c_0) on the first-parent line up to --bad (c_n). Step 1 A/Bs
c_n against c_0; unless that says `bad`, the range has no regression this run could resolve
and the search stops there ("no regression resolved", with the MDE it reached). Otherwise the
usual halving: with c_lo known good and c_hi known bad, A/B c_mid (mid = (lo + hi) // 2)
against c_0 and move lo or hi, until hi = lo + 1: c_hi is the first bad commit.

Every step is a real `tts-bench ab` (`tts_bench.ab.run_session`, its run directory under the
bisect's `steps/`), with the `--until-resolved` rule: blocks are added in counterbalanced pairs
until the interval is narrower than the config's bench.min_effect_pct (or --max-repeats /
--budget stops it). A step then decides, from the chosen metric's comparison:

    bad         the verdict is `slower` (significant and at least the minimum effect)
    good        the 95% interval excludes a slowdown of bench.min_effect_pct
    unresolved  anything else (an interval that straddles the minimum effect; an invalid tier)

An unresolved step stops the search and reports the commits it could not tell apart: a
bisect never guesses. bisect.json (in the bisect's directory) holds the plan and every step as
it ends, so `--resume DIR` replays the decided steps and re-runs (`ab --resume`, at the ports it
recorded) the step that was cut short.

    run = start_bisect(BisectRequest(good="v1", bad="HEAD", config="configs/ab/synthetic.yaml", tier="4x1"))
    outcome = run_bisect(run)
    outcome.status, outcome.first_bad
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tts_bench.rundir.atomic_json import write_json_atomic
from tts_bench.ab import AbRequest, run_session
from tts_bench.bisect.workspace import Server, Worktree, commits_between, free_port, repo_root, resolve
from tts_bench.config import load_config, parse_tiers
from tts_bench.errors import ConfigError
from tts_bench.report.ci import verdict_text

log = logging.getLogger(__name__)

BISECT_JSON = "bisect.json"
METRICS = {"rtf": "audio_rtf", "ttfp": "audio_ttfp_ms", "throughput": "audio_throughput"}
Decision = Literal["good", "bad", "unresolved"]


@dataclass(frozen=True)
class BisectRequest:
    good: str
    bad: str
    config: str  # path of the bench config inside the repository (or outside it: then fixed)
    tier: str
    metric: str = "rtf"
    repo: Path | None = None  # None: the repository holding the working folder
    setup: str | None = None  # shell command that serves a worktree at {port} (None: tts-bench serve)
    num_prompts: int | None = None
    repeats: int | None = None
    max_repeats: int | None = None
    budget_min: float | None = None  # per step, like ab --budget
    result_dir: Path = Path("results/runs")


@dataclass
class BisectRun:
    """A bisect's directory and its document (plan, steps, outcome), written after every step."""

    path: Path
    doc: dict[str, Any]

    def save(self) -> None:
        write_json_atomic(self.path / BISECT_JSON, self.doc)

    @property
    def plan(self) -> dict[str, Any]:
        return self.doc["plan"]


@dataclass(frozen=True)
class Outcome:
    status: str  # first bad commit | no regression resolved | unresolved
    first_bad: dict[str, Any] | None  # the step that tested it
    steps: list[dict[str, Any]] = field(default_factory=list)
    text: str = ""
    invalid: bool = False


def start_bisect(request: BisectRequest) -> BisectRun:
    """Resolve the refs and the range, make the bisect's directory and record the plan."""
    if request.metric not in METRICS:
        raise ConfigError(f"error: unknown metric {request.metric!r} (--metric of tts-bench bisect); "
                          f"valid: {', '.join(METRICS)}")
    repo = repo_root(request.repo or Path.cwd())
    good, bad = resolve(repo, request.good, "--good"), resolve(repo, request.bad, "--bad")
    commits = commits_between(repo, good, bad)
    config = _config_in_repo(Path(request.config), repo)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    path = Path(request.result_dir) / f"{stamp}-bisect-{bad[:8]}"
    try:
        path.mkdir(parents=True, exist_ok=False)
    except OSError as exc:
        raise ConfigError(f"error: cannot make {path} ({exc.strerror or exc}) (--result-dir); pass a writable folder") from None
    plan = {"repo": str(repo), "good": good, "bad": bad, "good_ref": request.good, "bad_ref": request.bad,
            "commits": [{"sha": s, "subject": subj} for s, subj in commits], "config": config,
            "tier": request.tier, "metric": request.metric, "setup": request.setup,
            "num_prompts": request.num_prompts, "repeats": request.repeats,
            "max_repeats": request.max_repeats, "budget_min": request.budget_min}
    run = BisectRun(path, {"kind": "bisect", "schema_version": 1, "status": "running", "plan": plan, "steps": []})
    run.save()
    return run


def open_bisect(path: Path) -> BisectRun:
    try:
        doc = json.loads((Path(path) / BISECT_JSON).read_text())
        missing = [k for k in ("plan", "steps") if k not in doc] or [k for k in ("commits", "good", "repo", "config", "tier")
                                                                       if k not in doc["plan"]]
        if missing:
            raise KeyError(", ".join(missing))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"error: {path} is not a bisect directory ({type(exc).__name__}: {exc}) (--resume of "
                          "tts-bench bisect); pass the directory a bisect made (it holds bisect.json)") from None
    return BisectRun(Path(path), doc)


def _config_in_repo(config: Path, repo: Path) -> str:
    """The config as a path inside each worktree when it lies in the repository, else absolute."""
    absolute = config if config.is_absolute() else (Path.cwd() / config)
    try:
        return str(absolute.resolve().relative_to(repo.resolve()))
    except ValueError:
        return str(absolute.resolve()) if config.is_absolute() or absolute.exists() else str(config)


# ---------------------------------------------------------------- deciding a step


def comparison(tier: Mapping[str, Any], metric: str) -> Mapping[str, Any]:
    """The tier's comparison dict for `metric` (RTF: the tier's own keys)."""
    if metric == "rtf":
        return tier
    key = {"ttfp": "ttfp", "throughput": "throughput"}[metric]
    cmp = tier.get(key)
    if not isinstance(cmp, Mapping):
        raise ConfigError(f"error: this A/B records no {metric} comparison (--metric of tts-bench bisect); "
                          "use --metric rtf or ttfp")
    return cmp


def decide(cmp: Mapping[str, Any], min_effect_pct: float, *, higher_is_better: bool = False) -> Decision:
    """bad / good / unresolved from one comparison (see the module docstring)."""
    verdict = cmp.get("verdict")
    if verdict in ("slower", "worse"):
        return "bad"
    ci = cmp.get("ci95_pct")
    if verdict == "invalid" or not ci:
        return "unresolved"
    lo, hi = ci
    excluded = lo > -min_effect_pct if higher_is_better else hi < min_effect_pct
    return "good" if excluded else "unresolved"


# ---------------------------------------------------------------- the search


def run_bisect(run: BisectRun, *, notify: Callable[[str], None] = log.info) -> Outcome:
    """Run (or finish) the search; every step is recorded in bisect.json as it ends, and a
    search that stops on an error or Ctrl-C says so there (`--resume` carries on)."""
    run.doc.update(status="running", error=None)
    run.save()
    try:
        return _search(run, notify)
    except BaseException as exc:
        interrupted = isinstance(exc, KeyboardInterrupt)
        run.doc.update(status="interrupted" if interrupted else "failed", error=None if interrupted else str(exc))
        run.save()
        raise


def _search(run: BisectRun, notify: Callable[[str], None]) -> Outcome:
    plan = run.plan
    commits = plan["commits"]
    n = len(commits)
    with Worktree(Path(plan["repo"]), plan["good"]) as good_tree:
        plan.setdefault("min_effect_pct", _min_effect(good_tree, plan))
        first = _step(run, n, good_tree, notify)
        if first["decision"] != "bad":
            return _finish(run, "no regression resolved" if first["decision"] == "good" else "unresolved",
                           None, lo=0, hi=n)
        lo, hi = 0, n
        while hi - lo > 1:
            mid = (lo + hi) // 2
            step = _step(run, mid, good_tree, notify)
            if step["decision"] == "unresolved":
                return _finish(run, "unresolved", None, lo=lo, hi=hi)
            lo, hi = (lo, mid) if step["decision"] == "bad" else (mid, hi)
    return _finish(run, "first bad commit", _find(run, hi), lo=lo, hi=hi)


def _find(run: BisectRun, position: int) -> dict[str, Any] | None:
    return next((s for s in run.doc["steps"] if s["position"] == position and s.get("decision")), None)


def _step(run: BisectRun, position: int, good_tree: Path, notify: Callable[[str], None]) -> dict[str, Any]:
    """A/B commit `position` (1-based in plan.commits) against the good one, or reuse its record."""
    done = _find(run, position)
    if done is not None:
        return done
    plan = run.plan
    commit = plan["commits"][position - 1]
    pending = next((s for s in run.doc["steps"] if s["position"] == position), None)
    if pending is None:
        pending = {"step": len(run.doc["steps"]) + 1, "position": position, "sha": commit["sha"],
                   "subject": commit["subject"], "ports": [free_port(), free_port()], "run_dir": None}
        run.doc["steps"].append(pending)
        run.save()
    notify(f"bisect step {pending['step']}: {commit['sha'][:10]} ({position}/{len(plan['commits'])}) "
           f"{commit['subject']!r} against {plan['good'][:10]}")
    with Worktree(Path(plan["repo"]), commit["sha"]) as tree:
        result = _ab(run, pending, good_tree, tree)
    pending.update(_summary(result, plan))
    run.save()
    notify(f"bisect step {pending['step']}: {pending['verdict_text']} -> {pending['decision']}")
    return pending


def _ab(run: BisectRun, step: dict[str, Any], good_tree: Path, tree: Path) -> dict[str, Any]:
    """The step's A/B through `tts_bench.ab.run_session`: base = a server from the good commit,
    test = a server from the step's commit, both started fresh for this step."""
    plan = run.plan
    concurrency = parse_tiers(plan["tier"])[0].concurrency
    logs = run.path / "servers"
    servers = []
    try:
        for name, wt, port in (("good", good_tree, step["ports"][0]), ("test", tree, step["ports"][1])):
            servers.append(Server.start(wt, plan["config"], port=port, setup=plan["setup"], concurrency=concurrency,
                                        log=logs / f"step{step['step']}-{name}.log"))
        for server in servers:
            server.wait_ready()
        base_url, test_url = (s.url for s in servers)
        # One folder per step holds its one ab run directory: a step cut short is found there.
        folder = run.path / "steps" / f"step{step['step']}"
        started = sorted(p for p in folder.glob("*") if (p / "run.json").is_file()) if folder.is_dir() else []
        if started:
            request = AbRequest(resume=started[-1])
        else:
            config = Path(plan["config"]) if Path(plan["config"]).is_absolute() else good_tree / plan["config"]
            request = AbRequest(
                config=config, tiers=plan["tier"], num_prompts=plan["num_prompts"],
                repeats=plan["repeats"], sets=["backend=http"], base_sets=[f"http.base_url={base_url}"],
                test_sets=[f"http.base_url={test_url}"], result_dir=folder, until_resolved=True,
                max_repeats=plan["max_repeats"], budget_min=plan["budget_min"])
        session = run_session(request)
        step["run_dir"] = str(session.run_dir.path)
        return session.result.to_dict()
    finally:
        for server in servers:
            server.stop()


def _summary(result: Mapping[str, Any], plan: Mapping[str, Any]) -> dict[str, Any]:
    """The step's row: the chosen metric's delta, interval, MDE, blocks and the decision."""
    tier = next((t for t in result.get("tiers", []) if t.get("tier") == plan["tier"]), None)
    if tier is None:
        return {"decision": "unresolved", "verdict": "missing", "verdict_text": f"no result for tier {plan['tier']}"}
    cmp = comparison(tier, plan["metric"])
    min_effect = plan["min_effect_pct"]
    return {
        "decision": decide(cmp, min_effect, higher_is_better=plan["metric"] == "throughput"),
        "verdict": cmp.get("verdict"), "verdict_text": verdict_text(cmp),
        "delta_pct": cmp.get("delta_mean_pct"), "ci95_pct": cmp.get("ci95_pct"), "mde_pct": cmp.get("mde_pct"),
        "blocks": cmp.get("blocks"), "min_effect_pct": min_effect, "valid": bool(result.get("valid", True)),
    }


def _min_effect(good_tree: Path, plan: Mapping[str, Any]) -> float:
    """bench.min_effect_pct of the config the A/Bs run (the good commit's)."""
    config = Path(plan["config"])
    return float(load_config(config if config.is_absolute() else good_tree / config).bench.min_effect_pct)


def _finish(run: BisectRun, status: str, first_bad: dict[str, Any] | None, *, lo: int, hi: int) -> Outcome:
    commits = run.plan["commits"]
    steps = run.doc["steps"]
    if status == "first bad commit" and first_bad:
        text = f"first bad commit: {first_bad['sha']} {first_bad['subject']!r}: {first_bad['verdict_text']}"
    elif status == "no regression resolved":
        s = steps[0]
        text = (f"no regression resolved: {run.plan['bad_ref']} against {run.plan['good_ref']}: {s['verdict_text']}; "
                f"MDE reached {_mde(s)} at {s.get('blocks')} blocks")
    elif len(steps) == 1:
        text = (f"unresolved: could not tell whether {run.plan['bad_ref']} is slower than {run.plan['good_ref']} "
                f"({steps[0]['verdict_text']}); rerun with a larger --max-repeats or --budget")
    else:
        last = steps[-1]
        between = ", ".join(c["sha"][:10] for c in commits[lo:hi])
        text = (f"unresolved: step {last['step']} ({last['sha'][:10]}) could not be decided ({last['verdict_text']}); "
                f"the first bad commit is one of: {between}; rerun with a larger --max-repeats or --budget")
    invalid = any(not s.get("valid", True) for s in steps)
    run.doc.update(status=status, result={"text": text, "first_bad": first_bad["sha"] if first_bad else None,
                                          "range": [c["sha"] for c in commits[lo:hi]], "invalid": invalid})
    run.save()
    return Outcome(status, first_bad, list(steps), text, invalid)


def _mde(step: Mapping[str, Any]) -> str:
    return "n/a" if step.get("mde_pct") is None else f"{step['mde_pct']:.1f}%"
