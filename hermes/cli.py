"""``hermes``: the project command. ``hermes new DIR`` writes a working task and the commands to run it.

The template trains as written: its data are generated (no download), its
model is small, and its README's commands are those of this version's
``hermes-testbed``, ``hermes-server`` and ``hermes-client`` (a test checks
every flag it uses against their ``--help``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_OK, EXIT_USAGE = 0, 2

TASK_PY = '''"""{name}: a Hermes-edge task. Replace the data, model, loss and metrics with yours.

Run it (README.md): ``hermes-testbed --task task.py:task --clients 2`` or ``python train.py``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from hermes import Task

FEATURES, CLASSES = 16, 4


def make_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian blobs, one per class: generated, so the task runs anywhere without a download."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(0).normal(scale=2.0, size=(CLASSES, FEATURES))
    y = rng.integers(0, CLASSES, size=n)
    x = centres[y] + rng.normal(size=(n, FEATURES))
    return x.astype(np.float32), y.astype(np.int64)


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES))


def accuracy(output: torch.Tensor, target: torch.Tensor) -> float:
    return float((output.argmax(dim=1) == target).double().mean())


task = Task(
    name="{name}",
    model=model,
    train_data=make_data(4000, seed=1),
    test_data=make_data(1000, seed=2),
    loss=nn.functional.cross_entropy,
    metrics={{"accuracy": accuracy}},
)
'''

TRAIN_PY = '''"""Train the task from Python: a server and agents in this process (hermes.train)."""

import hermes
from task import task

if __name__ == "__main__":
    result = hermes.train(task, agents=2, preset="asp", target="accuracy=0.95", max_seconds=60)
    print(result.outcome, result.metrics, result.model_path)
'''

README = '''# {name}

A Hermes-edge task written by `hermes new`. `task.py` holds the model, data,
loss and metrics; change them to yours (docs/extending.md in Hermes-edge for
hooks, callbacks and plug-in policies).

## One machine: server and agents as processes (testbed)

```
cd {dir}
hermes-testbed --task task.py:task --clients 2 --preset asp --target accuracy=0.95 --max-seconds 120 --out runs/testbed
```

## From Python

```
cd {dir}
python train.py
```

## Server and agents on different machines

On the server (the join token is a secret shared with the agents):

```
cd {dir}
python -c "import secrets; print(secrets.token_hex(32))" > join.token
hermes-server --task task.py:task --join-token-file join.token --preset asp --target accuracy=0.95 --out runs/server
```

On each device (a copy of this folder and the same join.token):

```
cd {dir}
hermes-client --server http://SERVER:8000 --task task.py:task --join-token-file join.token --name device-1
```
'''


def new_project(target: Path, *, force: bool = False) -> list[Path]:
    """Write task.py, train.py and README.md into ``target``; refuses to overwrite unless ``force``."""
    files = {"task.py": TASK_PY, "train.py": TRAIN_PY, "README.md": README}
    existing = [name for name in files if (target / name).exists()]
    if existing and not force:
        raise FileExistsError(f"{target} already holds {', '.join(existing)}: choose another DIR or pass --force")
    target.mkdir(parents=True, exist_ok=True)
    name = "".join(c if c.isalnum() or c in "-_" else "-" for c in target.resolve().name) or "task"
    written = []
    for file, template in files.items():
        path = target / file
        path.write_text(template.format(name=name, dir=target))
        written.append(path)
    return written


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hermes", description="Hermes-edge project tools.")
    sub = p.add_subparsers(dest="command", required=True)
    new = sub.add_parser("new", help="write a working task, a training script and a README with the commands")
    new.add_argument("dir", type=Path, metavar="DIR", help="folder to create (or an empty one)")
    new.add_argument("--force", action="store_true", help="overwrite task.py, train.py and README.md there")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "new":
        try:
            written = new_project(args.dir, force=args.force)
        except (FileExistsError, OSError) as exc:
            print(f"hermes new: {exc}", file=sys.stderr)
            return EXIT_USAGE
        print(f"wrote {', '.join(p.name for p in written)} in {args.dir}; next: cd {args.dir} && "
              "hermes-testbed --task task.py:task --clients 2 (README.md has the other ways)")
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
