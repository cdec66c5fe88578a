"""Parse `npu-smi` text (Huawei Ascend) into HBM used/total per NPU.

`npu-smi` has no machine-readable output on the versions in the field, so we read its text. Two
views carry HBM memory:

- `npu-smi info` (the summary table, MB resolution). Two rows per NPU:

      | 0     910B3               | OK            | 101.8       43                0    / 0             |
      | 0                         | 0000:C1:00.0  | 0           0    / 0          3318 / 65536         |

  The first row names the NPU (id, name); the second is its chip (chip id, bus id, AICore%,
  Memory-Usage used / total, HBM-Usage used / total). HBM is the *last* `used / total` pair of the
  chip row. Landmines: a 5-digit value prints as `59356/ 65536` (no space before the slash), and
  a process table follows whose rows also start with numbers (`| 0   0 | 418635 | vllm | 56057 |`),
  so parsing stops at its header.
- `npu-smi info -t usages -i <card>` (and `-t common`): `HBM Capacity(MB) : 65536` and
  `HBM Usage Rate(%) : 5`, a whole percentage, so used memory from it is only good to 1% of the
  card (655 MiB on 64 GiB). Used as a fallback when the table cannot be read.

"MB" in npu-smi output is MiB (a 64 GiB card reports 65536). Fixtures of real output, with their
sources, live in tests/fixtures/npu_smi/.

    cards = parse_info_table(subprocess.run(["npu-smi", "info"], ...).stdout)
    cards[0].hbm_used_mib, cards[0].hbm_total_mib     # 3318, 65536
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MIB = 1024 * 1024

# `| 0     910B3               | OK            | ...` : NPU id, then a name (letters and digits).
_NPU_ROW = re.compile(r"^\|\s*(\d+)\s+([A-Za-z0-9][\w.-]*)\s*\|\s*([A-Za-z]\w*)\s*\|")
# `| 0                         | 0000:C1:00.0  | ...` : chip id, then a PCI bus id.
_CHIP_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*\|(.*)\|")
_PAIR = re.compile(r"(\d+)\s*/\s*(\d+)")
_KEY_VALUE = re.compile(r"^\s*([^:]+?)\s*:\s*(\S.*?)\s*$")


@dataclass(frozen=True)
class NpuCard:
    """One NPU chip's HBM as npu-smi reports it (MiB)."""

    npu_id: int
    chip_id: int
    name: str
    hbm_used_mib: int
    hbm_total_mib: int

    @property
    def label(self) -> str:
        return f"npu{self.npu_id}" if self.chip_id == 0 else f"npu{self.npu_id}.{self.chip_id}"


class NpuSmiParseError(ValueError):
    """The text is not an npu-smi view we know; the message quotes what was missing."""


def _is_process_header(line: str) -> bool:
    return "Process id" in line or "Process name" in line


def parse_info_table(text: str) -> list[NpuCard]:
    """Every NPU chip in an `npu-smi info` summary table, in print order."""
    cards: list[NpuCard] = []
    current: tuple[int, str] | None = None
    for line in text.splitlines():
        if _is_process_header(line):
            break  # the process table reuses the row shape; nothing after it is an NPU
        npu = _NPU_ROW.match(line)
        if npu is not None:
            current = (int(npu.group(1)), npu.group(2))
            continue
        chip = _CHIP_ROW.match(line)
        if chip is None or current is None:
            continue
        pairs = _PAIR.findall(chip.group(3))
        if not pairs:
            continue
        used, total = (int(v) for v in pairs[-1])
        _check_plausible(f"NPU {current[0]} chip {chip.group(1)}", used, total, "`npu-smi info`")
        cards.append(NpuCard(current[0], int(chip.group(1)), current[1], used, total))
    if not cards:
        raise NpuSmiParseError(
            "no NPU rows with HBM-Usage(MB) used / total found in `npu-smi info` output"
        )
    return cards


MAX_HBM_MIB = 1 << 24  # 16 TiB: above any card; a larger figure is a misread


def _check_plausible(what: str, used: int, total: int, view: str) -> None:
    """A used / total pair that no card reports (a broken npu-smi: `3318 / 0`) is refused: summed
    and compared as device memory it would read as a full or an over-full card."""
    if not 0 < total <= MAX_HBM_MIB or not 0 <= used <= total:
        raise NpuSmiParseError(f"{what} reports HBM {used} / {total} MB in {view}: not a card's memory "
                               f"(a total of 1..{MAX_HBM_MIB} MB, used within it)")


def _number(values: dict[str, str], key: str) -> float | None:
    raw = values.get(key)
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        raise NpuSmiParseError(f"{key!r} is {raw[:40]!r}, not a number, in `npu-smi info -t usages` output") from None


def _key_values(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _KEY_VALUE.match(line)
        if m is not None:
            out.setdefault(m.group(1), m.group(2))  # first chip of the card wins
    return out


def parse_usages(text: str, *, npu_id: int, total_mib: int | None = None) -> NpuCard:
    """HBM of one card from `npu-smi info -t usages -i <card>` (or `-t common`).

    Used memory = rate% x capacity, rounded to whole MiB; `total_mib` supplies the capacity for
    views that do not print it (`-t common`)."""
    values = _key_values(text)
    rate = _number(values, "HBM Usage Rate(%)")
    capacity = _number(values, "HBM Capacity(MB)")
    if rate is None:
        raise NpuSmiParseError("no 'HBM Usage Rate(%)' line in `npu-smi info -t usages` output")
    if capacity is None and total_mib is None:
        raise NpuSmiParseError("no 'HBM Capacity(MB)' line in `npu-smi info -t usages` output")
    total = int(capacity) if capacity is not None else int(total_mib)  # type: ignore[arg-type]
    if not 0 <= rate <= 100:
        raise NpuSmiParseError(f"'HBM Usage Rate(%)' is {rate:g}, not a percentage, in `npu-smi info -t usages` output")
    used = round(rate / 100.0 * total)
    _check_plausible(f"NPU {npu_id}", used, total, "`npu-smi info -t usages`")
    return NpuCard(npu_id, 0, values.get("Chip Name", "npu"), used, total)
