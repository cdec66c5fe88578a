"""How much memory a stage config asks for, from the config alone (no torch, no model built).

The harness checks this before any stage process starts (`tts_bench.preflight`), so a config
that cannot fit is an exit-2 error naming the bytes and the keys to lower, not a process the OOM
killer ends minutes later (the full-size talker on a CPU: a KV cache of 20 layers x 128 slots x
4096 positions, 6 GiB in fp32, before any request).

What is counted, per item (`BudgetItem`), with where it lives (`device` = where the stages run;
on a CPU that is the host too):

| item | bytes | lower it with |
|---|---|---|
| talker weights | exact parameter count x dtype | the stage dims, runner.dtype |
| talker KV cache | 2 x layers x talker_max_batch x max_seq_len x kv_heads x head_dim x dtype | runner.talker_max_batch, runner.max_seq_len |
| code2wav weights | ~parameter count x dtype, per replica | R (replicas) |
| code2wav request state | each replica's slot pool: one slot for each of its share of the C requests in flight, of estimator + conformer attention caches (the estimator's in code2wav_dit_dtype) | C (concurrency), code2wav.prompt_keep_frames, code2wav.ref_audio_max_seconds, code2wav.extra.code2wav_dit_dtype |
| code2wav voices | the default voice and up to prompt_cache_size request voices per module copy, each a prompt setup's caches | code2wav.prompt_cache_size |
| code2wav decode transient | a quarter of a request's state per batched row (measured 0.158 on an H200), per replica | runner.max_num_seqs |
| code2wav device graphs | with `code2wav_device_graph` (default) on a GPU: the graphs' memory pool, 0.25 of a request's state per batched row with expandable segments (with the transient, 0.5 against 0.39-0.43 measured on an H200), 0.55 with the default segments (0.53 measured), per replica | code2wav.extra.code2wav_device_graph, runner.max_num_seqs |
| code2wav final-chunk graphs | with `code2wav_final_chunk_graphs` on a GPU: the one-row final graphs the warmup captures (a shape per stage a stream can end in and count of new codes: 3 x codec_chunk_frames at full size, one stage more after a shorter first chunk), 4 MiB each (NVML +1.8 GiB for 75 a replica at 128x8 on an H200, 3.0 MiB each, D-GRAPH-6), per replica | code2wav.extra.code2wav_final_chunk_graphs=false |
| processes | torch and its libraries per process (~300 MiB RSS on a CPU; a CUDA context and workspaces on a GPU) | R |
| model build | one more fp32 copy of each process's weights while it is built on the host | the stage dims |

Parameter counts of the talker are exact (the Llama arithmetic); code2wav's are the dominant
terms of each module, within a few percent at the real dims (tests/unit/test_budget.py checks
both against the built modules). The per-request estimator cache is the spec's figure (1.25 MiB
per frame at full size, 400 frames = 500 MiB). It is an estimate to catch configs that are off
by multiples, not an allocator model: NVML on an H200 reads ~40% above the torch-allocated peak
at 128x8 (caching allocator), and 128x8 at full size, chunk graphs on, still fits there with this estimate.

    budget = estimate_stage_memory(cfg, replicas=8, concurrency=128, device_type="cuda")
    budget.total("device"), budget.largest("device")
"""

from __future__ import annotations

from dataclasses import dataclass

from stages.code2wav.config import Code2WavConfig
from stages.config import StageConfig, replica_groups, resolve_execution
from stages.runner.placement import place
from stages.talker.config import TalkerConfig

MIB = 2**20
# RSS of a stage process before its model: the interpreter, torch and its libraries (measured
# 270-310 MiB on a 2-core CPU, tiny model included).
HOST_PROCESS_BYTES = 300 * MIB
# A CUDA context plus library workspaces per process (cuBLAS, cuDNN), as NVML sees them.
DEVICE_PROCESS_BYTES = 512 * MIB
# A batched decode's transient, per row, as a fraction of one request's state (0.158 measured on
# an H200 at B = 8 with the stepwise estimator cache; rounded up).
TRANSIENT_PER_ROW = 0.25
# A replica's device-graph pool, per row of its largest batch, as a fraction of one request's
# state, with expandable segments (what every stage process runs with unless the user sets the
# allocator, stages.runner.allocator): this plus TRANSIENT_PER_ROW covers what a replica held
# reserved beyond its allocation at 128x8 (D-BUDGET-1, where the default segments' figure is too).
GRAPH_POOL_PER_ROW = 0.25
GRAPH_POOL_PER_ROW_DEFAULT_SEGMENTS = 0.55
# One captured one-row final chunk (`code2wav_final_chunk_graphs`): its outputs and the pool's
# growth. NVML at 128x8 on an H200, steady serving: 124,521 MiB with 75 of them in each of 8
# replicas against 122,717 without, 3.0 MiB each (D-GRAPH-6); rounded up. D-GRAPH-2's reading,
# 13 MiB each, was of the earlier scheme (25 graphs a replica, settled stage only).
FINAL_GRAPH_BYTES = 4 * MIB
# Stages a stream can end in before its caches settle (its only chunk, after one chunk,
# settled), as the warmup finds them at full size (stages.code2wav.graph_warmup).
FINAL_GRAPH_STAGES = 3
# The DiT's two causal convolutions per block use this kernel width (stages.code2wav.dit).
_DIT_CONV_KERNEL = 3

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class BudgetItem:
    name: str
    bytes: int
    where: str  # "device" (where the stages run) or "host" (only the host, even on a GPU)
    keys: tuple[str, ...]  # what lowers it: config keys or tier parts


