"""What travels beside a compressed buffer (``CodecSpec``) and the bounds a receiver holds it to.

Torch-free, shared by the compression policy (common/policies/compression.py, which the run
config reads) and the codecs themselves (common/codecs.py, torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Shapes = Sequence[tuple[int, ...]]

# Bounds of what a receiver accepts in a CodecSpec (the buffer's size follows from them and the spec).
MAX_CHUNK = 1 << 20
MAX_RANK = 64


class CodecSpec(BaseModel):
    """What a receiver needs to decode a buffer besides the model's spec; travels in the message body."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: Literal["fp16", "bf16", "int8", "topk", "powersgd"]
    chunk: int | None = Field(default=None, ge=16, le=MAX_CHUNK)
    k: int | None = Field(default=None, ge=0)
    rank: int | None = Field(default=None, ge=1, le=MAX_RANK)


class CodecError(ValueError):
    """A buffer that does not match its CodecSpec and the model's spec."""
