"""Compression of updates and models on the wire: the ``compression`` policy kind, one per direction.

``compression.push`` compresses what an agent pushes (the change of its model),
``compression.pull`` what the server sends back (the model). Each codec is a
registered policy whose parameters live in its own section (``int8.chunk``,
``topk.ratio``, ``powersgd.rank``); ``compression.error_feedback`` switches the
residual on the compressing side (Karimireddy et al. 2019, EF-SGD).

A codec turns an fp32 vector into one byte buffer and back (``encode`` /
``decode``); the receiver's decoder is stateless and bounded by the model's
spec: the byte count a buffer must have follows from the spec's shapes and the
``CodecSpec`` that travels with it in the message body, and anything else is
refused. State lives on the sender only (the EF residual, PowerSGD's warm start
``Q``, the stochastic-rounding generator) and round-trips through
``state_dict`` / ``load_state_dict``, so a resumed sender continues exactly.

Layouts (little endian, one buffer):

- ``fp16`` / ``bf16``: the n halves.
- ``int8`` (QSGD, Alistarh et al. 2017, with s = 127 levels and one scale per
  chunk as 8-bit hivemind does): ceil(n / chunk) fp32 scales, then n int8.
- ``topk`` (Lin et al. 2018, DGC; Stich et al. 2018): k int32 indices (strictly increasing), then k fp32 values.
- ``powersgd`` (Vogels et al. 2019, Alg. 1): in spec order, for a matrix-shaped
  entry that rank r compresses ((m + n) r < m n) the fp32 factors P (m x r) then
  Q (n x r); every other entry (vectors, biases) as its fp32 values.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from hermes.common.codec_spec import MAX_CHUNK, MAX_RANK, CodecError, CodecSpec, Shapes
from hermes.common.policies.base import Core, Policy, canonical, get, register

if TYPE_CHECKING:
    from hermes.common.codecs import Codec

__all__ = ["CODEC_NAMES", "MAX_CHUNK", "MAX_RANK", "CodecError", "CodecSpec", "CompressionParams", "Shapes",
           "check_choice", "canonical_codec"]

log = logging.getLogger(__name__)

CODEC_NAMES = ("none", "fp16", "bf16", "int8", "topk", "powersgd")


class CompressionParams(BaseModel):
    """The run config's ``compression`` section: the codec of each direction and the error-feedback switch."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    push: str = Field(default="none", description="Codec of pushed updates: none, fp16, bf16, int8, topk, powersgd.")
    pull: str = Field(default="none", description="Codec of the model agents receive: none, fp16, bf16, int8 "
                                                  "(topk and powersgd compress changes, not models: refused).")
    error_feedback: bool = Field(
        default=True, description="Keep what the push codec dropped and add it to the next push (Karimireddy et al. "
                                  "2019, EF-SGD Alg. 2); false: drop it (the paper's biased baseline).")


class Int8Params(BaseModel):
    """The run config's ``int8`` section (codec 'int8')."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    chunk: int = Field(default=1024, ge=16, le=MAX_CHUNK, description="Elements per fp32 scale (4 bytes per chunk "
                                                                         "on top of one byte per element).")
    stochastic: bool = Field(default=True, description="Stochastic rounding (QSGD: unbiased, error < one step); "
                                                       "false: round to nearest (error <= half a step, biased).")


class TopKParams(BaseModel):
    """The run config's ``topk`` section (codec 'topk')."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    # 8 bytes per kept element: a ratio of 1/16 is 1/8 of fp32's bytes.
    ratio: float = Field(default=0.01, gt=0.0, le=1.0, description="Share of the elements kept (the largest by "
                                                                   "magnitude); 8 bytes each.")
    selection: Literal["sampled", "full"] = Field(
        default="sampled", description="How the k largest are found: sampled (DGC's sampled threshold, Lin et al. "
                                       "2018 Sec. 3, as a prefilter; the same k elements, 2.4-2.7x faster at 1.2M) or "
                                       "full (torch.topk over every element).")
    sample: float = Field(default=0.01, gt=0.0, le=1.0, description="Share of the elements sampled to estimate "
                                                                    "the threshold (selection=sampled).")