@dataclass(frozen=True)
class StageBudget:
    items: tuple[BudgetItem, ...]
    device_type: str  # "cpu": device items are host items

    def total(self, where: str) -> int:
        """Bytes needed on `where` ("host" or "device"); on a CPU both mean the host."""
        if self.device_type == "cpu":
            return sum(i.bytes for i in self.items)
        return sum(i.bytes for i in self.items if i.where == where)

    def largest(self, where: str, n: int = 3) -> list[BudgetItem]:
        on = [i for i in self.items if self.device_type == "cpu" or i.where == where]
        return sorted(on, key=lambda i: -i.bytes)[:n]


def dtype_bytes(name: str) -> int:
    return _DTYPE_BYTES.get(name, 4)


def talker_params(t: TalkerConfig) -> int:
    """Exact parameter count of `stages.talker.model.TalkerModel` (weight norm unfolded)."""
    d, hd = t.hidden_size, t.head_dim
    attention = d * t.num_heads * hd * 2 + d * t.num_kv_heads * hd * 2
    layer = attention + 3 * d * t.intermediate_size + 2 * d
    embeddings = t.num_text_tokens * d + 2 * t.num_audio_tokens * d + t.num_audio_tokens
    projector = t.llm_dim * d + d + d * d + d
    return embeddings + t.num_layers * layer + d + projector


def code2wav_params(c: Code2WavConfig) -> int:
    """Parameter count of one replica's modules (flow, HiFT, CAM++), dominant terms."""
    f, dit, h = c.flow, c.dit, c.hift
    d, u = f.input_size, f.linear_units
    conformer = 5 * d * d + 2 * d * u + 10 * d
    encoder = (f.num_blocks + f.num_up_blocks) * conformer + 6 * d * d  # + lookahead/upsample convs
    flow = f.vocab_size * d + encoder + d * f.output_size + c.speaker.embedding_dim * f.output_size
    w = dit.hidden_size
    inner = dit.num_heads * dit.head_dim
    block = 4 * w * inner + 2 * int(w * w * dit.mlp_ratio) + 9 * w * w + 2 * _DIT_CONV_KERNEL * w * w
    estimator = dit.depth * block + dit.in_channels * w + 2 * w * w + 2 * w * w
    hift = 79 * h.base_channels**2 + 16 * h.f0_predictor_channels**2
    campplus = 6_848_544  # CAM++ at 192-d / 80 fbank bins: fixed by the speaker config we use
    return flow + estimator + hift + campplus


def request_state_bytes(c: Code2WavConfig, elem: int, dit_dtype: str) -> int:
    """One request's code2wav caches between payloads: the per-Euler-step estimator attention
    cache (dominant: 500 MiB at full size in fp32; 2-byte elements when `dit_dtype` is
    bfloat16) and the conformer attention cache."""
    frames = round(c.ref_audio_max_seconds * c.mel_rate_hz) + c.prompt_keep_frames + c.chunk_mel_frames
    dit, f = c.dit, c.flow
    estimator = c.n_timesteps * dit.depth * 2 * dit.num_heads * frames * 2 * dit.head_dim
    conformer = (f.num_blocks + f.num_up_blocks) * f.input_size * 2 * frames
    dit_elem = 2 if dit_dtype == "bfloat16" else elem
    return estimator * dit_elem + conformer * elem


def pool_slots(max_num_seqs: int, live: int) -> int:
    """Slots of one replica's pool (stages.code2wav.slots): the `live` requests the runner will
    keep on it when that is known (ceil(C / R) of the concurrency it was told), else
    2 x max_num_seqs.

    The runner gives each request to the least-loaded replica and counts it until its last audio
    is delivered, after the replica has released the slot (a cancelled or failed request's slot
    is released before the next payload for that replica, which comes through the talker
    behind the Drop), so while clients keep at most C requests in flight a replica holds at most
    its share: more slots would be idle device memory (at 128x8 with 16-row batches, 2 x 16 slots
    of 0.5 GiB per replica did not fit an H200). Past C (a `serve --concurrency` that clients
    exceed) the pool grows by doubling, which drops the replica's captured graphs once."""
    return live if live > 0 else max(1, 2 * max_num_seqs)


