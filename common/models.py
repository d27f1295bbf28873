"""The model zoo: small classifiers that the server and the agents build alike.

Every model is built from ``(name, input_shape, num_classes)`` alone, so both
ends of the wire can construct the same architecture and exchange flat
parameter vectors. Construction draws only from torch's global generator:
the same ``torch.manual_seed`` gives bit-identical initial weights.

``input_shape`` excludes the batch dimension: ``(C, H, W)`` for images,
``(C, L)`` for 1-D signals, ``(D,)`` for flat vectors.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

MODEL_NAMES = ("cnn", "alexnet", "resnet18", "mlp", "edge-resnet")

# The cnn caps its flattened feature map at 7x7 (what a 28x28 MNIST image
# leaves after two 2x poolings), so larger inputs do not blow up fc1.
_CNN_MAX_2D = (7, 7)
_CNN_MAX_1D = 49
_RESNET_MIN_SIDE = 8


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters (trainable or not) in ``model``."""
    return sum(p.numel() for p in model.parameters())


def build_model(
    name: str, *, input_shape: Sequence[int], num_classes: int, **kwargs: Any
) -> nn.Module:
    """Build the model called ``name`` for inputs of ``input_shape``.

    Raises ``ValueError`` for an unknown name, a malformed shape or a shape the
    model cannot take, and ``TypeError`` for keyword arguments it does not know.
    """
    builder = _BUILDERS.get(name)
    if builder is None:
        raise ValueError(
            f"unknown model {name!r} (input_shape {input_shape!r}); "
            f"expected one of {MODEL_NAMES}"
        )
    shape = _check_shape(name, input_shape)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"model {name!r}: num_classes must be an int >= 2, got {num_classes!r}")
    model = builder(shape, num_classes, **kwargs)
    logger.debug(
        "built %s for input %s, %d classes: %d parameters",
        name, shape, num_classes, count_parameters(model),
    )
    return model


def _check_shape(name: str, input_shape: Sequence[int]) -> tuple[int, ...]:
    try:
        shape = tuple(input_shape)
    except TypeError:
        shape = ()
    ok = 1 <= len(shape) <= 3 and all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape
    )
    if not ok:
        raise ValueError(
            f"model {name!r}: input_shape {input_shape!r} is not usable; expected a tuple of "
            "1 to 3 positive ints without the batch dim: (C, H, W), (C, L) or (D,)"
        )
    return shape


# ---------------------------------------------------------------- cnn


def _pool_kernel(size: int) -> int:
    # A side of length 1 is left alone: pooling must never shrink it to 0.
    return 2 if size >= 2 else 1


def _pooled(size: int) -> int:
    k = _pool_kernel(size)
    return math.ceil(size / k)


