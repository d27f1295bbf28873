"""One rank of the torch DDP peer (gloo), started by torchrun through ``hermes-testbed --peer ddp``.

The same task as the testbed's agents: the data set, split and model built
by :mod:`hermes.common` from the ``bsp`` preset's run config (with the run's
``--set`` overrides), the same emulated heterogeneity (each rank sleeps
after each step ``(slowdown - 1)`` times the step's own compute time, as
the agent's trainer does) and the same link (see ``link_delay``).

Hyperparameters: the bsp preset's optimizer (SGD, its momentum and weight
decay), batch ``batch_size`` per rank, and the learning rate scaled linearly
with the global batch (Goyal et al. 2017, "Accurate, Large Minibatch SGD")
from the preset's own operating point: our bsp averages N workers' steps of
``lr`` on ``batch_size`` each, which is one step of ``lr`` on a global batch
of ``N * batch_size``; so ``lr = preset lr * global batch / (N * batch_size)``
(= the preset lr at the same batch), unless ``--lr`` is given. Scaling
from one worker's batch instead (``lr * N``) diverged: digits, HL8, 4 ranks,
momentum 0.9, lr 0.2 stuck at 0.20 accuracy for 60 s, where lr 0.05 reached
0.85 in 1.5 s.

Time to target starts once every rank has joined, loaded its data and built
its model (a barrier), as the testbed's ``train s`` starts at the agents'
join; rank 0 evaluates every ``--eval-every`` steps on the test split, and
the evaluation time is left out of the training clock (the server evaluates
in its own process). Rank 0 writes ``OUT/summary.json`` in the testbed's
schema (the fields ``hermes-bench`` aggregates).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hermes.common.atomic_write import write_atomic
from hermes.common.config import build_config
from hermes.common.models import count_parameters
from hermes.common.pace import SLOWDOWN_MODES, StepPacer
from hermes.common.task import Task, as_dataset, dataset_len
from hermes.common.task_registry import batch_of, resolve_task

log = logging.getLogger(__name__)


def process_started_at() -> float | None:
    """This process's start on the wall clock (Linux /proc, 10 ms resolution); None where unreadable.

    The ``alone`` baseline's time from launch starts here (interpreter start, imports, data, model), as the
    cluster's starts at its agents' launch: torchrun's own launcher, which a device training alone would not
    run, is left out.
    """
    try:
        # Field 22 (starttime, clock ticks after boot) is the 20th after the parenthesised command name.
        ticks = int(Path("/proc/self/stat").read_text().rpartition(")")[2].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def link_delay(nbytes: int, world: int, up_bps: float | None, down_bps: float | None, rtt: float) -> float:
    """Seconds a ring all-reduce of ``nbytes`` takes on the slowest rank's link.

    Ring all-reduce: 2(N-1) steps, each one message of nbytes/N one way per
    rank; the ring moves at its slowest link, and every step waits one
    one-way delay (RTT/2).
    """
    if world < 2:
        return 0.0
    moved = 2 * (world - 1) / world * nbytes * 8
    rates = [r for r in (up_bps, down_bps) if r]
    return (world - 1) * rtt + (moved / min(rates) if rates else 0.0)


def _link_hook(state: dict[str, Any], bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    t0 = time.perf_counter()
    tensor = bucket.buffer().div_(state["world"])
    fut = dist.all_reduce(tensor, async_op=True).get_future()
    nbytes = tensor.numel() * tensor.element_size()

    def done(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        # The link's time beyond what loopback took (gloo on one machine is not free).
        extra = link_delay(nbytes, state["world"], *state["link"]) - (time.perf_counter() - t0)
        if extra > 0:
            time.sleep(extra)
        state["allreduces"] += 1
        state["bytes"] += int(2 * (state["world"] - 1) / state["world"] * nbytes)
        return f.value()[0]

    return fut.then(done)


# torch checks a hook's annotations as objects; ``from __future__ import annotations`` made them strings.
_link_hook.__annotations__["bucket"] = dist.GradBucket
_link_hook.__annotations__["return"] = torch.futures.Future[torch.Tensor]


def powersgd_bucket_bytes(shapes: list[tuple[int, ...]], rank: int, min_compression_rate: float = 2.0) -> int:
    """Bytes one rank all-reduces for a bucket under torch's powerSGD_hook: P (m x r) and Q (n x r) in fp32 for
    each matrix it compresses (numel / ((m + n) r) >= min_compression_rate), every other tensor whole."""
    total = 0
    for shape in shapes:
        numel = 1
        for d in shape:
            numel *= d
        if len(shape) > 1:
            m, n = shape[0], numel // shape[0]
            r = min(m, n, rank)
            if numel >= min_compression_rate * (m + n) * r:
                total += 4 * (m + n) * r
                continue
        total += 4 * numel
    return total


def _compressed_link_hook(state: dict[str, Any], bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's own communication hooks (fp16_compress_hook, powerSGD_hook; Vogels et al. 2019) with the emulated
    link's delay for the bytes they send, as ``_link_hook`` adds it for the plain all-reduce."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    t0 = time.perf_counter()
    if state["hook"] == "fp16":
        nbytes = bucket.buffer().numel() * 2
        fut = default_hooks.fp16_compress_hook(None, bucket)  # type: ignore[arg-type]
    else:
        psgd = state["powersgd"]
        warm = psgd.iter < psgd.start_powerSGD_iter  # torch all-reduces vanilla until then
        nbytes = bucket.buffer().numel() * 4 if warm else \
            powersgd_bucket_bytes([tuple(p.shape) for p in bucket.parameters()], psgd.matrix_approximation_rank)
        fut = powerSGD_hook.powerSGD_hook(psgd, bucket)
        # Finished here, bucket by bucket: the hook chains its all-reduces (P, then Q) in callbacks, and with more
        # than one bucket (edge-resnet: DDP's 1 MB first bucket and the rest) gloo saw them interleave in another
        # order on each rank and aborted ("Received data size doesn't match expected size", 2026-11-27).
        fut.wait()

    def done(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        extra = link_delay(nbytes, state["world"], *state["link"]) - (time.perf_counter() - t0)
        if extra > 0:
            time.sleep(extra)
        state["allreduces"] += 1
        state["bytes"] += int(2 * (state["world"] - 1) / state["world"] * nbytes)
        return f.value()

    return fut.then(done)


_compressed_link_hook.__annotations__["bucket"] = dist.GradBucket
_compressed_link_hook.__annotations__["return"] = torch.futures.Future[torch.Tensor]


def _evaluate(task: Task, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(accuracy, loss) with the task's loss; accuracy is nan for a task without that metric."""
    model.eval()
    with torch.no_grad():
        out = model(x)
        loss = float(task.loss(out, y))
        fn = task.metric_fns.get("accuracy")
        acc = float(fn(out, y)) if fn is not None else float("nan")
    model.train()
    return acc, loss


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--overrides", default="{}", help="run-config overrides, JSON")
    p.add_argument("--slowdowns", required=True, help="per-rank slowdown factors, comma-separated")
    p.add_argument("--links", default="", help="per-rank UP_BPS/DOWN_BPS/RTT_S, comma-separated (empty: none)")
    p.add_argument("--target-accuracy", type=float, default=None)
    p.add_argument("--max-seconds", type=float, default=120.0)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--comm-hook", choices=("allreduce", "fp16", "powersgd"), default="allreduce",
                   help="DDP communication hook: plain all-reduce, fp16_compress_hook or powerSGD_hook")
    p.add_argument("--powersgd-rank", type=int, default=4, help="powerSGD_hook's matrix_approximation_rank")
    p.add_argument("--slowdown-mode", choices=SLOWDOWN_MODES, default="cpu",
                   help="cpu: sleep (slowdown - 1) x the forward and backward pass's work (default); floor: the "
                        "step (its optimizer step included, as an agent's) lasts slowdown x its uncontended cost "
                        "(common/pace.py); nominal: floor from --nominal-sample-ms")
    p.add_argument("--nominal-sample-ms", type=float, default=None,
                   help="--slowdown-mode nominal: the task's uncontended cost per sample in ms, the agents' too")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    cfg = build_config("bsp", **json.loads(a.overrides))
    torch.manual_seed(cfg.seed)
    # The run's task (builtin: the config's model on its dataset), with its loss and optimizer.
    task = resolve_task(cfg.task, cfg)
    assert task.train_data is not None and task.test_data is not None, "the DDP peer trains on the task's own data"
    train, test = as_dataset(task.train_data), as_dataset(task.test_data)
    model = task.model()
    global_batch = cfg.batch_size * world
    lr = a.lr if a.lr is not None else cfg.lr * global_batch / (world * cfg.batch_size)
    ddp = DistributedDataParallel(model)
    state: dict[str, Any] = {"world": world, "allreduces": 0, "bytes": 0, "link": (None, None, 0.0)}
    if a.links:
        specs = [tuple(float(v) for v in s.split("/")) for s in a.links.split(",")]
        # The ring runs at its slowest member's link, whatever rank this is.
        state["link"] = (min(s[0] for s in specs), min(s[1] for s in specs), max(s[2] for s in specs))
    # Always hooked, a lan link costing nothing: the hook also counts the all-reduces and their bytes.
    if a.comm_hook == "allreduce":
        ddp.register_comm_hook(state, _link_hook)
    else:
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

        state["hook"] = a.comm_hook
        # start_powerSGD_iter 2 (torch's default 1,000 is for long runs; ours reach a target in hundreds of
        # steps), error feedback and warm start on as in Vogels et al. 2019.
        state["powersgd"] = PowerSGDState(process_group=None, matrix_approximation_rank=a.powersgd_rank,
                                          start_powerSGD_iter=2, use_error_feedback=True, warm_start=True,
                                          random_seed=cfg.seed)
        ddp.register_comm_hook(state, _compressed_link_hook)
    opt = (task.optimizer(ddp.parameters()) if task.optimizer is not None else
           torch.optim.SGD(ddp.parameters(), lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay))
    slowdown = float(a.slowdowns.split(",")[rank])
    pacer = StepPacer(max(1.0, slowdown), a.slowdown_mode,
                      nominal_sample_seconds=None if a.nominal_sample_ms is None else a.nominal_sample_ms / 1000.0)
    x_all, y_all = batch_of(train, range(dataset_len(train)))
    n_eval = min(dataset_len(test), cfg.eval_max_samples)
    x_test, y_test = batch_of(test, range(n_eval))
    rng = np.random.default_rng(cfg.seed + rank)
    mine = np.arange(rank, dataset_len(train), world)  # this rank's share, as DistributedSampler deals it
    dist.barrier()
    t0 = time.time()
    started = process_started_at()
    startup = None if started is None else max(0.0, t0 - started)
    eval_seconds = compute = waited = 0.0
    steps = 0
    step_walls: list[float] = []  # each step's wall time, its sleep included: held against the nominal step
    timeline: list[dict[str, Any]] = []
    reached_at: float | None = None
    stop = torch.zeros(1)
    # Every rank the same number of steps per epoch: DDP all-reduces in lockstep.
    per_epoch = dataset_len(train) // world // cfg.batch_size
    while True:
        order = mine[rng.permutation(len(mine))]
        for step in range(per_epoch):
            idx = order[step * cfg.batch_size:(step + 1) * cfg.batch_size]
            s0, c0 = time.perf_counter(), time.thread_time()
            opt.zero_grad(set_to_none=True)
            task.loss(ddp(x_all[idx]), y_all[idx]).backward()
            work = min(time.perf_counter() - s0, time.thread_time() - c0)
            opt.step()
            if pacer.mode != "cpu":
                # The agent's trainer times its optimizer step too (client/trainer.py): the same window here.
                work = min(time.perf_counter() - s0, time.thread_time() - c0)
            # floor: the step's wall time counts where it holds no all-reduce (one rank: alone); with several
            # ranks it holds the others' and the link's time, so their CPU time stands for it.
            extra = pacer.sleep_seconds(work, len(idx), time.perf_counter() - s0 if world == 1 else None)
            compute += work + extra
            waited += time.perf_counter() - s0 - work
            if extra > 0:
                t1 = time.perf_counter()
                time.sleep(extra)  # the agent's delay injection, on compute only
                pacer.slept(extra, time.perf_counter() - t1)
            step_walls.append(time.perf_counter() - s0)
            steps += 1
            if steps % a.eval_every:
                continue
            train_s = time.time() - t0 - eval_seconds
            if rank == 0:
                e0 = time.time()
                acc, loss = _evaluate(task, model, x_test, y_test)
                eval_seconds += time.time() - e0
                timeline.append({"elapsed": round(train_s, 3), "version": steps, "accuracy": acc, "loss": loss})
                done = (a.target_accuracy is not None and acc >= a.target_accuracy) or train_s >= a.max_seconds
                if a.target_accuracy is not None and acc >= a.target_accuracy and reached_at is None:
                    reached_at = train_s
                stop.fill_(1.0 if done else 0.0)
            dist.broadcast(stop, 0)
            if stop.item() > 0:
                break
        else:
            continue
        break
    wall = time.time() - t0
    workers = [None] * world
    dist.all_gather_object(workers, {"name": f"rank-{rank}", "speed": 1 / slowdown, "slowdown": slowdown,
                                     "cycles": steps, "samples": steps * cfg.batch_size,
                                     "compute_seconds": round(compute, 3), "wait_seconds": round(waited, 3),
                                     "utilization": compute / wall if wall else None, "pushes": 0, "pulls": 0,
                                     "bytes_sent": state["bytes"], "bytes_received": state["bytes"],
                                     "messages": state["allreduces"], "step_ms": _percentiles_ms(step_walls)})
    if rank == 0:
        _write_summary(Path(a.out), cfg, a, lr, world, count_parameters(model), timeline, reached_at, wall,
                       steps, workers, startup)
    # Every rank past the summary before any tears gloo down: a rank whose peers had already
    # gone aborted in its destructor (measured: "terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