class PowerSgdParams(BaseModel):
    """The run config's ``powersgd`` section (codec 'powersgd')."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    rank: int = Field(default=4, ge=1, le=MAX_RANK, description="Rank r of each matrix's approximation P Q^T "
                                                                "(Vogels et al. 2019).")


# ---- the registry's side: one policy per codec -------------------------------------------------------------


class Compression(Policy):
    """A codec as the run chooses it (``compression.push`` / ``compression.pull``)."""

    sections: ClassVar[tuple[str, ...]] = ("compression", "int8", "topk", "powersgd")
    # The codec compresses a whole model (a pull) as well as a change: a change-only codec would need the
    # server to keep every agent's copy of the model.
    compresses_models: ClassVar[bool] = True
    # Gradients compressed by this codec can be summed by an all-reduce (client/collective.py).
    all_reduce: ClassVar[bool] = True
    # Fraction of fp32's bytes, for messages and docs (an estimate for powersgd: the spec decides).
    wire_bytes_per_fp32: ClassVar[float] = 1.0

    @classmethod
    def make(cls, core: Core, **sections: Any) -> Codec | None:
        """The bare codec (None for 'none')."""
        return None

    @classmethod
    def build(cls, core: Core, *args: Any, compression: CompressionParams | None = None, **sections: Any) -> Any:
        from hermes.common.codecs import ErrorFeedback

        codec = cls.make(core, **sections)
        if codec is None:
            return None
        return ErrorFeedback(codec) if compression is not None and compression.error_feedback else codec


@register("compression", "none", "fp32", "float32")
class NoCompression(Compression):
    """fp32 as it is."""


@register("compression", "fp16", "float16")
class Fp16(Compression):
    """IEEE half precision (DDP's fp16_compress_hook)."""

    wire_bytes_per_fp32 = 0.5

    @classmethod
    def make(cls, core: Core, **sections: Any) -> Codec:
        from hermes.common.codecs import Fp16Codec

        return Fp16Codec()


@register("compression", "bf16", "bfloat16")
class Bf16(Compression):
    """bfloat16: fp32's range, 8 bits of mantissa."""

    wire_bytes_per_fp32 = 0.5

    @classmethod
    def make(cls, core: Core, **sections: Any) -> Codec:
        from hermes.common.codecs import Bf16Codec

        return Bf16Codec()


@register("compression", "int8")
class Int8(Compression):
    """QSGD-style 8-bit quantisation with per-chunk scales and stochastic rounding (Alistarh et al. 2017)."""

    all_reduce = False
    wire_bytes_per_fp32 = 0.25

    @classmethod
    def make(cls, core: Core, *, int8: Int8Params | None = None, **sections: Any) -> Codec:
        from hermes.common.codecs import Int8Codec

        p = int8 or Int8Params()
        return Int8Codec(p.chunk, p.stochastic, core.seed)


@register("compression", "topk")
class TopK(Compression):
    """Top-k sparsification (Lin et al. 2018; Stich et al. 2018)."""

    compresses_models = False
    all_reduce = False

    @classmethod
    def make(cls, core: Core, *, topk: TopKParams | None = None, **sections: Any) -> Codec:
        from hermes.common.codecs import TopKCodec

        p = topk or TopKParams()
        return TopKCodec(p.ratio, p.selection, p.sample)


@register("compression", "powersgd")
class PowerSgd(Compression):
    """Rank-r PowerSGD for matrix-shaped entries (Vogels et al. 2019, Alg. 1)."""

    compresses_models = False

    @classmethod
    def make(cls, core: Core, *, powersgd: PowerSgdParams | None = None, **sections: Any) -> Codec:
        from hermes.common.codecs import PowerSgdCodec

        return PowerSgdCodec((powersgd or PowerSgdParams()).rank, core.seed)


def check_choice(compression: CompressionParams, *, topology: str) -> None:
    """Refuse codec choices the run cannot carry out, with the reason (ValueError naming the field)."""
    push = get("compression", compression.push)
    pull = get("compression", compression.pull)
    assert issubclass(push, Compression) and issubclass(pull, Compression)
    if not pull.compresses_models:
        raise ValueError(f"compression.pull={pull.name!r} compresses changes, not models: the server would have to "
                         "keep every agent's copy of the model to send it the change; pull with none, fp16, bf16 "
                         "or int8")
    if topology == "collective" and not push.all_reduce:
        raise ValueError(f"compression.push={push.name!r} cannot be summed by an all-reduce (topology "
                         "'collective'): its indices or per-chunk scales differ between ranks and would need an "
                         "all-gather")
    if topology == "collective" and push.name == "powersgd":
        # PowerSGD can be all-reduced (P, then Q: DDP's powerSGD_hook), but client/collective.py sends fp16/bf16
        # only: refused rather than silently sending fp32.
        raise ValueError("compression.push='powersgd' under topology 'collective' is not built yet (the all-reduce "
                         "sends fp32, fp16 or bf16); use fp16/bf16 there, topology 'ps', or the DDP peer's "
                         "--ddp-hook powersgd")


def canonical_codec(name: str) -> str:
    return canonical("compression", name)
