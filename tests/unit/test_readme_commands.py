"""The README's two fresh-machine commands are what CI runs: `.ci/run` holds the test command
verbatim, and the main-job command sets up the same environment and runs `tts-bench ab`."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _fresh_machine_commands(readme: str) -> list[str]:
    section = readme.split("## Fresh machine", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_ci_runs_the_readmes_test_command_verbatim():
    main_job, tests = _fresh_machine_commands((ROOT / "README.md").read_text())[:2]
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in ci_lines
    assert "pytest" in tests and "-m \"not slow\"" in tests
    assert main_job.endswith("&& tts-bench ab")
    setup = main_job.removesuffix(" && tts-bench ab")
    assert tests.startswith(setup), "the two commands set up different environments"


def test_ci_also_runs_the_slow_tests_and_the_gates_after_the_test_line():
    ci_lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    test_line = next(i for i, line in enumerate(ci_lines) if "pytest -q -m \"not slow\"" in line)
    rest = ci_lines[test_line + 1:]
    assert any("-m slow" in line and line.startswith("timeout ") for line in rest)
    assert any(line.startswith("scripts/ci_perf_gate.sh") for line in rest)
    assert "set -euo pipefail" in ci_lines, "a failing step must fail CI"
