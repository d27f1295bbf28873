"""Model spec and the flat-vector view of a model's trainable state.

What travels between server and agents is one flat fp32 vector (or fp16/bf16
for updates): every floating-point parameter and buffer of the model's
state_dict, in state_dict order. Integer buffers (BatchNorm's
num_batches_tracked) stay local: they are counters, not state to average.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """What both ends agree the model is: the task, its fingerprint and the float entries in flat order.

    Nothing here is enough to build the model: agents build it from their own
    copy of the task (``build_checked``), never from what the server sends.
    """

    # A label for people: the built-in model's name, or the model's class.
    name: str
    entries: tuple[tuple[str, tuple[int, ...]], ...]
    task: str = ""
    fingerprint: str = ""
    # One sample's input shape, as the task's data gives it (informational).
    input_shape: tuple[int, ...] = ()

    # Computed once (the spec is frozen): the push path reads both several times a push, and a model's
    # entries run to a hundred and more (issue 31's micro path).
    @cached_property
    def numel(self) -> int:
        return sum(math.prod(s) for _, s in self.entries)

    @cached_property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(s for _, s in self.entries)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "task": self.task,
            "fingerprint": self.fingerprint,
            "input_shape": list(self.input_shape),
            "entries": [[n, list(s)] for n, s in self.entries],
            "numel": self.numel,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        return cls(
            name=d["name"],
            task=str(d.get("task", "")),
            fingerprint=str(d.get("fingerprint", "")),
            input_shape=tuple(d.get("input_shape", ())),
            entries=tuple((n, tuple(s)) for n, s in d["entries"]),
        )


def float_state(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [(k, v) for k, v in model.state_dict(keep_vars=True).items() if v.is_floating_point()]


def spec_of(model: nn.Module, name: str, *, task: str = "", input_shape: tuple[int, ...] = ()) -> ModelSpec:
    from hermes.common.task import fingerprint

    return ModelSpec(
        name=name,
        task=task,
        fingerprint=fingerprint(model),
        input_shape=tuple(input_shape),
        entries=tuple((k, tuple(v.shape)) for k, v in float_state(model)),
    )


def build_checked(model_fn: Callable[[], nn.Module], spec: ModelSpec) -> nn.Module:
    """``model_fn()``, checked against the server's spec: the same fingerprint and float entries."""
    from hermes.common.task import fingerprint

    model = model_fn()
    got = tuple((k, tuple(v.shape)) for k, v in float_state(model))
    if got != spec.entries or (spec.fingerprint and fingerprint(model) != spec.fingerprint):
        raise ValueError(f"the model of task {spec.task or spec.name!r} built here does not match the server's "
                         f"(fingerprint {fingerprint(model)} here, {spec.fingerprint or '?'} there)")
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