class _CNN(nn.Module):
    """Two 5x5 "same" convs (16, 32 channels), each followed by ReLU and 2x
    max pooling, then fc(64) and the classifier.

    On (1, 28, 28) with 10 classes this has 114,314 parameters, the size of the
    MNIST CNN used in the Hermes paper; a 1-D input swaps in Conv1d/MaxPool1d
    with the same structure.
    """

    def __init__(self, shape: tuple[int, ...], num_classes: int, hidden: int = 64) -> None:
        super().__init__()
        if len(shape) == 1:
            # A flat vector is a one-channel signal; reshape inside the model so
            # callers can feed (N, D) batches as they are.
            self.reshape: nn.Module = nn.Unflatten(1, (1, shape[0]))
            shape = (1, shape[0])
        else:
            self.reshape = nn.Identity()
        channels, spatial = shape[0], shape[1:]
        conv, pool, adaptive = (
            (nn.Conv2d, nn.MaxPool2d, nn.AdaptiveAvgPool2d)
            if len(spatial) == 2
            else (nn.Conv1d, nn.MaxPool1d, nn.AdaptiveAvgPool1d)
        )
        after_one = tuple(_pooled(s) for s in spatial)
        after_two = tuple(_pooled(s) for s in after_one)
        if len(spatial) == 2:
            out_size: tuple[int, ...] = tuple(min(s, m) for s, m in zip(after_two, _CNN_MAX_2D))
        else:
            out_size = (min(after_two[0], _CNN_MAX_1D),)
        self.features = nn.Sequential(
            conv(channels, 16, kernel_size=5, padding=2),
            nn.ReLU(inplace=True),
            pool(tuple(_pool_kernel(s) for s in spatial), ceil_mode=True),
            conv(16, 32, kernel_size=5, padding=2),
            nn.ReLU(inplace=True),
            pool(tuple(_pool_kernel(s) for s in after_one), ceil_mode=True),
            adaptive(out_size),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(32 * math.prod(out_size), hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.classifier(self.features(self.reshape(x)))
        return out


def _build_cnn(shape: tuple[int, ...], num_classes: int, **kwargs: Any) -> nn.Module:
    _reject_kwargs("cnn", kwargs, allowed=("hidden",))
    return _CNN(shape, num_classes, **kwargs)


# ---------------------------------------------------------------- alexnet


def _require_image(name: str, shape: tuple[int, ...], min_side: int = 1) -> None:
    if len(shape) != 3 or min(shape[1:]) < min_side:
        sides = f" with H, W >= {min_side}" if min_side > 1 else ""
        raise ValueError(
            f"model {name!r} cannot take input_shape {shape}: it needs an image shape "
            f"(C, H, W){sides}, e.g. (3, 32, 32); "
            "use 'cnn' or 'mlp' for 1-D or flat inputs"
        )


class _AlexNet(nn.Module):
    """AlexNet's layout (5 convs, 3 fcs) shrunk for 32x32 images.

    3x3 kernels and three 2x poolings take 32x32 to 4x4; an adaptive pool
    pins that 4x4 so other image sizes reuse the same classifier. No dropout:
    train and eval mode compute the same function, which keeps gradient
    checks and update gating simple.
    """

    def __init__(self, shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, height, width = shape
        sides: list[tuple[int, int]] = [(height, width)]
        for _ in range(2):
            h, w = sides[-1]
            sides.append((_pooled(h), _pooled(w)))

        def pool(i: int) -> nn.Module:
            return nn.MaxPool2d(tuple(_pool_kernel(s) for s in sides[i]), ceil_mode=True)

        self.features = nn.Sequential(
            nn.Conv2d(channels, 48, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            pool(0),
            nn.Conv2d(48, 96, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            pool(1),
            nn.Conv2d(96, 160, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(160, 160, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(160, 96, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            pool(2),
            nn.AdaptiveAvgPool2d((4, 4)),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(96 * 4 * 4, 256),
            nn.ReLU(inplace=True),
            nn.Linear(256, 128),
            nn.ReLU(inplace=True),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.classifier(self.features(x))
        return out


def _build_alexnet(shape: tuple[int, ...], num_classes: int, **kwargs: Any) -> nn.Module:
    _reject_kwargs("alexnet", kwargs, allowed=())
    _require_image("alexnet", shape)
    return _AlexNet(shape, num_classes)


# ---------------------------------------------------------------- resnet18


class _BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int,
                 norm: Callable[[int], nn.Module] = nn.BatchNorm2d) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = norm(planes)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                norm(planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out = self.relu(out + self.shortcut(x))
        return out


class _ResNet18(nn.Module):
    """The CIFAR ResNet-18: 3x3 stem, no max pool, BasicBlocks [2, 2, 2, 2]
    with widths 64-512, global average pool (11,173,962 parameters for 10
    classes)."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
        )
        stages: list[nn.Module] = []
        in_planes = 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(
                nn.Sequential(
                    _BasicBlock(in_planes, planes, stride), _BasicBlock(planes, planes, 1)
                )
            )
            in_planes = planes
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.pool(self.stages(self.stem(x)))
        logits: torch.Tensor = self.fc(torch.flatten(out, 1))
        return logits


def _build_resnet18(shape: tuple[int, ...], num_classes: int, **kwargs: Any) -> nn.Module:
    _reject_kwargs("resnet18", kwargs, allowed=())
    # Below 8x8 the three stride-2 stages leave 1x1 maps long before the end.
    _require_image("resnet18", shape, min_side=_RESNET_MIN_SIDE)
    return _ResNet18(shape[0], num_classes)


# ---------------------------------------------------------------- edge-resnet


class _EdgeResNet(nn.Module):
    """An edge-sized residual CNN for 32x32 colour images (issue 31): a 3x3 stem of ``width`` channels, then
    one BasicBlock per stage at widths 2w, 4w, 8w, each halving the side (32 -> 16 -> 8 -> 4), global average
    pool. With w = 32 and 10 classes: 1,210,410 parameters (4.9 MB in fp32, a MobileNetV2's order), about 43M
    multiply-adds a 32x32 image (ResNet-18: 556M), so that 2 shared CPU cores train it at all. ``stem_stride`` 2
    halves the side in the stem (32 -> 16 -> 8 -> 4 -> 2): the same parameters and bytes a push, a quarter of the
    multiply-adds (about 11M), for benches where a loaded machine cannot afford the full-size compute.

    ``norm`` "group": GroupNorm (Wu and He 2018; gcd(32, C) groups of the C channels) instead of BatchNorm, as
    Hsieh et al. 2020 ("The Non-IID Data Quagmire of Decentralized Machine Learning", Sec. 5) recommend for
    decentralised training: the same parameters, no running statistics. Asynchronous presets add each worker's
    change to the model; BatchNorm's running variance is a moving average, and the changes of several workers
    that left the same model each move it part of the way to their batches' variance, so their sum overshoots,
    below zero (measured: asp on edge-resnet, lte, 2026-11-27: evaluation loss NaN within 10 s)."""

    def __init__(self, in_channels: int, num_classes: int, width: int, stem_stride: int = 1,
                 norm: str = "batch") -> None:
        super().__init__()
        make_norm: Callable[[int], nn.Module] = (
            nn.BatchNorm2d if norm == "batch" else (lambda c: nn.GroupNorm(math.gcd(32, c), c)))
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, stride=stem_stride, padding=1, bias=False),
            make_norm(width),
            nn.ReLU(inplace=True),
        )
        self.stages = nn.Sequential(
            _BasicBlock(width, 2 * width, 2, make_norm), _BasicBlock(2 * width, 4 * width, 2, make_norm),
            _BasicBlock(4 * width, 8 * width, 2, make_norm),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.pool(self.stages(self.stem(x)))
        logits: torch.Tensor = self.fc(torch.flatten(out, 1))
        return logits


def _build_edge_resnet(shape: tuple[int, ...], num_classes: int, *, width: int = 32, stem_stride: int = 1,
                       norm: str = "batch", **kwargs: Any) -> nn.Module:
    _reject_kwargs("edge-resnet", kwargs, allowed=("width", "stem_stride", "norm"))
    if norm not in ("batch", "group"):
        raise ValueError(f"model 'edge-resnet': norm must be 'batch' or 'group', got {norm!r}")
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"model 'edge-resnet': width must be a positive int, got {width!r}")
    if stem_stride not in (1, 2) or isinstance(stem_stride, bool):
        raise ValueError(f"model 'edge-resnet': stem_stride must be 1 or 2, got {stem_stride!r}")
    _require_image("edge-resnet", shape, min_side=_RESNET_MIN_SIDE * stem_stride)
    return _EdgeResNet(shape[0], num_classes, width, stem_stride, norm)


# ---------------------------------------------------------------- mlp


def _build_mlp(
    shape: tuple[int, ...], num_classes: int, *, hidden: Sequence[int] = (256, 128), **kwargs: Any
) -> nn.Module:
    _reject_kwargs("mlp", kwargs, allowed=("hidden",))
    sizes = tuple(hidden)
    if not all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in sizes):
        raise ValueError(f"model 'mlp': hidden must be positive ints, got {hidden!r}")
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(shape)
    for h in sizes:
        layers += [nn.Linear(width, h), nn.ReLU(inplace=True)]
        width = h
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def _reject_kwargs(name: str, kwargs: dict[str, Any], *, allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise TypeError(
            f"model {name!r} got unknown keyword arguments {unknown}; "
            f"it accepts {list(allowed) or 'none'}"
        )


_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "cnn": _build_cnn,
    "alexnet": _build_alexnet,
    "resnet18": _build_resnet18,
    "mlp": _build_mlp,
    "edge-resnet": _build_edge_resnet,
}
