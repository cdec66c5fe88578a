"""npu-smi text parsing on real published outputs (tests/fixtures/npu_smi, sources in its README)
and the npu-smi sampler driven by a fake `subprocess.run`. Nothing here runs npu-smi."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from tts_bench.mem.npu_smi import MIB, NpuSmiParseError, parse_info_table, parse_usages
from tts_bench.mem.samplers import NpuSmiSampler, SamplerError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "npu_smi"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def test_single_card_table_gives_hbm_used_and_total_in_mib():
    (card,) = parse_info_table(fixture("info_910b4_single.txt"))
    assert (card.npu_id, card.chip_id, card.name) == (0, 0, "910B4")
    assert (card.hbm_used_mib, card.hbm_total_mib) == (2871, 32768)
    assert card.label == "npu0"


def test_eight_card_table_reads_every_card_in_order():
    cards = parse_info_table(fixture("info_910b3_8card.txt"))
    assert [c.npu_id for c in cards] == list(range(8))
    assert [c.hbm_used_mib for c in cards] == [3318, 3314, 3314, 3314, 3314, 3314, 3314, 3315]
    assert {c.hbm_total_mib for c in cards} == {65536}


def test_busy_table_with_unspaced_slash_and_process_table():
    # `59356/ 65536`: no space before the slash once the value has five digits; the process
    # table after the cards (`| 0  0 | 418635 | vllm | 56057 |`) must not become NPUs.
    cards = parse_info_table(fixture("info_910b2c_16card_busy.txt"))
    assert len(cards) == 16
    assert [c.npu_id for c in cards] == list(range(16))
    assert cards[0].hbm_used_mib == 59356
    assert cards[4].hbm_used_mib == 59346
    assert cards[8].hbm_used_mib == 59353
    assert cards[15].hbm_used_mib == 59351
    assert all(c.hbm_total_mib == 65536 and c.name == "910B2C" for c in cards)
    assert 56057 not in [c.hbm_used_mib for c in cards]  # a process row's memory


def test_usages_view_gives_rate_times_capacity():
    card = parse_usages(fixture("usages_910b3.txt"), npu_id=7)
    assert card.hbm_total_mib == 65536
    assert card.hbm_used_mib == round(0.05 * 65536)  # 3277: 1% resolution
    assert card.npu_id == 7


def test_common_view_needs_the_capacity_from_elsewhere():
    with pytest.raises(NpuSmiParseError, match="HBM Capacity"):
        parse_usages(fixture("common_910b.txt"), npu_id=0)
    card = parse_usages(fixture("common_910b.txt"), npu_id=0, total_mib=65536)
    assert card.hbm_used_mib == round(0.03 * 65536)


def test_text_without_npu_rows_is_a_parse_error():
    with pytest.raises(NpuSmiParseError):
        parse_info_table("npu-smi: command failed\n")
    with pytest.raises(NpuSmiParseError):
        parse_info_table(fixture("usages_910b3.txt"))


def fake_run(outputs: dict[tuple[str, ...], str | Exception]):
    calls = []

    def run(cmd, **kwargs):
        calls.append((tuple(cmd[1:]), kwargs))
        out = outputs[tuple(cmd[1:])]
        if isinstance(out, Exception):
            raise out
        return SimpleNamespace(stdout=out, returncode=0)

    return run, calls


def test_sampler_picks_its_card_from_the_table_with_a_timeout():
    run, calls = fake_run({("info",): fixture("info_910b3_8card.txt")})
    (reading,) = NpuSmiSampler(card=7, run=run).sample()
    assert reading.label == "npu7"
    assert (reading.used_bytes, reading.total_bytes) == (3315 * MIB, 65536 * MIB)
    assert calls[0][1]["timeout"] > 0


def test_sampler_falls_back_to_usages_when_the_table_has_no_such_card():
    run, calls = fake_run({
        ("info",): "garbled\n",
        ("info", "-t", "usages", "-i", "7"): fixture("usages_910b3.txt"),
    })
    sampler = NpuSmiSampler(card=7, run=run)
    (reading,) = sampler.sample()
    assert reading.used_bytes == 3277 * MIB
    assert sampler.describe()["view"] == "usages"


def test_sampler_timeout_is_a_sampler_error_not_a_hang():
    run, _ = fake_run({("info",): subprocess.TimeoutExpired("npu-smi", 5)})
    with pytest.raises(SamplerError, match="longer than"):
        NpuSmiSampler(card=0, run=run).sample()


@pytest.mark.parametrize("pair, words", [("3318 / 0    ", "reports HBM 3318 / 0 MB"),
                                         ("40000 / 32768", "reports HBM 40000 / 32768 MB")])
def test_a_table_with_an_implausible_total_is_refused_not_read(pair, words):
    text = fixture("info_910b4_single.txt").replace("2871 / 32768", pair)
    with pytest.raises(NpuSmiParseError, match=words):
        parse_info_table(text)


@pytest.mark.parametrize("text, words", [
    ("HBM Capacity(MB) : lots\nHBM Usage Rate(%) : 5\n", "'HBM Capacity(MB)' is 'lots', not a number"),
    ("HBM Capacity(MB) : 65536\nHBM Usage Rate(%) : 250\n", "is 250, not a percentage"),
    ("HBM Capacity(MB) : 0\nHBM Usage Rate(%) : 5\n", "reports HBM 0 / 0 MB"),
])
def test_a_usages_view_with_garbage_numbers_is_a_parse_error(text, words):
    with pytest.raises(NpuSmiParseError, match=re.escape(words)):
        parse_usages(text, npu_id=0)