def _percentiles_ms(walls: list[float]) -> dict[str, float] | None:
    """p5, p50 and p95 of the steps' wall times, in ms (None: no step)."""
    if not walls:
        return None
    xs = sorted(walls)
    return {f"p{q}": round(1000.0 * xs[min(len(xs) - 1, len(xs) * q // 100)], 3) for q in (5, 50, 95)}


def _write_summary(out: Path, cfg: Any, a: argparse.Namespace, lr: float, world: int, params: int,
                   timeline: list[dict[str, Any]], reached_at: float | None, wall: float, steps: int,
                   workers: list[Any], startup: float | None = None) -> None:
    last = timeline[-1] if timeline else {}
    summary = {
        "preset": "ddp", "dataset": cfg.dataset, "model": cfg.model, "clients": world, "parameters": params,
        "outcome": "target reached" if reached_at is not None else "time limit",
        "wall_seconds": round(wall, 3), "target_accuracy": a.target_accuracy,
        "final_accuracy": last.get("accuracy"), "final_loss": last.get("loss"),
        "best_accuracy": max((e["accuracy"] for e in timeline), default=None),
        "reached_target": reached_at is not None,
        # From the barrier after every rank joined, evaluations left out: the testbed's "train s".
        "seconds_to_target": None if reached_at is None else round(reached_at, 3),
        "train_seconds_to_target": None if reached_at is None else round(reached_at, 3),
        # Rank 0's process start to the barrier (imports, data, model, gloo), and start-up plus training to
        # target (evaluations still left out): the cluster's time from its agents' launch has its counterpart.
        "startup_seconds": None if startup is None else round(startup, 3),
        "launch_seconds_to_target": None if reached_at is None or startup is None else round(reached_at + startup, 3),
        "model_updates": steps,
        "messages_total": sum(w["messages"] for w in workers),
        "messages_by_type": {"allreduce": sum(w["messages"] for w in workers)},
        "bytes_sent_total": sum(w["bytes_sent"] for w in workers),
        "bytes_received_total": sum(w["bytes_received"] for w in workers),
        "accuracy_timeline": timeline, "workers": workers,
        "ddp": {"backend": "gloo", "batch_per_rank": cfg.batch_size, "global_batch": cfg.batch_size * world,
                "lr": lr, "lr_rule": "given" if a.lr is not None else "linear in the global batch, anchored at bsp's "
                "(preset lr x global batch / (N x batch_size))",
                "momentum": cfg.momentum, "eval_every_steps": a.eval_every, "link_emulation": bool(a.links),
                "comm_hook": a.comm_hook, **({"powersgd_rank": a.powersgd_rank} if a.comm_hook == "powersgd" else {})},
    }
    write_atomic(out / "summary.json", json.dumps(summary, indent=2))
    log.info("ddp: %s; %d steps; lr %g", summary["outcome"], steps, lr)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
