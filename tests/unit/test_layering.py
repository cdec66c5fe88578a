"""The arrows point one way: the system under test (`stages`) never imports the harness."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("tts_bench", "typer", "rich")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", sorted((ROOT / "stages").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_stages_never_import_the_harness_typer_or_rich(path):
    assert not _imports(path) & set(FORBIDDEN)


def test_only_the_platform_layer_mentions_torch_npu():
    users = {p.relative_to(ROOT).parts[:2] for p in (ROOT / "stages").rglob("*.py") if "torch_npu" in _imports(p)}
    assert users <= {("stages", "platform")}
