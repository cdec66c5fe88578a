"""The arrows point one way: the system under test (`stages`) never imports the harness, and
only the platform layer (`stages/platform`) asks which device kind it is on."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The harness's libraries too: stage configs stay plain dataclasses (the harness validates them
# with pydantic from outside), and /metrics is the server's business.
# The official token2wav modules (`stepaudio2`, minicpmo-utils) are a test-side reference only.
FORBIDDEN = ("tts_bench", "typer", "rich", "pydantic", "prometheus_client", "stepaudio2", "einops")


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


# Platform decisions (the CUDA runtime, TF32, which device kind a branch runs on) are made in
# stages/platform only; model, runner, profiling and harness code take a device and ask there.
# scripts/ and tests/ may ask torch directly.
PLATFORM_MODULES = ("torch.cuda", "torch.backends.cuda", "torch.backends.cudnn")
DEVICE_KIND_NAMES = frozenset({"cuda", "npu", "cpu", "mps", "xpu", "meta"})
OUTSIDE_PLATFORM = sorted(
    p for p in [*(ROOT / "stages").rglob("*.py"), *(ROOT / "tts_bench").rglob("*.py")]
    if p.relative_to(ROOT).parts[:2] != ("stages", "platform")
)


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _is_kind(node: ast.AST) -> bool:
    """A device kind literal ("cuda"), or a tuple/list/set of them."""
    if isinstance(node, ast.Constant):
        return node.value in DEVICE_KIND_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_kind(e) for e in node.elts)
    return False


def _platform_leaks(path: Path) -> list[str]:
    """`torch.cuda` / `torch.backends.cuda` (as attributes or imports) and `x.type == "cuda"`
    style comparisons of a device's kind, as `line: what`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    leaks = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _dotted(node) in PLATFORM_MODULES:
            leaks.append(f"{node.lineno}: {_dotted(node)}")
        elif isinstance(node, ast.Import):
            leaks += [f"{node.lineno}: import {a.name}" for a in node.names
                      if a.name.startswith(PLATFORM_MODULES)]  # fmt: skip
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            if any(n.startswith(PLATFORM_MODULES) for n in names):
                leaks.append(f"{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            typed = any(isinstance(o, ast.Attribute) and o.attr == "type" for o in operands)
            if typed and any(_is_kind(o) for o in operands):
                leaks.append(f"{node.lineno}: {ast.unparse(node)}")
    return leaks


@pytest.mark.parametrize("path", OUTSIDE_PLATFORM, ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_platform_layer_asks_torch_cuda_or_compares_device_kinds(path):
    assert _platform_leaks(path) == []


def test_the_platform_rule_sees_what_it_forbids(tmp_path):
    leaky = tmp_path / "leaky.py"
    leaky.write_text(
        "import torch\n"
        "from torch.backends import cuda\n"
        "torch.cuda.synchronize()\n"
        "torch.backends.cuda.matmul.allow_tf32 = True\n"
        "if device.type == 'cuda' or x.device.type in ('npu', 'cpu') or d.type != 'cpu': pass\n"
        "if event.device_type == 'cpu' or schema.type == 'Tensor': pass\n"
    )
    lines = sorted(leak.split(":")[0] for leak in _platform_leaks(leaky))
    assert lines == ["2", "3", "4", "5", "5", "5"]  # three kind comparisons on line 5; none on 6


def test_decoding_a_voice_does_not_load_torch():
    # The harness checks prompt lists and `ref_audio` fields with the stages' decoder and their
    # admission rules; that must stay cheap for the piper and http backends, which never load
    # torch otherwise.
    code = "import sys, stages.audio, stages.admission; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


# scripts/ measure the library, so they use it as the library uses itself: public names only (a
# private name may change under them without notice) and every platform question through
# stages.platform (a script that asks torch.cuda is CUDA-only by accident, and its numbers skip
# what the stages do on that device). The scripts' own helpers (`scripts._report`) are theirs.
# What genuinely must stay is listed with why; an entry that no longer matches anything fails too.
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))
SCRIPT_ALLOWANCES = {
    ("scripts/bench_prelude.py", "stages.talker.prelude_triton._empty_kernel"):
        "the launch floor the fused prelude is judged against: an empty Triton kernel compiled beside "
        "it, which nothing but this benchmark launches",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")  # `_x`, not `__future__`


def _script_leaks(path: Path) -> list[str]:
    """Private imports, torch_npu and the library's platform leaks of a script, as `line: what`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    leaks = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [(node.module, a.name) for a in node.names]
        else:
            continue
        for module, name in modules:
            parts = module.split(".")
            if parts[0] != "scripts" and any(_private(p) for p in parts):
                leaks.append(f"{node.lineno}: {module}")
            elif name is not None and _private(name):
                leaks.append(f"{node.lineno}: {module}.{name}")
            if parts[0] == "torch_npu":
                leaks.append(f"{node.lineno}: {module}")
    return sorted(set(leaks) | set(_platform_leaks(path)), key=lambda leak: int(leak.split(":")[0]))


def _unallowed(path: Path) -> list[str]:
    rel = str(path.relative_to(ROOT))
    return [leak for leak in _script_leaks(path) if (rel, leak.split(": ", 1)[1]) not in SCRIPT_ALLOWANCES]


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_scripts_import_public_names_and_ask_the_platform_layer(path):
    assert _unallowed(path) == []


def test_every_script_allowance_still_matches_what_it_allows():
    for (rel, what), why in SCRIPT_ALLOWANCES.items():
        assert why and what in [leak.split(": ", 1)[1] for leak in _script_leaks(ROOT / rel)], rel


def test_the_scripts_rule_sees_what_it_forbids(tmp_path):
    leaky = tmp_path / "leaky.py"
    leaky.write_text(
        "from __future__ import annotations\n"
        "from tts_bench.ab.summary import _by_repeat, summarize_ab\n"
        "import tts_bench._private\n"
        "from stages.talker._kernels import launch\n"
        "from scripts._report import emit\n"
        "import torch_npu\n"
        "torch.cuda.synchronize()\n"
        "def f(device):\n"
        "    from stages.talker.prelude_triton import _empty_kernel\n"
        "    return device.type == 'cuda'\n"
    )
    assert _script_leaks(leaky) == [
        "2: tts_bench.ab.summary._by_repeat", "3: tts_bench._private", "4: stages.talker._kernels",
        "6: torch_npu", "7: torch.cuda", "9: stages.talker.prelude_triton._empty_kernel",
        "10: device.type == 'cuda'",
    ]


# Model files hold nn.Modules and tensor math only: which kernels run is decided outside them
# (stages/code2wav/kernels.py, stages/talker/kernels.py) and handed in (`use_kernels`), so a
# model file asks no device what it is. Model files are found, not listed: every stages module
# that defines an nn.Module subclass.
DEVICE_PREDICATES = frozenset({
    "is_cuda", "is_cpu", "is_npu", "is_mps", "cuda_available", "npu_available", "accelerator_available",
    "tf32_tensor_cores", "triton_unavailable_reason",
    "compile_failure",  # compiling a kernel to see whether it runs is choosing it: not here either
})
MODULE_BASES = frozenset({"Module", "ModuleList", "ModuleDict", "Sequential"})
KNOWN_MODEL_FILES = {
    "stages/talker/model.py", "stages/code2wav/dit.py", "stages/code2wav/cfm.py", "stages/code2wav/flow.py",
    "stages/code2wav/flow_encoder.py", "stages/code2wav/hift.py", "stages/code2wav/campplus.py",
}


def _defines_a_module(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                name = _dotted(base) or ""
                if name.split(".")[-1] in MODULE_BASES and (name.startswith(("nn.", "torch.nn.")) or "." not in name):
                    return True
    return False


MODEL_FILES = sorted(p for p in (ROOT / "stages").rglob("*.py") if _defines_a_module(ast.parse(p.read_text())))


def _device_predicates(path: Path) -> list[str]:
    """`is_cuda(...)` / `x.is_cuda` and the other predicates (called, read or imported),
    `<...>device.type` compared with anything, and `torch.cuda` / `torch.npu` / `torch.backends`,
    as `line: what`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}  # a.b of a.b.c
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in DEVICE_PREDICATES:
            found.append(f"{node.lineno}: {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in DEVICE_PREDICATES:
            found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Attribute) and id(node) not in inner and \
                (_dotted(node) or "").startswith(("torch.cuda", "torch.npu", "torch.backends")):
            found.append(f"{node.lineno}: {_dotted(node)}")
        elif isinstance(node, ast.ImportFrom):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if a.name in DEVICE_PREDICATES]
        elif isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                if isinstance(operand, ast.Attribute) and operand.attr == "type" and \
                        (_dotted(operand.value) or "").split(".")[-1] == "device":
                    found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_model_files_are_found():
    assert {str(p.relative_to(ROOT)) for p in MODEL_FILES} >= KNOWN_MODEL_FILES


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_model_files_ask_no_device_what_it_is(path):
    assert _device_predicates(path) == []


