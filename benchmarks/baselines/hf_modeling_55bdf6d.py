# ruff: noqa
# zebractl/hf/modeling.py as it was at commit 55bdf6d (2026-12-05), before the generation cache of
# issue 43: MLA keeps full keys and values and concatenates them every step (a torch.cat of the
# whole history per token); the recurrent mixers keep their states. Kept only as the baseline of
# `benchmarks/decode_bench.py --impls hf_generate_before` (our HF export's generate() before the
# generation cache). It imports today's mixers, norms and kernel options, so its recurrent steps
# are as fast as today's: the comparison favours it. Not part of the package; nothing imports it.
"""``ZebraForCausalLM``: any Zebra model (KDA / GDN / Mamba2 mixers, MLA, SwiGLU) as a Hugging Face
model, computed by :mod:`zebractl.model.ops` (FLA's kernels on CUDA, the pure-PyTorch implementations
elsewhere) exactly as the training model computes it: the mixers and norms are the training model's
modules (:data:`zebractl.model.mixers.HF_MIXERS`, :mod:`zebractl.model.norms`; no megatron).

Block ``i`` is ``model.layers.{i}``: ``attn_norm``, ``attn`` (the mixer or the MLA), ``mlp_norm``,
``mlp``. KDA and GDN use FLA's tensor names (separate q/k/v projections and convolutions), Mamba2
FLA's Mamba2 layer names, MLA transformers' DeepSeek-V3 attention names; the weights map to and
from a training checkpoint through :mod:`zebractl.hf.mapping` (format ``zebra``).

Generation keeps a :class:`ZebraCache`: per KDA/GDN/Mamba2 block the last ``conv_size - 1`` inputs
of each short convolution and the fp32 recurrent state, per MLA block the keys and values (rope
applied). A step then feeds only the new tokens; the result equals recomputing the whole sequence
(tested greedily against ``use_cache=False``). Padding is not supported (every sequence of a batch
has the same length).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from zebractl.hf.configuration import ZebraConfig
from zebractl.model import ops
from zebractl.model.mixers import HF_MIXERS
from zebractl.model.norms import Norm
from zebractl.model.ops import KernelOptions

Tensor = torch.Tensor
CACHE_KEY = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
"""What this transformers calls the generation cache in outputs and model inputs (``cache`` from
5.2x, ``past_key_values`` before)."""


class DeviceOptions:
    """:class:`~zebractl.model.ops.KernelOptions` whose backend follows the input's device (set at
    every forward: FLA's kernels on CUDA, the torch implementations elsewhere), every fusion on as in
    training's defaults. Shared by all modules of one model."""

    def __init__(self) -> None:
        from zebractl.schemas.recipe import KernelsConfig

        self.backend = "torch"
        self.kernels = KernelsConfig()

    def fla(self, toggle: bool) -> bool:
        return self.backend == "fla" and toggle


