"""The whole runner in one process (`runner.execution: single`): the talker loop on the main
thread, every code2wav replica a thread beside it, each stage on its own device stream.

Why: as separate processes the talker and the replicas are separate device contexts, and a GPU
time-slices contexts. On an H200 at 64x4 the talker's step took 154 ms beside four replica
processes (3-11 ms alone, with its decode graphs) and was busy 99 % of the tier: the talker,
waiting for time slices, held the tier back (`results/h200/runner_smoke_work_eager_64x4.json`).
In one context the kernels of every stage share the device at kernel granularity and the
talker's stream has high priority.
Measured there: the talker's step fell to 79 ms, not to its time alone: 63 % of it is the host
read waiting for the device, and holding 16 SMs back from the replicas (`runner.talker_sms`,
`stages.platform.partition`, which the replica threads then run on) left it at 79 ms; the talker
confined to its own 32 SMs took 145 ms (D-EXEC-4). No A/B against processes resolved a gain,
and at 128x8 its one interpreter is the bound, so this is an option, not the default (D-EXEC-1).
The cost is one interpreter: the stages' host work shares the GIL (device graphs keep it small;
warmups at start do not).

One process holds every replica's graph pool and slot pool; like every stage process it runs
with expandable segments unless the user set the allocator (`process.choose_allocator`: with the
default segments this mode ran out of memory at 128x8 on an H200; D-ALLOC-1).

The messages are the other modes': the talker reads Submit / Cancel / StatsQuery / Shutdown from
the process inbox and puts payload lists on the replicas' queues, which the replica threads read
(`replica_host.ReplicaThread`). At Shutdown the talker puts each replica's sentinel behind the
payloads it sent and joins the threads, which read up to it and decode nothing more (the
runner's stop event, `ProcessSpec.stopping`: at most the decode in progress finishes).
A replica thread that fails ends the process (Fatal), as a replica process's death would.

    runner = StageRunner(replace(cfg, runner=replace(cfg.runner, execution="single")), replicas=4)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stages.platform import thread_stream
from stages.platform.partition import SmPartition, split_sms
from stages.runner.process import ProcessSpec, StageContext, run_stage_process
from stages.runner.replica_host import LockedSender, ReplicaThread, replica_work, start_replica_threads
from stages.runner.talker_proc import TalkerEngines, TalkerLoop, build_talker


@dataclass
class _Stages:
    talker: TalkerEngines
    replicas: list[ReplicaThread]


def single_main(spec: ProcessSpec, inbox: Any, replica_inboxes: list[Any], results: Any) -> None:
    """Process target (spawn): build the talker and the replica threads, run the talker loop."""
    run_stage_process(spec, LockedSender(results), lambda ctx: _build(ctx, replica_inboxes),
                      lambda ctx, stages: _serve(ctx, stages, inbox, replica_inboxes))


def _build(ctx: StageContext, replica_inboxes: list[Any]) -> _Stages:
    talker = build_talker(ctx)  # on ctx.device: the talker's (ProcessSpec.hosts_talker)
    # The replicas' threads; it leaves ctx.device current again for the talker loop.
    return _Stages(talker, start_replica_threads(ctx, replica_inboxes, partition=_replica_partition(ctx)))


def _replica_partition(ctx: StageContext) -> SmPartition | None:
    """With runner.talker_sms, the SMs of the talker's device left to the replicas there. The
    talker keeps the primary context, every SM: confined to the held ones it was slower."""
    count = ctx.spec.cfg.runner.talker_sms
    if not count:
        return None
    split = split_sms(ctx.device, count)
    ctx.info["sm_partition"] = {"device": str(ctx.device), **split.describe()}
    return split.rest


def _serve(ctx: StageContext, stages: _Stages, inbox: Any, replica_inboxes: list[Any]) -> None:
    with thread_stream(ctx.device, high_priority=True):
        SingleProcessTalker(ctx, stages.talker, replica_inboxes, replicas=stages.replicas).run(inbox)


@dataclass
class SingleProcessTalker(TalkerLoop):
    """The talker loop with its replicas as threads of the same process."""

    replicas: list[ReplicaThread] = field(default_factory=list)

    def _report_stats(self, token: int) -> None:
        work, voices = replica_work(self.replicas)
        self.ctx.report_stats(token, {"talker": self.work_snapshot(), **work}, voices)

    def _flush_sent(self, gone: tuple[int, ...]) -> None:
        # The sentinels go behind every payload sent, so a replica that reads its sentinel has
        # read (and decodes) everything before it; joining the threads is the flush. The queues
        # are not closed: in this process that would close the replicas' read ends too. (The
        # runner's stop kills the process if this outlasts its deadline.)
        for replica in self.replicas:
            replica.inbox.put(None)
        for replica in self.replicas:
            replica.thread.join()
