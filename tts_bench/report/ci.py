"""What CI systems read natively: JUnit XML (`--junit FILE`) and the GitHub job summary.

GitHub Actions, GitLab CI and Jenkins show JUnit XML as test results; GitHub Actions also
renders markdown appended to the file named by `GITHUB_STEP_SUMMARY` on the run's page. This
module turns the JSON documents `ab` and `gate` already produce into both; it never changes
how they are computed.

One test case per tier x metric (`4x1.audio_rtf`), in one test suite per command:

| command | failure | error | skipped |
|---|---|---|---|
| gate | a row marked `worse` (not with `--report-only`, which exits 0 on it); the accuracy check | the run is invalid | a metric that is `not gated` |
| ab | `slower` only with `--fail-on-slower` (ab reports, it does not gate: by default a slower verdict is a passing case whose text is in system-out) | the tier is invalid | none |

Every case carries its verdict text (delta, interval, MDE, blocks) in `system-out`, and a
failure carries it as its message, so a CI page says *how much* slower, not only *that*.

    write_junit(ab_suite(result_doc, fail_on_slower=True), Path("ab.xml"))
    append_step_summary(markdown)        # only when GITHUB_STEP_SUMMARY is set
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tts_bench.errors import ConfigError

Outcome = Literal["passed", "failure", "error", "skipped"]
SLOWER = ("slower", "worse")  # a throughput verdict (another command's) may say either


@dataclass(frozen=True)
class Case:
    """One JUnit test case: `classname` is the suite's command, `name` the tier and metric."""

    name: str
    outcome: Outcome
    text: str  # the verdict line (system-out; the failure's message)
    classname: str = "tts-bench"
    time_s: float = 0.0


@dataclass(frozen=True)
class Suite:
    name: str
    cases: list[Case] = field(default_factory=list)
    time_s: float = 0.0

    def count(self, outcome: Outcome) -> int:
        return sum(c.outcome == outcome for c in self.cases)


def _pct(v: Any) -> str:
    return "n/a" if v is None else f"{v:+.1f}%"


def verdict_text(cmp: Mapping[str, Any] | None) -> str:
    """`slower: +10.2% [+8.1%, +12.3%], MDE 3.1%, 4 blocks` from an A/B comparison dict."""
    if not cmp:
        return "no comparison"
    ci = cmp.get("ci95_pct")
    interval = f" [{_pct(ci[0])}, {_pct(ci[1])}]" if ci else " (no interval)"
    mde = cmp.get("mde_pct")
    detail = cmp.get("verdict_detail") or cmp.get("verdict") or "unknown"
    return (f"{detail}: {_pct(cmp.get('delta_mean_pct'))}{interval}"
            + (f", MDE {mde:.1f}%" if mde is not None else "") + f", {cmp.get('blocks', 0)} blocks")


