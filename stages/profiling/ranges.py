"""The profiler ranges the workloads are timed by, and which ranges each step reports.

The talker step and the whole code2wav decode are wrapped in their ranges by the workloads
(`talker_step`, `code2wav_step`), the serving talker's steps inside a trace window too
(`window`); the decode's three components are annotated where they run
(stages/code2wav/chunk_decode.py), under the names in `COMPONENT_RANGES`. Renaming one there
without here makes its time read 0.0 (`launches.RangeTimes.occurrences` shows the range was
never seen).
"""

TALKER_RANGE = "talker.decode_step"
DECODE_RANGE = "code2wav.decode"
COMPONENT_RANGES = ("code2wav.flow_encoder", "code2wav.cfm", "code2wav.hift")
RANGES = {"talker_step": (TALKER_RANGE,), "code2wav_step": (DECODE_RANGE, *COMPONENT_RANGES)}
