"""Model spec and the flat-vector view of a model's trainable state.

What travels between server and agents is one flat fp32 vector (or fp16/bf16
for updates): every floating-point parameter and buffer of the model's
state_dict, in state_dict order. Integer buffers (BatchNorm's
num_batches_tracked) stay local: they are counters, not state to average.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class ModelSpec:
    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    kwargs: dict[str, Any]
    entries: tuple[tuple[str, tuple[int, ...]], ...]

    @property
    def numel(self) -> int:
        return sum(math.prod(s) for _, s in self.entries)

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(s for _, s in self.entries)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "kwargs": dict(self.kwargs),
            "entries": [[n, list(s)] for n, s in self.entries],
            "numel": self.numel,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        return cls(
            name=d["name"],
            input_shape=tuple(d["input_shape"]),
            num_classes=int(d["num_classes"]),
            kwargs=dict(d.get("kwargs", {})),
            entries=tuple((n, tuple(s)) for n, s in d["entries"]),
        )


def float_state(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [(k, v) for k, v in model.state_dict(keep_vars=True).items() if v.is_floating_point()]


def spec_of(model: nn.Module, name: str, input_shape: tuple[int, ...], num_classes: int, **kwargs: Any) -> ModelSpec:
    return ModelSpec(
        name=name,
        input_shape=tuple(input_shape),
        num_classes=num_classes,
        kwargs=kwargs,
        entries=tuple((k, tuple(v.shape)) for k, v in float_state(model)),
    )


def build_from_spec(spec: ModelSpec) -> nn.Module:
    from hermes.common.models import build_model

    model = build_model(spec.name, input_shape=spec.input_shape, num_classes=spec.num_classes, **spec.kwargs)
    got = tuple((k, tuple(v.shape)) for k, v in float_state(model))
    if got != spec.entries:
        raise ValueError(f"model {spec.name!r} built here does not match the server's spec (versions differ?)")
    return model


@torch.no_grad()
def flatten(model: nn.Module, out: torch.Tensor | None = None) -> torch.Tensor:
    """The model's float state as one fp32 vector (written into ``out`` if given)."""
    tensors = [v.detach().reshape(-1) for _, v in float_state(model)]
    if out is None:
        return torch.cat(tensors).to(torch.float32)
    torch.cat(tensors, out=out)
    return out


@torch.no_grad()
def load_flat(model: nn.Module, flat: torch.Tensor) -> None:
    """Copy a flat vector into the model's float state, in place."""
    off = 0
    for _, v in float_state(model):
        n = v.numel()
        v.copy_(flat[off : off + n].view_as(v))
        off += n
    if off != flat.numel():
        raise ValueError(f"flat vector has {flat.numel()} elements, model has {off}")
