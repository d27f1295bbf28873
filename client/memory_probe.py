"""Training memory as a function of batch size, measured on this device (OmniLearn Eq. 9).

OmniLearn fits M(b) = m0 + m1*b from measurements on each worker: model,
gradients and optimizer state do not depend on b; activations and the batch
itself grow linearly in it (Fig. 6). On CUDA the allocator's peak is the
measurement. On CPU there is no allocator peak to read, so we count what a
training step keeps alive: the parameters, their gradients and momentum
buffers, the input batch, and every tensor autograd saves for backward
(deduplicated by storage), which is what grows with the batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from hermes.common.task import LossFn

log = logging.getLogger(__name__)

# The batch sizes the probe measures: enough points for the line, small enough for any device.
PROBE_BATCH_SIZES = (2, 4, 8)


def _step_bytes_cpu(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn) -> int:
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(model(x), y)
    loss.backward()
    state = sum(p.numel() * p.element_size() for p in model.parameters())
    # parameters + gradients + one momentum buffer (SGD); the batch; the saved activations.
    return 3 * state + x.numel() * x.element_size() + sum(storages.values())


def _step_bytes_cuda(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn) -> int:
    torch.cuda.synchronize(x.device)
    torch.cuda.reset_peak_memory_stats(x.device)
    loss = loss_fn(model(x), y)
    loss.backward()
    torch.cuda.synchronize(x.device)
    # Momentum buffers are allocated at the first optimizer step, which this probe does not take.
    return torch.cuda.max_memory_allocated(x.device) + sum(p.numel() * p.element_size() for p in model.parameters())


def memory_profile(model: nn.Module, example: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
                   device: torch.device, batch_sizes: tuple[int, ...] = PROBE_BATCH_SIZES,
                   loss: LossFn = F.cross_entropy) -> list[tuple[int, int]]:
    """[(batch size, bytes of one training step)] at a few batch sizes, on ``example(batch_size)`` batches
    of the task's data with its loss; gradients are cleared afterwards."""
    measure = _step_bytes_cuda if device.type == "cuda" else _step_bytes_cpu
    out = []
    was_training = model.training
    model.train()
    try:
        for batch_size in batch_sizes:
            x, y = (t.to(device) for t in example(batch_size))
            model.zero_grad(set_to_none=True)
            out.append((int(len(y)), int(measure(model, x, y, loss))))
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    log.debug("memory profile: %s", out)
    return out


def available_memory_bytes(device: torch.device) -> int:
    """Free memory for training on ``device`` now; 0 when the platform will not say."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        import os

        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0