def test_the_model_file_rule_sees_what_it_forbids(tmp_path):
    leaky = tmp_path / "leaky.py"
    leaky.write_text(
        "from torch import nn\n"
        "from stages.platform import is_cuda, compile_failure\n"
        "class M(nn.Module):\n"
        "    def forward(self, x):\n"
        "        if is_cuda(x.device) or x.is_cpu or platform.triton_unavailable_reason(x.device): pass\n"
        "        if x.device.type == 'cuda' or self.device.type != kind: pass\n"
        "        torch.cuda.synchronize(); torch.backends.cudnn.allow_tf32 = False\n"
        "        if schema.type == 'Tensor' or x.dtype == torch.float32 or x.is_contiguous(): pass\n"
    )
    assert _defines_a_module(ast.parse(leaky.read_text()))
    lines = sorted(int(hit.split(":")[0]) for hit in _device_predicates(leaky))
    assert lines == [2, 2, 5, 5, 5, 6, 6, 7, 7]  # nothing on line 8


# The harness uses the system under test through its public surface only: the runner, the stage
# config, the profiling workloads, the platform layer, audio at the stages' edge (`stages.audio`)
# and what they admit (`stages.admission`), plus the dependency-free flag and signal rules both
# sides follow. The talker's and code2wav's modules are theirs to change without the harness
# noticing. tts_bench/reference/ is the one exception: it compares the stages' modules with the
# official ones, module by module, so it imports their internals by design.
STAGES_PUBLIC = frozenset({"stages.runner", "stages.config", "stages.platform", "stages.audio",
                           "stages.admission", "stages.flags", "stages.signals"})
