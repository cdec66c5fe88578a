"""`tts-bench --help` stays light: importing the command line loads no numerics, no validation
library, no stage code. Command modules import those inside their bodies (tts_bench/commands/)
and `tts_bench.config` loads its names on first use."""

import json
import subprocess
import sys

HEAVY = ("torch", "numpy", "pandas", "rich", "pydantic", "yaml", "stages.config")


def _loaded_after(statement: str) -> list[str]:
    code = f"import sys; {statement}; import json; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out.splitlines()[-1])


def test_importing_the_command_line_loads_none_of_the_heavy_modules():
    assert _loaded_after("import tts_bench.cli") == []


def test_the_check_sees_a_heavy_import_when_one_happens():
    assert "pydantic" in _loaded_after("import tts_bench.cli; from tts_bench.config import load_config")
