"""The Zebra language model on megatron-core, built from a resolved config and nothing else.

``ZebraModel`` is a megatron ``LanguageModule`` (tied embeddings, sharded checkpoints, parallel state)
whose decoder stacks the resolved sublayers: mixer (KDA/GDN/Mamba2) or MLA attention, then SwiGLU MLP,
each pre-norm with a residual; then the final norm. With labels, ``forward`` returns the summed token
cross-entropy and the token count; FLA's fused linear cross-entropy on CUDA never materialises the
``[tokens x vocab]`` logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.models.common.language_module.language_module import LanguageModule
from megatron.core.tensor_parallel.layers import ColumnParallelLinear
from megatron.core.transformer.module import MegatronModule
from torch import nn

from zebractl.model import ops, recompute
from zebractl.model.attention import build_mla, varlen_usable
from zebractl.model.layers import (
    MLPS,
    AttentionSublayer,
    MixerSublayer,
    MLPSublayer,
    VocabEmbedding,
    process_groups,
)
from zebractl.model.mixers import MIXERS
from zebractl.model.mixers.common import KEEP_FP32
from zebractl.model.norms import Norm, norm_factory
from zebractl.model.ops import KernelOptions, kernel_options
from zebractl.model.segments import Segments
from zebractl.schemas.preset import ModelConfig
from zebractl.schemas.recipe import KernelsConfig, RecomputeConfig

Tensor = torch.Tensor


class _Embedding(MegatronModule):
    """Token embedding (megatron's VocabParallelEmbedding) with embedding dropout; batch-first."""

    def __init__(self, config, vocab_size: int, tp_group) -> None:
        super().__init__(config=config)
        self.word_embeddings = VocabEmbedding(
            vocab_size,
            config.hidden_size,
            init_method=config.embedding_init_method,
            config=config,
            tp_group=tp_group,
        )

    def forward(self, input_ids: Tensor) -> Tensor:
        x = self.word_embeddings(input_ids)
        p = self.config.hidden_dropout
        return F.dropout(x, p=p, training=True) if p and self.training else x


class ZebraStack(MegatronModule):
    """The sublayers of the resolved pattern and the final norm; ``recompute`` (a recipe's
    ``recompute`` section, None: none) checkpoints sublayers or blocks while training
    (:mod:`zebractl.model.recompute`)."""

    def __init__(
        self,
        m: ModelConfig,
        config,
        opts: KernelOptions,
        recompute: RecomputeConfig | None = None,
    ) -> None:
        super().__init__(config=config)
        rc = recompute or RecomputeConfig()
        self.recompute_mode = rc.mode
        self.recompute_blocks = (rc.blocks or m.num_blocks) if rc.mode == "full" else 0
        h, eps, kind = m.hidden_size, m.norm.eps, m.norm.type
        layers: list[nn.Module] = []
        for i, sub in enumerate(m.sublayers):
            norm = Norm(h, eps, kind, opts)
            if sub == "mlp":
                layers.append(MLPSublayer(config, norm, MLPS[m.ffn_activation](config, opts)))
            elif sub == "mla":
                attn = build_mla(config, i + 1, norm_factory(kind, opts), opts)
                layers.append(AttentionSublayer(config, norm, attn))
            else:
                layers.append(MixerSublayer(config, norm, MIXERS[sub](m, opts)))
        self.layers = nn.ModuleList(layers)
        self.final_norm = Norm(h, eps, kind, opts)

    def forward(self, x: Tensor, segments: Segments | None = None) -> Tensor:
        delta = None  # each sublayer's output, added to the stream inside the next norm
        mode = self.recompute_mode if recompute.active(self) else "none"
        if mode == "selective":
            for layer in self.layers:
                delta, x = recompute.selective(layer.step, delta, x, segments)
        else:
            checkpointed = self.recompute_blocks if mode == "full" else 0
            for b in range(len(self.layers) // 2):  # a block: mixer or MLA sublayer, then MLP
                if b < checkpointed:
                    delta, x = recompute.full(self._block, b, delta, x, segments)
                else:
                    delta, x = self._block(b, delta, x, segments)
        return self.final_norm.add(delta, x)[0]

    def _block(
        self, b: int, delta: Tensor | None, x: Tensor, segments: Segments | None
    ) -> tuple[Tensor, Tensor]:
        for layer in self.layers[2 * b : 2 * b + 2]:
            delta, x = layer.step(delta, x, segments)
        return delta, x


class ZebraModel(LanguageModule):
    """Embedding -> ZebraStack -> (tied) LM head, on megatron-core."""

    def __init__(
        self,
        m: ModelConfig,
        config,
        opts: KernelOptions,
        recompute: RecomputeConfig | None = None,
    ) -> None:
        pgs = process_groups()
        super().__init__(config=config, pg_collection=pgs)
        self.model_config, self.opts = m, opts
        self.pre_process = self.post_process = True
        self.share_embeddings_and_output_weights = m.tie_embeddings
        self.vocab_size = m.padded_vocab_size
        self.embedding = _Embedding(config, self.vocab_size, pgs.tp)
        self.decoder = ZebraStack(m, config, opts, recompute)
        # holds the weight only (forward applies it with ops.lm_loss or F.linear)
        self.output_layer = ColumnParallelLinear(
            m.hidden_size,
            self.vocab_size,
            config=config,
            init_method=config.init_method,
            bias=False,
            skip_bias_add=False,
            gather_output=False,
            skip_weight_param_allocation=m.tie_embeddings,
            disable_grad_reduce=True,
            tp_group=pgs.tp,
        )
        self.setup_embeddings_and_output_layer()

    def _set_attention_backend(self) -> None:
        """No-op: megatron's version exports NVTE_* variables into ``os.environ`` (a process-wide
        side effect) to steer Transformer Engine's attention, which this model does not use."""

    @property
    def lm_head_weight(self) -> Tensor:
        """The output projection ``[padded vocab, hidden]`` (the embedding when tied)."""
        if self.share_embeddings_and_output_weights:
            return self.shared_embedding_or_output_weight()
        return self.output_layer.weight

    def hidden_states(self, input_ids: Tensor, segments: Segments | None = None) -> Tensor:
        """Final-norm hidden states ``[B, T, H]`` (``segments``: the documents packed into each
        row, kept apart; :mod:`zebractl.model.segments`)."""
        x = self.embedding(input_ids)
        if segments is not None and "mla" in self.model_config.sublayers:
            # made here, outside any recomputed region, and shared by every MLA layer
            dtype = _compute_dtype(x)
            dropout = self.config.attention_dropout if self.training else 0.0
            if varlen_usable(x.device, dtype, dropout):
                segments.varlen_args()
            else:
                segments.attention_bias(dtype)
        return self.decoder(x, segments)

    def forward(
        self,
        input_ids: Tensor,
        labels: Tensor | None = None,
        loss_mask: Tensor | None = None,
        segments: Segments | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Logits ``[B, T, V]`` (fp32) without labels; with labels ``(loss_sum, num_tokens)``."""
        h = self.hidden_states(input_ids, segments)
        w = self.lm_head_weight
        if labels is None:
            return F.linear(h, w).float()
        if loss_mask is not None:
            labels = labels.masked_fill(loss_mask == 0, -100)
        tokens = (labels != -100).sum()
        return ops.lm_loss(self.opts, h, w, labels), tokens


def _compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype the attention's q/k/v will have: autocast's when it is on, else ``x``'s."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def built_parameter_count(m: ModelConfig) -> int:
    """Parameters of the model as built (on the meta device: no memory, no initialisation)."""
    model = build_model(m, device="meta")
    return sum(p.numel() for p in model.parameters())


def build_model(
    m: ModelConfig,
    *,
    kernels: KernelsConfig | None = None,
    device: str | torch.device = "cpu",
    seed: int = 1234,
    params_dtype: torch.dtype = torch.float32,
    recompute: RecomputeConfig | None = None,
) -> ZebraModel:
    """Build and initialise a model on ``device`` (``"meta"`` allocates nothing).

    ``kernels`` is a recipe's KernelsConfig (None = defaults with backend auto); ``recompute`` its
    activation recomputation (None = none; it changes no weight and no output).

    No process-wide side effect: no process group is created (the model runs without one; training
    and sharded checkpoints need the caller's, set up before building, e.g. by
    ``zebractl.runtime.dist.ensure_initialized``, and the model then uses its groups), and megatron's
    patches are scoped to the constructor that needs them.
    """
    from zebractl.model.init import initialize
    from zebractl.model.megatron_config import transformer_config

    opts = kernel_options(kernels, device)
    # Build and initialise in fp32 (identical values whatever the training dtype), then cast.
    config = transformer_config(m, params_dtype=torch.float32)
    with torch.device(device):
        model = ZebraModel(m, config, opts, recompute)
    initialize(model, m, seed)
    if params_dtype != torch.float32:
        cast_parameters(model, params_dtype)
        config.params_dtype, config.pipeline_dtype = params_dtype, params_dtype
        config.bf16, config.fp16 = params_dtype == torch.bfloat16, params_dtype == torch.float16
    return model


def cast_parameters(model: nn.Module, dtype: torch.dtype) -> None:
    """Cast floating parameters to ``dtype``, except the :data:`KEEP_FP32` ones."""
    for name, p in model.named_parameters():
        if p.is_floating_point() and name.rsplit(".", 1)[-1] not in KEEP_FP32:
            p.data = p.data.to(dtype)