STAGES_PUBLIC_PACKAGES = ("stages.profiling",)  # a toolkit: each of its modules is public
HARNESS = sorted(p for p in (ROOT / "tts_bench").rglob("*.py") if p.relative_to(ROOT).parts[:2] != ("tts_bench", "reference"))


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _stage_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every `stages` module `path` imports; `from stages.x import y` names
    stages.x.y when y is a module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "stages"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] == "stages":
            subs = [f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}")]
            found += [(node.lineno, m) for m in subs or [node.module]]
    return found


def _private_stage_imports(path: Path) -> list[str]:
    def public(module: str) -> bool:
        return module in STAGES_PUBLIC or any(module == p or module.startswith(p + ".") for p in STAGES_PUBLIC_PACKAGES)

    return [f"{line}: {module}" for line, module in _stage_modules(path) if not public(module)]


@pytest.mark.parametrize("path", HARNESS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_harness_imports_only_the_stages_public_surface(path):
    assert _private_stage_imports(path) == []


def test_the_public_surface_rule_sees_what_it_forbids(tmp_path):
    harness = tmp_path / "harness.py"
    harness.write_text(
        "import stages.talker.length\n"
        "from stages.code2wav.audio import decode_audio\n"
        "from stages.runner.work import per_step\n"
        "from stages.runner import work\n"
        "from stages import precision\n"
        "from stages.audio import to_pcm16\n"
        "from stages.admission import text_problem\n"
        "from stages.runner import StageRunner\n"
        "from stages.profiling.launches import RangeTimes\n"
        "import stages.platform\n"
        "def f():\n"
        "    from stages.code2wav import dit\n"
    )
    assert _private_stage_imports(harness) == [
        "1: stages.talker.length", "2: stages.code2wav.audio", "3: stages.runner.work", "4: stages.runner.work",
        "5: stages.precision", "12: stages.code2wav.dit"]


# Imports sit at the top of a module, where a reader looks for what it depends on, and a cycle
# between two modules is broken by moving what both need, not by importing late. The typer
# commands are the exception: each imports its library in its body, so `tts-bench --help` stays
# light (tts_bench/commands/__init__.py). Anywhere else, harness or stages, a function-level
# import of the harness or of the stages says what waiting saves with a `# lazy:` comment, on its
# lines or in the comment right above it (the stages' Triton modules, the engines a child builds). Third-party imports are not held to this: an optional dependency (whisper,
# piper, zhconv) or a slow one (PyAV, matplotlib, scipy.stats) is imported where it is used.
LAZY_ALLOWED = (("tts_bench", "commands"), ("tts_bench", "cli.py"))
TOP_IMPORT_MODULES = sorted(
    p for package in ("tts_bench", "stages") for p in (ROOT / package).rglob("*.py")
    if p.relative_to(ROOT).parts[:2] not in LAZY_ALLOWED
)


def _marked_lazy(lines: list[str], node: ast.stmt) -> bool:
    """A `# lazy:` comment on the statement's lines or in the comment lines right above it."""
    if any("# lazy:" in line for line in lines[node.lineno - 1 : node.end_lineno]):
        return True
    above = node.lineno - 2
    while above >= 0 and lines[above].strip().startswith("#"):
        if "# lazy:" in lines[above]:
            return True
        above -= 1
    return False


def _unmarked_function_imports(path: Path) -> list[str]:
    """Imports of `tts_bench` or `stages` (relative ones too) inside a function body without a
    `# lazy:` reason, as `line: module`."""
    source = path.read_text()
    lines = source.splitlines()
    found = []

    def ours(node: ast.stmt) -> str | None:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] in ("tts_bench", "stages")]
            return names[0] if names else None
        if isinstance(node, ast.ImportFrom):
            if node.level:
                return "." * node.level + (node.module or "")
            return node.module if node.module.split(".")[0] in ("tts_bench", "stages") else None
        return None

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            module = ours(child) if in_function else None
            if module and not _marked_lazy(lines, child):
                found.append(f"{child.lineno}: {module}")
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source, filename=str(path)), False)
    return found


@pytest.mark.parametrize("path", TOP_IMPORT_MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_harness_and_the_stages_import_themselves_at_the_top_of_their_modules(path):
    assert _unmarked_function_imports(path) == []


def test_the_top_level_import_rule_sees_what_it_forbids(tmp_path):
    module = tmp_path / "module.py"
    module.write_text(
        "import json\n"
        "from tts_bench.errors import ConfigError\n"
        "def f():\n"
        "    from tts_bench.config import load_config\n"
        "    import tts_bench.ab\n"
        "    from . import sibling\n"
        "    import numpy, json\n"
        "    from stages.runner import per_step  # lazy: stages.runner loads torch\n"
        "    # lazy: stages.platform loads torch,\n"
        "    # which only an embedded arm needs\n"
        "    from stages.platform import (\n"
        "        is_cpu,\n"
        "    )\n"
        "    x = 1  # lazy: not an import\n"
        "    from stages.audio import to_pcm16\n"
        "class C:\n"
        "    async def g(self):\n"
        "        from tts_bench.wire import audio\n"
    )
    assert _unmarked_function_imports(module) == [
        "4: tts_bench.config", "5: tts_bench.ab", "6: .", "15: stages.audio", "18: tts_bench.wire"]
