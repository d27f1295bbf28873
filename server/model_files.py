"""The run's model files: ``OUT/model-final.safetensors`` and ``OUT/model-best.safetensors``.

Each is a standard ``state_dict`` of the run's module in the safetensors
layout: the module's own key names, shapes and dtypes, the integer buffers
(BatchNorm's ``num_batches_tracked``) included as the initial model has
them, since they never travel. Loading needs nothing from hermes::

    from safetensors.torch import load_file
    model.load_state_dict(load_file("runs/exp1/model-best.safetensors"))

The metadata (strings) says which model version it is, how it scored, and
the model spec (``spec``: parameter names, shapes, the task and its fingerprint).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import torch

from hermes.server.tensorfile import write_tensors

log = logging.getLogger(__name__)

FINAL_MODEL_FILE = "model-final.safetensors"
BEST_MODEL_FILE = "model-best.safetensors"


def standard_state_dict(template: Mapping[str, torch.Tensor], flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """``template``'s keys with the flat vector's values for its floating entries, in state_dict order.

    ``template`` is a state_dict of the run's module (its integer buffers are
    copied); ``flat`` holds every floating entry in that order (hermes.common.tensors).
    """
    out: dict[str, torch.Tensor] = {}
    off = 0
    for key, value in template.items():
        if value.is_floating_point():
            n = value.numel()
            if off + n > flat.numel():
                raise ValueError(f"flat model of {flat.numel()} elements is shorter than the module's state "
                                 f"(at {key!r})")
            out[key] = flat[off : off + n].reshape(value.shape).to(value.dtype).clone()
            off += n
        else:
            out[key] = value.detach().clone()
    if off != flat.numel():
        raise ValueError(f"flat model has {flat.numel()} elements, the module's floating state {off}")
    return out


def write_model(path: Path, template: Mapping[str, torch.Tensor], flat: torch.Tensor,
                metadata: Mapping[str, str]) -> bool:
    """Write one model file atomically; a failure (a full disk) is logged, not raised."""
    try:
        write_tensors(path, standard_state_dict(template, flat), dict(metadata))
    except (OSError, ValueError) as exc:
        log.error("writing the model to %s failed: %s", path, exc)
        return False
    return True
