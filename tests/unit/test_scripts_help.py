"""Every measuring script still starts: `--help` of each answers with its usage and exit 0.

They run in one fresh interpreter, one after another (`runpy`, as `python scripts/x.py --help`
would), so torch is imported once rather than once per script. A script that imports a name the
library moved, or that does its work before parsing its options, fails here on any machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for p in (ROOT / "scripts").glob("*.py") if not p.name.startswith("_"))

HELP_EACH = textwrap.dedent("""
    import contextlib, io, json, runpy, sys
    answers = {}
    for path in sys.argv[1:]:
        out = io.StringIO()
        sys.argv = [path, "--help"]
        try:
            with contextlib.redirect_stdout(out):
                runpy.run_path(path, run_name="__main__")
            code = "returned instead of exiting"
        except SystemExit as exc:
            code = exc.code
        except BaseException as exc:  # what a broken import or an early crash raises
            code = f"{type(exc).__name__}: {exc}"
        answers[path.rsplit("/", 1)[-1]] = [code, out.getvalue()[:80]]
    print(json.dumps(answers))
""")


def test_every_script_answers_help_with_its_usage():
    assert len(SCRIPTS) > 20
    done = subprocess.run([sys.executable, "-c", HELP_EACH, *map(str, SCRIPTS)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    answers = json.loads(done.stdout.splitlines()[-1])
    broken = {name: a for name, a in answers.items() if a[0] != 0 or not a[1].startswith("usage:")}
    assert broken == {}
    assert sorted(answers) == [p.name for p in SCRIPTS]