class ZebraMLP(nn.Module):
    def __init__(self, hidden: int, ffn: int, bias: bool, opts: KernelOptions) -> None:
        super().__init__()
        self.opts = opts
        self.gate_proj = nn.Linear(hidden, ffn, bias=bias)
        self.up_proj = nn.Linear(hidden, ffn, bias=bias)
        self.down_proj = nn.Linear(ffn, hidden, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(ops.swiglu(self.opts, self.gate_proj(x), self.up_proj(x)))


class ZebraCache:
    """What generation keeps between steps: one dict per block (see the module docstring) and the
    number of tokens seen. Not a transformers ``Cache``: the model prepares its own inputs."""

    def __init__(self, num_layers: int) -> None:
        self.layers: list[dict[str, Any]] = [{} for _ in range(num_layers)]
        self.seen = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    def __len__(self) -> int:
        return len(self.layers)


class ZebraMLA(nn.Module):
    """Multi-Latent Attention with transformers' DeepSeek-V3 names, computing what megatron-core's
    ``MLASelfAttention`` computes: the rope dims de-interleaved (``[0::2] | [1::2]``) then rotated
    by halves, the table and softmax scale from ``config.mla_rope``."""

    def __init__(self, m: Any, rope: dict[str, Any], opts: KernelOptions) -> None:
        super().__init__()
        a = self.cfg = m.mla
        h, eps, n = m.hidden_size, m.norm.eps, a.num_heads
        q_dim = n * (a.qk_head_dim + a.qk_pos_emb_head_dim)
        if a.q_lora_rank is not None:
            self.q_a_proj = nn.Linear(h, a.q_lora_rank, bias=False)
            self.q_a_layernorm = Norm(a.q_lora_rank, eps, opts=opts)
            self.q_b_proj = nn.Linear(a.q_lora_rank, q_dim, bias=False)
        else:
            self.q_proj = nn.Linear(h, q_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, a.kv_lora_rank + a.qk_pos_emb_head_dim, bias=False)
        self.kv_a_layernorm = Norm(a.kv_lora_rank, eps, opts=opts)
        self.kv_b_proj = nn.Linear(a.kv_lora_rank, n * (a.qk_head_dim + a.v_head_dim), bias=False)
        self.o_proj = nn.Linear(n * a.v_head_dim, h, bias=False)
        # a plain list, not a buffer: from_pretrained builds modules on the meta device and does
        # not restore non-persistent buffers; the table is made on the input's device per call
        self.inv_freq = [float(x) for x in rope["inv_freq"]]
        if len(self.inv_freq) * 2 != a.qk_pos_emb_head_dim:
            raise ValueError(
                f"mla_rope.inv_freq has {len(self.inv_freq)} frequencies; qk_pos_emb_head_dim "
                f"{a.qk_pos_emb_head_dim} needs {a.qk_pos_emb_head_dim // 2}"
            )
        self.mscale = float(rope.get("mscale", 1.0))
        self.softmax_scale = float(
            rope.get("softmax_scale", 1 / math.sqrt(a.qk_head_dim + a.qk_pos_emb_head_dim))
        )

    def _rope(self, t: Tensor, positions: Tensor) -> Tensor:
        inv_freq = torch.tensor(self.inv_freq, dtype=torch.float32, device=positions.device)
        freqs = torch.outer(positions.to(torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)[None, :, None, :]  # [1, T, 1, rope]
        t = torch.cat((t[..., 0::2], t[..., 1::2]), dim=-1)
        cos, sin = (emb.cos() * self.mscale).to(t.dtype), (emb.sin() * self.mscale).to(t.dtype)
        x1, x2 = torch.chunk(t, 2, dim=-1)
        return t * cos + torch.cat((-x2, x1), dim=-1) * sin

    def forward(self, x: Tensor, cache: dict[str, Any] | None = None, start: int = 0) -> Tensor:
        a = self.cfg
        b, t, _ = x.shape
        n, dq, dr, dv = a.num_heads, a.qk_head_dim, a.qk_pos_emb_head_dim, a.v_head_dim
        if a.q_lora_rank is not None:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        else:
            q = self.q_proj(x)
        q_nope, q_pe = q.view(b, t, n, dq + dr).split([dq, dr], dim=-1)
        c, k_pe = self.kv_a_proj_with_mqa(x).split([a.kv_lora_rank, dr], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(c)).view(b, t, n, dq + dv)
        k_nope, v = kv.split([dq, dv], dim=-1)
        positions = torch.arange(start, start + t, device=x.device)
        q_pe = self._rope(q_pe, positions)
        k_pe = self._rope(k_pe[:, :, None, :], positions).expand(b, t, n, dr)
        query = torch.cat((q_nope, q_pe), dim=-1).transpose(1, 2)
        key = torch.cat((k_nope, k_pe), dim=-1).transpose(1, 2)
        value = v.transpose(1, 2)
        if cache is not None:
            if "k" in cache:
                key = torch.cat((cache["k"], key), dim=2)
                value = torch.cat((cache["v"], value), dim=2)
            cache["k"], cache["v"] = key.detach(), value.detach()
        if key.shape[2] == t:  # no earlier tokens: plain causal
            o = F.scaled_dot_product_attention(
                query, key, value, is_causal=True, scale=self.softmax_scale
            )
        else:  # query i (position start + i) sees keys 0 .. start + i
            seen = torch.arange(key.shape[2], device=x.device)
            mask = seen[None, :] <= positions[:, None]
            o = F.scaled_dot_product_attention(
                query, key, value, attn_mask=mask, scale=self.softmax_scale
            )
        return self.o_proj(o.transpose(1, 2).reshape(b, t, n * dv))


class ZebraBlock(nn.Module):
    """One block: ``x + attn(attn_norm(x))``, then ``+ mlp(mlp_norm(.))``."""

    def __init__(self, m: Any, kind: str, rope: dict[str, Any] | None, opts: KernelOptions):
        super().__init__()
        h, eps = m.hidden_size, m.norm.eps
        self.kind = kind
        self.attn_norm = Norm(h, eps, opts=opts)
        if kind == "mla":
            if rope is None:
                raise ValueError("an MLA block needs config.mla_rope")
            self.attn: nn.Module = ZebraMLA(m, rope, opts)
        elif kind in HF_MIXERS:
            self.attn = HF_MIXERS[kind](m, opts)
        else:
            raise ValueError(f"unknown block kind {kind!r}")
        self.mlp_norm = Norm(h, eps, opts=opts)
        self.mlp = ZebraMLP(h, m.ffn_hidden_size, m.linear_bias, opts)

    def forward(self, x: Tensor, cache: dict[str, Any] | None = None, start: int = 0) -> Tensor:
        h = self.attn_norm(x)
        if cache is None:
            h = self.attn(h)
        elif self.kind == "mla":
            h = self.attn(h, cache, start)
        else:
            h = self.attn(h, cache=cache)
        x = x + h
        return x + self.mlp(self.mlp_norm(x))


class ZebraPreTrainedModel(PreTrainedModel):
    config_class = ZebraConfig
    base_model_prefix = "model"
    _no_split_modules = ["ZebraBlock"]
    supports_gradient_checkpointing = False

    def _init_weights(self, module: nn.Module) -> None:
        """Only for tensors a folder does not hold (the loaded ones overwrite these)."""
        std = self.config.initializer_range or 0.02
        if isinstance(module, nn.Linear | nn.Conv1d):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)


class ZebraModel(ZebraPreTrainedModel):
    """Embeddings, the blocks, the final norm."""

    def __init__(self, config: ZebraConfig) -> None:
        super().__init__(config)
        m = config.model_config()
        if m.norm.type != "rmsnorm":
            raise ValueError(f"ZebraModel supports rmsnorm models only (this one: {m.norm.type})")
        self.opts = DeviceOptions()
        self.embeddings = nn.Embedding(m.padded_vocab_size, m.hidden_size)
        kinds = [m.sublayers[2 * i] for i in range(m.num_blocks)]
        self.layers = nn.ModuleList(ZebraBlock(m, k, config.mla_rope, self.opts) for k in kinds)
        self.norm = Norm(m.hidden_size, m.norm.eps, opts=self.opts)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings = value

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        past_key_values: ZebraCache | None = None,
        use_cache: bool = False,
        **kwargs: Any,
    ) -> BaseModelOutputWithPast:
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError(
                "ZebraModel does not support padding (attention_mask with zeros): the recurrent "
                "mixers read every position; pass unpadded sequences (batch size 1 or equal lengths)"
            )
        x = self.embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        self.opts.backend = ops.resolve_backend("auto", x.device)
        if use_cache and past_key_values is None:
            past_key_values = ZebraCache(len(self.layers))
        cache = past_key_values if use_cache else None
        start = cache.seen if cache is not None else 0
        for i, layer in enumerate(self.layers):
            x = layer(x, cache.layers[i] if cache is not None else None, start)
        if cache is not None:
            cache.seen += x.shape[1]
        return BaseModelOutputWithPast(last_hidden_state=self.norm(x), **{CACHE_KEY: cache})


