"""A Dataset larger than the server should hold, served as shards over the real data plane.

The server runs in its own process (``python THIS_FILE serve ...``): a real
Engine with a lazy synthetic Dataset (each sample generated from its index
and a seed, never held whole) behind the real ZeroMQ DataPlane. The test
fetches every train and validation shard with the agent's DataClient,
checks samples against the generator, and reads the server's peak RSS
(VmHWM) from /proc: it must grow by less than 300 MB whatever the set's size.
The default size is 96 MB; the 1 GB run is marked slow.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

SHAPE = (3, 32, 32)
SAMPLE_BYTES = 4 * 3 * 32 * 32 + 8
SHARD_SIZE = 64
SEED = 7


class LazyImages(Dataset):
    """``n`` float32 images and int64 labels, each generated from its index: nothing is stored."""

    def __init__(self, n: int, seed: int = SEED) -> None:
        self.n, self.seed = n, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        return torch.randn(SHAPE, generator=g), torch.tensor(i % 10)


def _task(n: int):
    from hermes.common.models import build_model
    from hermes.common.task import Task

    return Task(name="lazy-images", model=lambda: build_model("mlp", input_shape=SHAPE, num_classes=10),
                train_data=LazyImages(n), test_data=LazyImages(256, seed=SEED + 1))


def _config():
    from hermes.common.config import build_config

    return build_config("asp", model="mlp", shard_size=SHARD_SIZE, eval_interval_seconds=3600.0)


def _serve(n: int) -> None:
    """The server process: engine + data plane; one registered worker's credentials on stdout."""
    from hermes.server.dataplane import DataPlane
    from hermes.server.engine import Engine
    from hermes.server.events import EventLog
    from hermes.server.metrics import ServerMetrics

    config = _config()

    async def main() -> None:
        engine = Engine(config, metrics=ServerMetrics(), events=EventLog(None), max_workers=4,
                        max_message_bytes=64 * 2**20, task=_task(n))
        plane = DataPlane(engine, "127.0.0.1", 0)
        port = await plane.start()
        rec, _ = engine.register("bulk")
        print(json.dumps({"address": f"tcp://127.0.0.1:{port}", "worker_id": rec.id, "token": rec.token,
                          "train_shards": engine.shards.num_shards,
                          "validation_shards": engine.validation_shards.num_shards}), flush=True)
        # Serve until the test closes our stdin.
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await plane.stop()

    asyncio.run(main())


def _rss_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/{pid}/status")


def _serve_and_fetch(n: int) -> dict:
    from hermes.client.shard_fetch import records_to_tensors
    from hermes.client.transport import DataClient
    from hermes.common.shards import decode_record
    from hermes.common.wire import MsgType
    from hermes.server.shardstore import load_splits

    proc = subprocess.Popen([sys.executable, __file__, "serve", str(n)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parent)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line, f"the server process exited ({proc.wait(30)}) before it served"
        info = json.loads(line)
        baseline_kb = _rss_kb(proc.pid, "VmRSS")
        client = DataClient(info["address"], info["worker_id"], info["token"], timeout=120.0,
                            max_message_bytes=256 * 2**20)
        # Which dataset index each train shard row is: the split's indices only, nothing materialised.
        train, validation, _ = load_splits(_config(), _task(n))
        t0 = time.perf_counter()
        fetched = 0
        peak_kb = baseline_kb
        for split, count in (("train", info["train_shards"]), ("validation", info["validation_shards"])):
            for start in range(0, count, 8):
                ids = list(range(start, min(start + 8, count)))
                reply = client.request(MsgType.FETCH_SHARD, {"shards": ids, "split": split})
                raw = reply.payload.flat().numpy()
                fetched += len(raw)
                lengths = reply.header.body["lengths"]
                offsets = np.cumsum([0, *lengths])
                records = [decode_record(memoryview(raw)[offsets[i]:offsets[i + 1]]) for i in range(len(ids))]
                if start % 200 == 0:  # spot-check samples against the generator
                    x, y = records_to_tensors(records[:1])
                    subset = train if split == "train" else validation
                    for row in (0, len(y) - 1):
                        want_x, want_y = subset[ids[0] * SHARD_SIZE + row]
                        assert torch.equal(x[row], want_x) and int(y[row]) == int(want_y)
                peak_kb = max(peak_kb, _rss_kb(proc.pid, "VmRSS"))
        seconds = time.perf_counter() - t0
        client.close()
        hwm_kb = _rss_kb(proc.pid, "VmHWM")
        return {"fetched_bytes": fetched, "seconds": seconds, "baseline_mb": baseline_kb / 1024,
                "growth_mb": (max(peak_kb, hwm_kb) - baseline_kb) / 1024}
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _check(n: int) -> dict:
    out = _serve_and_fetch(n)
    dataset_bytes = n * SAMPLE_BYTES
    # Every sample crossed the data plane once (plus the records' headers).
    assert dataset_bytes <= out["fetched_bytes"] <= dataset_bytes * 1.01
    assert out["growth_mb"] < 300, out
    print(f"\n{dataset_bytes / 2**20:.0f} MiB Dataset served in {out['seconds']:.1f}s; "
          f"server RSS {out['baseline_mb']:.0f} MiB + {out['growth_mb']:.0f} MiB peak growth")
    return out


def test_a_lazy_dataset_is_served_in_bounded_memory():
    _check(8_192)  # 96 MiB: larger than the shard cache, so the LRU evicts


@pytest.mark.slow
def test_a_1gb_lazy_dataset_is_served_with_under_300mb_server_growth():
    _check(87_382)  # 1 GiB of samples


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "serve":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _serve(int(sys.argv[2]))
