"""Modules stay small enough to read in one sitting: at most 500 lines in `stages/`, `tts_bench/`,
`scripts/` and `tests/` (STYLE.md: modules of roughly 150-400 lines, split past ~500; a test file
is read as often as the code it tests). A module that grows
past the limit is split by concern, not exempted: there is no allow-list."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 500
CHECKED = ("stages", "tts_bench", "scripts", "tests")


def _line_count(path: Path) -> int:
    with path.open(encoding="utf-8") as f:
        return sum(1 for _ in f)


def _oversized(paths) -> list[str]:
    return [f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}: {n} lines"
            for p in paths if (n := _line_count(p)) > MAX_LINES]


def test_no_module_is_over_500_lines():
    paths = sorted(p for folder in CHECKED for p in (ROOT / folder).rglob("*.py"))
    assert len(paths) > 100, "the walk found too few modules: is ROOT right?"
    assert _oversized(paths) == [], f"split these by concern (limit {MAX_LINES} lines)"


@pytest.mark.parametrize("lines, flagged", [(MAX_LINES, False), (MAX_LINES + 1, True)])
def test_the_size_rule_flags_a_module_one_line_over(tmp_path, lines, flagged):
    module = tmp_path / "big.py"
    module.write_text("x = 1\n" * lines)
    assert bool(_oversized([module])) is flagged