def ab_comparisons(tier: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(metric, comparison dict) of an A/B tier: RTF (the tier's own keys), TTFP, and a
    throughput verdict where the run's tts-bench writes one."""
    out: list[tuple[str, Mapping[str, Any]]] = [("audio_rtf", tier)]
    for metric, key in (("audio_ttfp_ms", "ttfp"), ("audio_throughput", "throughput")):
        if isinstance(tier.get(key), Mapping) and "verdict" in tier[key]:
            out.append((metric, tier[key]))
    return out


def ab_suite(doc: Mapping[str, Any], *, fail_on_slower: bool = False) -> Suite:
    """The A/B result document (`AbResult.to_dict()`) as a suite of tier x metric cases."""
    cases = []
    for tier in doc.get("tiers", []):
        invalid = tier.get("verdict") == "invalid"
        for metric, cmp in ab_comparisons(tier):
            text = "invalid: " + "; ".join(tier.get("invalid_reasons") or ["invalid tier"]) if invalid else verdict_text(cmp)
            outcome: Outcome = "error" if invalid else (
                "failure" if fail_on_slower and cmp.get("verdict") in SLOWER else "passed")
            cases.append(Case(f"{tier['tier']}.{metric}", outcome, text, classname="tts-bench.ab"))
    return Suite("tts-bench ab", cases)


def gate_suite(doc: Mapping[str, Any]) -> Suite:
    """The gate report document (`GateReport.to_dict()`) as a suite: its rows, then one case for
    run validity and one for accuracy when either has reasons."""
    report_only = bool(doc.get("report_only"))
    cases = []
    for row in doc.get("rows", []):
        text = (f"{row['mark']}: {_pct(row.get('delta_pct'))} vs baseline "
                f"(threshold {_threshold(row.get('threshold_pct'))}, p {row.get('p_value', float('nan')):.2g}, "
                f"{row.get('n_current')} vs {row.get('n_baseline')} samples)")
        outcome: Outcome = ("skipped" if row["mark"] == "not gated" else
                            "failure" if row["mark"] == "worse" and not report_only else "passed")
        cases.append(Case(f"{row['tier']}.{row['metric']}", outcome, text, classname="tts-bench.gate"))
    if doc.get("invalid_reasons"):
        cases.append(Case("run.valid", "error", "invalid: " + "; ".join(doc["invalid_reasons"]), "tts-bench.gate"))
    if doc.get("accuracy_reasons"):
        cases.append(Case("run.accuracy", "failure", "; ".join(doc["accuracy_reasons"]), "tts-bench.gate"))
    return Suite("tts-bench gate", cases)


def _threshold(v: Any) -> str:
    return "n/a" if v is None else f"±{v:g}%"


def junit_tree(suites: Iterable[Suite]) -> ET.ElementTree:
    """<testsuites> with the counts every JUnit reader expects (tests, failures, errors,
    skipped, time) on both levels."""
    suites = list(suites)
    root = ET.Element("testsuites", name="tts-bench")
    _counts(root, [c for s in suites for c in s.cases], sum(s.time_s for s in suites))
    for suite in suites:
        el = ET.SubElement(root, "testsuite", name=suite.name)
        _counts(el, suite.cases, suite.time_s)
        for case in suite.cases:
            tc = ET.SubElement(el, "testcase", name=case.name, classname=case.classname, time=f"{case.time_s:.3f}")
            if case.outcome == "failure":
                ET.SubElement(tc, "failure", message=case.text, type="regression").text = case.text
            elif case.outcome == "error":
                ET.SubElement(tc, "error", message=case.text, type="invalid").text = case.text
            elif case.outcome == "skipped":
                ET.SubElement(tc, "skipped", message=case.text)
            ET.SubElement(tc, "system-out").text = case.text
    return ET.ElementTree(root)


def _counts(el: ET.Element, cases: list[Case], time_s: float) -> None:
    el.set("tests", str(len(cases)))
    for outcome, attr in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
        el.set(attr, str(sum(c.outcome == outcome for c in cases)))
    el.set("time", f"{time_s:.3f}")


def write_junit(suite: Suite, path: Path) -> Path:
    """Write one suite as a JUnit XML file (parents made); a path that cannot be written is a
    ConfigError naming --junit."""
    tree = junit_tree([suite])
    ET.indent(tree)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tree.write(path, encoding="utf-8", xml_declaration=True)
    except OSError as exc:
        raise ConfigError(f"error: cannot write {path} ({exc.strerror or exc}) (--junit); pass a writable file path") from None
    return path


def append_step_summary(markdown: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """Append `markdown` to the file named by GITHUB_STEP_SUMMARY; nothing when it is unset or
    empty (outside GitHub Actions). Returns the file written, if any."""
    env = os.environ if environ is None else environ
    target = env.get("GITHUB_STEP_SUMMARY", "").strip()
    if not target:
        return None
    path = Path(target)
    try:
        with path.open("a", encoding="utf-8") as fh:
            fh.write(markdown if markdown.endswith("\n") else markdown + "\n")
    except OSError as exc:
        raise ConfigError(f"error: cannot append to {path} ({exc.strerror or exc}) (GITHUB_STEP_SUMMARY); "
                          "unset it or point it at a writable file") from None
    return path


def publish(suite: Suite, markdown: str, *, junit: Path | None) -> None:
    """What a command does with `--junit FILE` and GITHUB_STEP_SUMMARY: the XML when asked, the
    markdown (the command's own md tables) only when the variable is set."""
    if junit is not None:
        write_junit(suite, junit)
    append_step_summary(markdown)
