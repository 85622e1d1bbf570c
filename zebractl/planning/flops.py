"""Hybrid-aware FLOP count per token: matmuls + recurrent chunk terms + MLA attention.

Not Megatron's GPT/Mamba formula (which Primus reused for KDA/GDN and so over-reported MFU ~2x). One
multiply-add = 2 FLOPs; training = forward + backward = 3 x forward. Element-wise work (norms,
activations, gates) is not counted, as in every MFU convention.

Terms, per token of a sequence of length s:

- linear layers: 2 * rows * cols of every weight matrix, including the LM head (tied or not);
- depthwise short convolutions: 2 * channels * kernel;
- KDA/GDN chunked delta rule, chunk C = 64, per value head (dk key, dv value dim):
  intra-chunk QK^T, KK^T and W = T(beta K): 6*C*dk; U = T(beta V) and A(U - WS): 4*C*dv;
  inter-chunk W S, Q S and the state update K^T U: 6*dk*dv; the triangular inverse T: 2*C^2/3;
- Mamba2 SSD as scalar-decay linear attention (chunk C = 64; FLA's simple_gla kernels), per head
  (P head dim, N state): 2*C*P (intra-chunk scores x values) + 4*N*P (readout, state update), plus per
  group 2*C*N (C B^T);
- MLA causal attention: each token attends to (s+1)/2 keys on average:
  nh * (qk + rope + v) * (s + 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from zebractl.layout import SUBLAYER_SHAPES
from zebractl.schemas.preset import ModelConfig

CHUNK = 64


@dataclass(frozen=True)
class FlopCount:
    """Forward FLOPs per token by component."""

    linear: int
    conv: int
    recurrent: int
    attention: int
    lm_head: int

    @property
    def forward(self) -> int:
        """All forward FLOPs per token."""
        return self.linear + self.conv + self.recurrent + self.attention + self.lm_head

    @property
    def training(self) -> int:
        """Forward + backward FLOPs per token (3x forward)."""
        return 3 * self.forward


def _matmul_and_conv(m: ModelConfig, kind: str) -> tuple[int, int]:
    linear = conv = 0
    for name, shape in SUBLAYER_SHAPES[kind](m).items():
        if name.endswith("conv1d.weight"):
            conv += 2 * shape[0] * shape[2]
        elif name.endswith(".weight") and len(shape) == 2:
            linear += 2 * shape[0] * shape[1]
    return linear, conv


def _delta_rule(dk: int, dv: int, heads: int) -> int:
    c = CHUNK
    return heads * (6 * c * dk + 4 * c * dv + 6 * dk * dv + (2 * c * c) // 3)


def _recurrent(m: ModelConfig, kind: str) -> int:
    if kind in ("kda", "gdn"):
        d = m.linear_attention_dims(kind)  # type: ignore[arg-type]
        return _delta_rule(d.head_k_dim, d.head_v_dim, d.num_v_heads)
    if kind == "mamba2":
        assert m.mamba2 is not None
        d2, n, p = m.mamba2_dims, m.mamba2.state_dim, m.mamba2.head_dim
        return d2.num_heads * (2 * CHUNK * p + 4 * n * p) + m.mamba2.num_groups * 2 * CHUNK * n
    return 0


def _attention(m: ModelConfig, seq_length: int) -> int:
    assert m.mla is not None
    a = m.mla
    return a.num_heads * (a.qk_head_dim + a.qk_pos_emb_head_dim + a.v_head_dim) * (seq_length + 1)


def flops_per_token(m: ModelConfig, seq_length: int) -> FlopCount:
    """Forward FLOPs per token for sequences of ``seq_length``."""
    linear = conv = recurrent = attention = 0
    for kind in m.sublayers:
        lin, cv = _matmul_and_conv(m, kind)
        linear, conv = linear + lin, conv + cv
        recurrent += _recurrent(m, kind)
        if kind == "mla":
            attention += _attention(m, seq_length)
    return FlopCount(
        linear=linear,
        conv=conv,
        recurrent=recurrent,
        attention=attention,
        lm_head=2 * m.padded_vocab_size * m.hidden_size,
    )
