"""The stage config: talker + code2wav + runner, one frozen tree loaded from a stage YAML.

    configs/stages/minicpmo45.yaml       real dims (GPU)
    configs/stages/minicpmo45-tiny.yaml  shrunk widths/depths, same vocab/chunking/steps (CPU)

A bench config includes one with `stages: ../stages/minicpmo45-tiny.yaml`; `--set
runner.max_num_seqs=4` (or `talker.…`, `code2wav.…`) overrides a field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

EXECUTIONS = ("auto", "processes", "threads", "single")
SHARINGS = ("auto", "time-sliced", "mps", "mps-talker-first")

from stages.code2wav import options as code2wav_options
from stages.code2wav.config import Code2WavConfig
from stages.talker import options as talker_options
from stages.talker.config import TalkerConfig


@dataclass(frozen=True)
class RunnerConfig:
    """How the stages are run: device, dtype, batching, replicas, weights.

    The number of code2wav replicas is not here: it is the R of the tier being run (`CxR`).
    `torch_threads` 0 splits the machine's cores evenly over the talker and the R replicas, at
    least one thread each (a 2-core CPU runs 1 thread per process); oversubscribing OpenMP pools
    across processes costs far more than it gains.
    """

    device: Literal["auto", "cuda", "npu", "cpu"] = "auto"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    max_num_seqs: int = 8  # rows a stage-2 replica batches per step
    # Which payloads a replica step takes when more requests have one waiting than max_num_seqs
    # allows: false, the oldest first; true, streams' first chunks first (oldest first among
    # them), then the oldest of the rest. A first chunk is what a request's TTFP waits for, and
    # behind a full step of older chunks it waits a whole step more; the price is that those
    # chunks wait instead (codes unchanged). Off: at 32x1 its TTFP moved from block to block
    # (2.9 to 0.8 s) against a steady 2.7-2.9 s, within noise over 4 repeats (D-C2W-5).
    first_chunks_first: bool = False
    # Which chunk shapes one replica step decodes: false, whatever the chosen payloads need (a
    # step of streams at different points of their lives runs one chunk group per shape, each
    # costing about a whole one-row chunk of device time); true, one non-final shape a step, the
    # oldest waiting payload's, filled with other requests' payloads of that shape, plus any final
    # chunks (each replays alone whatever it is batched with). The talker is untouched; the audio
    # moves only by the rounding of other batch compositions (replica_proc.take_batch). On
    # (D-C2W-6): at 32x1 mean RTF -21.1 %, TTFP -23.9 %, throughput +26.1 %, each resolved.
    one_shape_steps: bool = True
    talker_max_batch: int = 128  # concurrent requests the talker decodes together
    max_seq_len: int = 4096  # static KV cache length per talker slot
    seed: int = 0  # seeds random weight init (identical in every process and run)
    weights: str | None = None  # official MiniCPM-o 4.5 directory; None -> seeded random init
    torch_threads: int = 0  # intra-op threads per stage process; 0 = cores / (1 + replicas)
    start_timeout_s: float = 600.0  # building every stage's model must finish within this
    # How the stages run: the talker and each code2wav replica a process ("processes"); the
    # talker a process and the replicas threads of another, a device stream each ("threads";
    # shared weights); or the talker and every replica threads of one process ("single": one
    # device context, so nothing is time-sliced; the talker's stream has high priority).
    # "auto": processes (D-EXEC-1).
    execution: Literal["auto", "processes", "threads", "single"] = "auto"
    # With processes: the replicas a code2wav process hosts, as threads with a device stream
    # each (stages.runner.replica_host), so R replicas are ceil(R / k) device contexts instead
    # of R: fewer contexts for the GPU to time-slice, without every replica under one
    # interpreter (D-EXEC-1). 1: a process each, the default (D-EXEC-2: lower TTFP, mean RTF
    # within noise, slower starts). A host keeps to one device: with runner.devices its
    # replicas are those of one device.
    replicas_per_process: int = 1
    # How the stage processes share a CUDA device: "time-sliced" (each its own context, the
    # GPU's default), "mps" (clients of a private Multi-Process Service daemon the runner starts
    # and quits: their kernels run side by side), "mps-talker-first" (as mps, the replicas
    # below-normal clients, so the talker's ready kernels are scheduled first), or "auto": mps
    # on CUDA where nvidia-cuda-mps-control is on PATH and no system-wide daemon runs, else
    # time-sliced (stages.runner.sharing.resolve_sharing; D-EXEC-3: mps faster at 128x8 and
    # 64x4, talker-first slower than mps). stages.platform.mps.
    # Explicit mps* need several stage processes (not execution single) and a CUDA device.
    sharing: Literal["auto", "time-sliced", "mps", "mps-talker-first"] = "auto"
    # SMs of the talker's GPU held back from the replicas (CUDA green contexts; execution single
    # only, where the stages share one device context), so the talker's ~900 small kernels a step
    # do not wait for SMs the replicas' chunk kernels hold. 0: no partition. The driver rounds it
    # up to its SM granularity. The talker itself keeps every SM. Opt-in: no partition helped
    # the runner's talker (D-EXEC-4). stages.platform.partition.
    talker_sms: int = 0
    # Accelerator indices for the talker (first) and the replicas (round-robin), "auto" for
    # every visible device, or null: everything on device 0 (stages.runner.placement).
    devices: tuple[int, ...] | Literal["auto"] | None = None
    # Run-to-run deterministic kernels in every stage process (stages.platform
    # .deterministic_kernels: torch's deterministic algorithms, cuDNN deterministic and not
    # benchmarking, cuBLAS's fixed workspace in the process environment): replayed graphs then
    # equal eager chunks, and identical requests and A/B arms that compute the same thing give
    # the same audio, with code2wav's default precision (D-DET-1, D-PREC-1). false trades that
    # for any faster kernels; its speed cost is not measured yet (configs/ab/deterministic.yaml).
    deterministic: bool = True

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.talker_max_batch < 1:
            raise ValueError("runner.max_num_seqs and runner.talker_max_batch must be >= 1")
        if self.max_seq_len < 1:
            raise ValueError(f"runner.max_seq_len must be >= 1, got {self.max_seq_len}")
        if self.torch_threads < 0:
            raise ValueError(f"runner.torch_threads must be >= 0, got {self.torch_threads}")
        if not self.start_timeout_s > 0:
            raise ValueError(f"runner.start_timeout_s must be > 0, got {self.start_timeout_s}")
        if self.execution not in EXECUTIONS:
            raise ValueError(f"runner.execution must be one of {', '.join(EXECUTIONS)}, got {self.execution!r}")
        if self.replicas_per_process < 1:
            raise ValueError(f"runner.replicas_per_process must be >= 1, got {self.replicas_per_process}")
        if self.replicas_per_process > 1 and self.execution not in ("auto", "processes"):
            raise ValueError(
                f"runner.replicas_per_process={self.replicas_per_process} needs runner.execution: "
                f"processes (got {self.execution!r}): threads already host every replica in one "
                "process, single hosts every stage in one; set runner.replicas_per_process=1 or "
                "runner.execution=processes"
            )
        if self.sharing not in SHARINGS:
            raise ValueError(f"runner.sharing must be one of {', '.join(SHARINGS)}, got {self.sharing!r}")
        if self.sharing.startswith("mps") and self.execution == "single":
            raise ValueError(
                f"runner.sharing={self.sharing} needs several stage processes (runner.execution: "
                "single runs every stage in one process, one device context already); set "
                "runner.sharing=time-sliced or runner.execution=processes")
        if self.sharing.startswith("mps") and self.device in ("cpu", "npu"):
            raise ValueError(
                f"runner.sharing={self.sharing} is CUDA's Multi-Process Service, and runner.device "
                f"is {self.device}; set runner.sharing=time-sliced")
        if self.talker_sms < 0:
            raise ValueError(f"runner.talker_sms must be >= 0, got {self.talker_sms}")
        if self.talker_sms and self.execution != "single":
            raise ValueError(
                f"runner.talker_sms={self.talker_sms} needs runner.execution: single (got "
                f"{self.execution!r}): as separate processes the stages are separate device "
                "contexts, which the GPU time-slices whatever their SMs; set runner.talker_sms=0 "
                "or runner.execution=single"
            )
        if isinstance(self.devices, tuple) and (not self.devices or min(self.devices) < 0):
            raise ValueError(f"runner.devices must list device indices >= 0, got {list(self.devices)}")


@dataclass(frozen=True)
class StageConfig:
    """talker (stage 1) + code2wav (stage 2) + how the runner runs them."""

    talker: TalkerConfig = field(default_factory=TalkerConfig)
    code2wav: Code2WavConfig = field(default_factory=Code2WavConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)

    def __post_init__(self) -> None:
        # Parse both stages' flags here, so a typo fails when the config is loaded (exit 2 from
        # the harness), on every platform, before any stage process starts. This is the one
        # parse: `talker.options` and `code2wav.options` are cached on first read and what every
        # consumer reads, in this process and (pickled with the config) in the stage processes.
        # The environment flags the stage processes read (TALKER_CODEC_FUSED_PRELUDE, ...) are
        # checked here too, and their errors name the variable (stages.flags.EnvFlagError).
        talker_options.check_env()
        code2wav_options.check_env()
        for stage in (self.talker, self.code2wav):
            _ = stage.options  # parsed (and cached) now, so a typo fails here


def replica_groups(execution: str, replicas: int, per_process: int = 1,
                   replica_devices: Sequence[int] | None = None) -> list[tuple[int, ...]]:
    """The replica ids each code2wav process hosts, for a resolved `execution`: one group of
    every replica (threads), none (single: its one process hosts them beside the talker), or
    runs of `per_process` (processes). With processes, `replica_devices` (the device index of
    each replica, from `stages.runner.placement`) keeps a group on one device: replicas are
    grouped device by device, in order of first use, so a host is one device context, never
    several. Without it every replica counts as on one device (consecutive runs; the last may
    be shorter)."""
    if execution == "single":
        return []
    if execution == "threads":
        return [tuple(range(replicas))]
    devices = tuple(replica_devices) if replica_devices is not None else (0,) * replicas
    if len(devices) != replicas:
        raise ValueError(f"replica_devices names {len(devices)} devices for {replicas} replicas")
    groups = []
    for device in dict.fromkeys(devices):  # distinct devices, in order of first use
        ids = [r for r in range(replicas) if devices[r] == device]
        groups += [tuple(ids[i:i + per_process]) for i in range(0, len(ids), per_process)]
    return groups


def resolve_execution(runner: RunnerConfig) -> str:
    """`processes`, `threads` or `single` for `runner.execution`.

    `auto` is processes (D-EXEC-1): replica threads read mean RTF +99 % [+56, +154] at 128x8
    against processes, `single` is bound by its one interpreter there, and no A/B against
    processes with chunk graphs resolved a gain for either."""
    return "processes" if runner.execution == "auto" else runner.execution