class ZebraForCausalLM(ZebraPreTrainedModel, GenerationMixin):
    """The causal LM: :class:`ZebraModel` and the (tied) LM head."""

    _tied_weights_keys = {"lm_head.weight": "model.embeddings.weight"}

    def __init__(self, config: ZebraConfig) -> None:
        super().__init__(config)
        self.model = ZebraModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embeddings = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the cache is a ZebraCache of recurrent states and MLA keys

    def prepare_inputs_for_generation(
        self,
        input_ids: Tensor,
        past_key_values: ZebraCache | None = None,
        use_cache: bool = True,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """With a cache only the tokens it has not seen yet go in."""
        cache = kwargs.get("cache", past_key_values)
        if use_cache and isinstance(cache, ZebraCache) and cache.seen:
            input_ids = input_ids[:, cache.seen :]
        else:
            cache = None
        return {"input_ids": input_ids, CACHE_KEY: cache, "use_cache": use_cache}

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        labels: Tensor | None = None,
        past_key_values: ZebraCache | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        cache: ZebraCache | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        past_key_values = cache if cache is not None else past_key_values
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            past_key_values=past_key_values,
            use_cache=bool(use_cache),
        )
        h = out.last_hidden_state
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        logits = self.lm_head(h).float()
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]),
                labels[:, 1:].reshape(-1),
                ignore_index=-100,
            )
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_KEY: out.get(CACHE_KEY)})
