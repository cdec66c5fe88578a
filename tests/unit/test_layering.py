"""The arrows point one way: the system under test (`stages`) never imports the harness."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The harness's libraries too: stage configs stay plain dataclasses (the harness validates them
# with pydantic from outside), and /metrics is the server's business.
FORBIDDEN = ("tts_bench", "typer", "rich", "pydantic", "prometheus_client")


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


def test_decoding_a_voice_does_not_load_torch():
    # The harness checks prompt lists and `ref_audio` fields with the stages' decoder; that must
    # stay cheap for the piper and http backends, which never load torch otherwise.
    code = "import sys, stages.code2wav.audio; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"
