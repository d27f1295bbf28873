"""A custom CNN trained on image files read from a folder by a custom ``Dataset``.

    hermes-testbed --task examples.image_folder:task --clients 4 --profile hl4 --preset hermes --target accuracy=0.9

Target: test accuracy 0.9, reached at HL4 with ``--preset hermes`` and with ``--preset bsp``.

The folder is laid out like torchvision's ``ImageFolder``: ``ROOT/train/<class>/<n>.pgm`` and
``ROOT/test/<class>/<n>.pgm``. On first use it is written from scikit-learn's digits (1797 8x8
images, no network) under ``$HERMES_EXAMPLES_CACHE`` (default ``~/.cache/hermes-examples``).
The files are binary PGM (P5) read by a dozen lines below, so the example needs no imaging
library; for PNG or JPEG files, read them with ``PIL.Image.open(path).convert("L")`` instead.

The dataset lists the folder on first access and opens one file per sample: the server reads
it (it cuts the training set into shards for the agents); an agent that only loads the task to
build the model never lists or writes the folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from hermes import Task


def cache_root() -> Path:
    return Path(os.environ.get("HERMES_EXAMPLES_CACHE", Path.home() / ".cache" / "hermes-examples"))


def write_pgm(path: Path, pixels: np.ndarray) -> None:
    """One 8-bit greyscale image as binary PGM: a text header, then the raw bytes row by row."""
    h, w = pixels.shape
    path.write_bytes(f"P5\n{w} {h}\n255\n".encode("ascii") + pixels.astype(np.uint8).tobytes())


def read_pgm(path: Path) -> np.ndarray:
    """An 8-bit binary PGM (P5) file as a (height, width) uint8 array."""
    data = path.read_bytes()
    fields: list[bytes] = []
    pos = 0
    while len(fields) < 4:  # magic, width, height, maxval; '#' starts a comment line
        while data[pos:pos + 1].isspace():
            pos += 1
        if data[pos:pos + 1] == b"#":
            pos = data.index(b"\n", pos) + 1
            continue
        end = pos
        while not data[end:end + 1].isspace():
            end += 1
        fields.append(data[pos:end])
        pos = end
    if fields[0] != b"P5" or int(fields[3]) > 255:
        raise ValueError(f"{path}: not an 8-bit binary PGM file")
    w, h = int(fields[1]), int(fields[2])
    return np.frombuffer(data, dtype=np.uint8, count=w * h, offset=pos + 1).reshape(h, w)


def digits_folder() -> Path:
    """The image folder, written once from scikit-learn's digits (80/20 split, stratified, seed 0)."""
    root = cache_root() / "digits-pgm"
    if root.is_dir():
        return root
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    pixels = (bunch.images * (255 / 16)).round().astype(np.uint8)
    idx = np.arange(len(pixels))
    train_idx, test_idx = train_test_split(idx, test_size=0.2, stratify=bunch.target, random_state=0)
    root.parent.mkdir(parents=True, exist_ok=True)
    # The server and a test may both come here first: each writes its own copy
    # and renames it into place; the loser's copy is thrown away.
    tmp = Path(tempfile.mkdtemp(prefix=".digits-pgm-", dir=root.parent))
    for split, ids in (("train", train_idx), ("test", test_idx)):
        for i in ids:
            folder = tmp / split / str(bunch.target[i])
            folder.mkdir(parents=True, exist_ok=True)
            write_pgm(folder / f"{i:04d}.pgm", pixels[i])
    try:
        tmp.rename(root)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


class ImageFolder(Dataset):
    """``root/<class>/<file>.pgm`` → (image float32 (1, H, W) in [0, 1], label int64), read on access."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @cached_property
    def files(self) -> list[tuple[Path, int]]:
        classes = sorted((p.name for p in self.root.iterdir() if p.is_dir()), key=int)
        files = [(f, c) for c, name in enumerate(classes) for f in sorted((self.root / name).glob("*.pgm"))]
        if not files:
            raise FileNotFoundError(f"no .pgm files under {self.root}")
        return files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        path, label = self.files[i]
        image = torch.from_numpy(read_pgm(path).astype(np.float32) / 255.0).unsqueeze(0)
        return image, torch.tensor(label, dtype=torch.int64)


class SmallCNN(nn.Module):
    """Two 3x3 convolutions and a pooling step for 8x8 greyscale images (~40K parameters)."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class DigitsFolder(ImageFolder):
    """The digits split ``split`` of :func:`digits_folder`, written on first access."""

    def __init__(self, split: str) -> None:
        super().__init__(Path(split))
        self.split = split

    @cached_property
    def files(self) -> list[tuple[Path, int]]:
        # The cache folder is found (and written) here, not at import: $HERMES_EXAMPLES_CACHE may be set later.
        self.root = digits_folder() / self.split
        return super().files


task = Task(model=SmallCNN, train_data=DigitsFolder("train"), test_data=DigitsFolder("test"), name="image-folder")
