"""LeanSGD: torch.optim.SGD's update, element for element, without importing torch._dynamo."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from hermes.common.lean_sgd import LeanSGD


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


@pytest.mark.parametrize(("momentum", "weight_decay"), [(0.0, 0.0), (0.9, 0.0), (0.9, 1e-3), (0.0, 5e-4)])
def test_same_parameters_as_torch_sgd_step_for_step(momentum: float, weight_decay: float) -> None:
    ours, theirs = _model(0), _model(0)
    opt_ours = LeanSGD(ours.parameters(), lr=0.1, momentum=momentum, weight_decay=weight_decay)
    opt_theirs = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=momentum, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(1)
    for step in range(6):
        x, y = torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)
        for model, opt in ((ours, opt_ours), (theirs, opt_theirs)):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            if step == 3:  # the agent's reset after a pull: momentum starts again
                opt.state.clear()
            if step == 4:  # the server's lr scaling writes the groups' rate
                opt.param_groups[0]["lr"] = 0.03
            opt.step()
        for a, b in zip(ours.parameters(), theirs.parameters()):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
    if momentum:
        assert all("momentum_buffer" in opt_ours.state[p] for p in ours.parameters())


def test_a_parameter_without_grad_is_left_alone_and_zero_grad_keeps_or_drops_grads() -> None:
    model = _model(0)
    frozen = model[0].weight
    before = frozen.detach().clone()
    opt = LeanSGD(model.parameters(), lr=0.5, momentum=0.9)
    model[2](torch.randn(2, 5)).sum().backward()  # only the last layer gets gradients
    opt.step()
    assert torch.equal(frozen, before) and frozen not in opt.state
    opt.zero_grad(set_to_none=False)
    assert model[2].weight.grad is not None and not model[2].weight.grad.any()
    opt.zero_grad()
    assert model[2].weight.grad is None


def test_bad_arguments_and_duplicate_parameters_are_refused() -> None:
    model = _model(0)
    with pytest.raises(ValueError, match="lr > 0"):
        LeanSGD(model.parameters(), lr=0.0)
    with pytest.raises(ValueError, match="more than one parameter group"):
        LeanSGD([{"params": list(model.parameters())}, {"params": [model[0].weight]}], lr=0.1)


def test_training_with_it_never_imports_dynamo() -> None:
    code = (
        "import sys, torch\n"
        "from hermes.common.lean_sgd import LeanSGD\n"
        "m = torch.nn.Linear(4, 2)\n"
        "o = LeanSGD(m.parameters(), lr=0.1, momentum=0.9)\n"
        "for _ in range(2):\n"
        "    o.zero_grad(); m(torch.randn(3, 4)).sum().backward(); o.step()\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False", out.stderr
