"""SGD with momentum and weight decay that does not import ``torch._dynamo``.

Every ``torch.optim.Optimizer`` imports ``torch._dynamo`` on its first
``add_param_group``/``zero_grad``/``step`` (they are wrapped in
``torch._disable_dynamo``, and ``step`` in ``_use_grad_for_differentiable``).
That import is the largest single cost of an agent's start-up after
``import torch``: 1 s on an idle 2-core machine, 5.6-6.0 s at load 9
(measured 2026-11-26, torch 2.13.0+cpu). The run config's default optimizer
is plain SGD, so the default path uses this class instead; a task's own
optimizer (``Task.optimizer``) is used as given and pays the import.

The update is ``torch.optim.SGD``'s with ``dampening=0, nesterov=False``
(the only settings the run config can express), element for element:
``d = g + wd * p``; ``b = d`` on the first step, else ``b = m * b + d``;
``p -= lr * b`` (``b = d`` when ``m = 0``). The momentum buffer lives in
``state[p]["momentum_buffer"]`` as in torch, so clearing ``state`` resets it
the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch


class LeanSGD(torch.optim.Optimizer):
    def __init__(self, params: Iterable[Any], lr: float, momentum: float = 0.0, weight_decay: float = 0.0) -> None:
        if lr <= 0.0 or momentum < 0.0 or weight_decay < 0.0:
            raise ValueError(f"LeanSGD: lr > 0, momentum >= 0, weight_decay >= 0 (got {lr}, {momentum}, "
                             f"{weight_decay})")
        # ``differentiable`` and friends: torch.optim.SGD's defaults, so state_dict() is shaped like its.
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "dampening": 0.0,
                                  "nesterov": False, "maximize": False, "foreach": None, "differentiable": False,
                                  "fused": None})

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        params = param_group["params"]
        param_group["params"] = [params] if isinstance(params, torch.Tensor) else list(params)
        for name, default in self.defaults.items():
            param_group.setdefault(name, default)
        seen = {id(p) for group in self.param_groups for p in group["params"]}
        if any(id(p) in seen for p in param_group["params"]):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_()
                    p.grad.requires_grad_(False)
                    p.grad.zero_()

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads: list[torch.Tensor] | tuple[torch.Tensor, ...] = [p.grad for p in params]
            lr, momentum, wd = group["lr"], group["momentum"], group["weight_decay"]
            if wd != 0.0:
                grads = torch._foreach_add(grads, params, alpha=wd)
            if momentum != 0.0:
                bufs = []
                for p, d in zip(params, grads):
                    state = self.state[p]
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = state["momentum_buffer"] = torch.clone(d).detach()
                    else:
                        buf.mul_(momentum).add_(d)
                    bufs.append(buf)
                grads = bufs
            torch._foreach_add_(params, grads, alpha=-lr)
        return loss
