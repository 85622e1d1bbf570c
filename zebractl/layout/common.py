"""What the per-sublayer layouts share: shape-table helpers and the delta-rule convolution."""

from __future__ import annotations

from zebractl.schemas.preset import ModelConfig

Shapes = dict[str, tuple[int, ...]]


def norm(m: ModelConfig, name: str, size: int) -> Shapes:
    """A norm's tensors: weight, and bias for LayerNorm."""
    out: Shapes = {f"{name}.weight": (size,)}
    if m.norm.type == "layernorm":
        out[f"{name}.bias"] = (size,)
    return out


def linear(m: ModelConfig, name: str, out_f: int, in_f: int, bias: bool | None = None) -> Shapes:
    """A linear layer's tensors: weight, and bias when ``bias`` (default: ``m.linear_bias``)."""
    shapes: Shapes = {f"{name}.weight": (out_f, in_f)}
    if m.linear_bias if bias is None else bias:
        shapes[f"{name}.bias"] = (out_f,)
    return shapes


def conv_channels(m: ModelConfig, kind: str) -> list[int]:
    """Channel blocks of the short convolution: q | k | v."""
    d = m.linear_attention_dims(kind)  # type: ignore[arg-type]
    return [d.key_dim, d.key_dim, d.value_dim]