def estimate_stage_memory(
    cfg: StageConfig, *, replicas: int, concurrency: int, device_type: str, expandable_segments: bool = True
) -> StageBudget:
    """The memory a runner of `cfg` with `replicas` code2wav replicas needs while `concurrency`
    requests are in flight, on a device of type `device_type` (cpu, cuda, npu).
    `expandable_segments`: whether its processes will run with them (they do unless the user sets
    the allocator: `stages.runner.allocator.runs_expandable_segments(os.environ)`)."""
    t, c, r = cfg.talker, cfg.code2wav, cfg.runner
    elem = dtype_bytes(r.dtype)
    execution = resolve_execution(r)
    # Each replica's device: an explicit runner.devices list places them round-robin; `auto`
    # needs the device count, which this arithmetic does not ask for, and counts as one device.
    devices = place(r.devices, replicas).replicas if isinstance(r.devices, tuple) else (0,) * replicas
    groups = replica_groups(execution, replicas, r.replicas_per_process, devices)
    processes = 1 + len(groups)
    # Replica threads of one process share one copy of the modules per device they use.
    copies = sum(len({devices[i] for i in ids}) for ids in (groups or [range(replicas)]))
    in_flight = min(concurrency, r.talker_max_batch)
    options = c.options  # the stage flags, as the stage reads them
    state = request_state_bytes(c, elem, options.dit_dtype)
    slots = pool_slots(r.max_num_seqs, -(-concurrency // replicas))  # C, not in_flight: see StageRunner
    kv = 2 * t.num_layers * r.talker_max_batch * r.max_seq_len * t.num_kv_heads * t.head_dim * elem
    items = [
        BudgetItem("talker weights", talker_params(t) * elem, "device", ("stages (dims)", "runner.dtype=bfloat16")),
        BudgetItem("talker KV cache", kv, "device",
                   ("runner.talker_max_batch", "runner.max_seq_len", "runner.dtype=bfloat16")),
        BudgetItem("code2wav weights", copies * code2wav_params(c) * elem, "device",
                   ("tier R (replicas)", "stages (dims)")),
        BudgetItem("code2wav request state", replicas * slots * state, "device",
                   ("tier C (concurrency)", "code2wav.prompt_keep_frames",
                    "code2wav.ref_audio_max_seconds", "code2wav.extra.code2wav_dit_dtype=bfloat16")),
        BudgetItem("code2wav voices", copies * (1 + c.prompt_cache_size) * int(state * _setup_share(c)), "device",
                   ("code2wav.prompt_cache_size", "code2wav.ref_audio_max_seconds")),
        BudgetItem("code2wav decode transient",
                   int(replicas * min(r.max_num_seqs, in_flight) * TRANSIENT_PER_ROW * state),
                   "device", ("runner.max_num_seqs",)),
        BudgetItem("stage processes (host)", processes * HOST_PROCESS_BYTES, "host", ("tier R (replicas)",)),
        BudgetItem("model build (host, fp32)", 4 * (talker_params(t) + copies * code2wav_params(c)),
                   "host", ("stages (dims)", "tier R (replicas)")),
    ]
    if device_type != "cpu":
        items.append(BudgetItem("device contexts", processes * DEVICE_PROCESS_BYTES, "device",
                                ("tier R (replicas)",)))
        if options.device_graph:
            rows = min(r.max_num_seqs, in_flight)
            per_row = GRAPH_POOL_PER_ROW if expandable_segments else GRAPH_POOL_PER_ROW_DEFAULT_SEGMENTS
            items.append(BudgetItem("code2wav device graphs", int(replicas * rows * per_row * state),
                                    "device", ("code2wav.extra.code2wav_device_graph=false", "runner.max_num_seqs")))
            if options.graph_warmup and options.final_chunk_graphs:
                items.append(BudgetItem("code2wav final-chunk graphs", replicas * final_graphs(c) * FINAL_GRAPH_BYTES,
                                        "device", ("code2wav.extra.code2wav_final_chunk_graphs=false",)))
    return StageBudget(tuple(items), device_type)


def final_graphs(c: Code2WavConfig) -> int:
    """One-row final graphs a replica's warmup captures: a shape per stage and count of new codes."""
    stages = FINAL_GRAPH_STAGES + (c.first_chunk_frames < c.codec_chunk_frames)
    return stages * c.codec_chunk_frames


def _setup_share(c: Code2WavConfig) -> float:
    """A prompt setup's caches relative to one request's state (prompt frames only)."""
    prompt = round(c.ref_audio_max_seconds * c.mel_rate_hz)
    return prompt / (prompt + c.prompt_keep_frames + c.chunk_mel_frames)
