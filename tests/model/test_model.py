"""The built model: layout, counts, forward/backward, causality, init, megatron config hygiene."""

from __future__ import annotations

import dataclasses
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

import torch.nn.functional as F  # noqa: E402

from zebractl.config import catalog  # noqa: E402
from zebractl.config.resolve import resolve_preset  # noqa: E402
from zebractl.layout import model_shapes, numel  # noqa: E402
from zebractl.model import megatron_config  # noqa: E402
from zebractl.model.mixers import Mamba2Mixer  # noqa: E402
from zebractl.model.model import build_model  # noqa: E402
from zebractl.model.norms import NORMS  # noqa: E402
from zebractl.model.ops import KernelOptions  # noqa: E402
from zebractl.schemas.recipe import KernelsConfig  # noqa: E402

TINY = ["tiny_kda", "tiny_gdn", "tiny_mamba", "tiny_hybrid"]


@pytest.mark.parametrize("name", sorted(catalog.shipped("preset")))
def test_every_preset_builds_on_meta_with_the_declared_layout(name):
    m = resolve_preset(name).config
    model = build_model(m, device="meta")
    shapes = {k: tuple(p.shape) for k, p in model.named_parameters()}
    assert shapes == model_shapes(m)
    assert sum(p.numel() for p in model.parameters()) == numel(model_shapes(m))


@pytest.mark.parametrize(("name", "total"), [("kda_300M", 303_549_280), ("gdn_300M", 307_767_232)])
def test_300M_built_counts(name, total):
    model = build_model(resolve_preset(name).config, device="meta")
    assert sum(p.numel() for p in model.parameters()) == total


@pytest.mark.parametrize("name", TINY)
def test_forward_backward_finite_gradients_everywhere(name):
    m = resolve_preset(name).config
    model = build_model(m, seed=int(torch.randint(0, 10_000, ())))
    ids = torch.randint(0, m.vocab_size, (2, 80))
    loss_sum, tokens = model(ids, labels=ids.roll(-1, 1))
    assert tokens.item() == 160
    loss = loss_sum / tokens
    assert abs(loss.item() - math.log(m.padded_vocab_size)) < 0.5  # near-uniform at init
    loss.backward()
    for name_, p in model.named_parameters():
        assert p.grad is not None, name_
        assert torch.isfinite(p.grad).all(), name_
        assert p.grad.abs().sum() > 0, name_


@pytest.mark.parametrize("name", TINY)
def test_model_is_causal(name):
    m = resolve_preset(name).config
    model = build_model(m).eval()
    ids = torch.randint(0, m.vocab_size, (1, 70))
    changed = ids.clone()
    changed[:, 40:] = torch.randint(0, m.vocab_size, (1, 30))
    with torch.no_grad():
        a, b = model(ids), model(changed)
    assert torch.allclose(a[:, :40], b[:, :40], atol=1e-5)
    assert not torch.allclose(a[:, 40:], b[:, 40:], atol=1e-3)


def test_loss_equals_cross_entropy_of_logits_and_respects_mask():
    m = resolve_preset("tiny_hybrid").config
    model = build_model(m).eval()
    ids = torch.randint(0, m.vocab_size, (2, 33))
    mask = torch.rand(2, 33) > 0.3
    with torch.no_grad():
        logits = model(ids)
        loss_sum, tokens = model(ids, labels=ids, loss_mask=mask)
    ref = F.cross_entropy(logits[mask], ids[mask], reduction="sum")
    assert tokens.item() == mask.sum().item()
    assert torch.allclose(loss_sum, ref, rtol=1e-5)


@pytest.mark.slow
def test_init_is_seeded_and_fla_like():
    m = resolve_preset("tiny_kda").config
    a = build_model(m, seed=7).state_dict()
    b = build_model(m, seed=7).state_dict()
    c = build_model(m, seed=8).state_dict()
    keys = [k for k in a if not k.endswith("_extra_state")]
    assert all(torch.equal(a[k], b[k]) for k in keys)
    assert not torch.equal(
        a["decoder.layers.0.mixer.in_proj.weight"], c["decoder.layers.0.mixer.in_proj.weight"]
    )
    big = build_model(
        resolve_preset("gdn_1B").config.model_copy(update={"num_blocks": 1}), seed=3
    ).state_dict()
    for key in (
        "embedding.word_embeddings.weight",
        "decoder.layers.0.mixer.in_proj.weight",
        "decoder.layers.0.mixer.out_proj.weight",
        "decoder.layers.1.mlp.linear_fc2.weight",
        "decoder.layers.0.mixer.conv1d.weight",
    ):
        w = big[key]
        assert abs(w.mean().item()) < 1e-3 and abs(w.std().item() - 0.02) < 5e-4, key
    assert torch.equal(big["decoder.layers.0.norm.weight"], torch.ones(2048))
    assert torch.equal(big["decoder.layers.0.mixer.out_norm.weight"], torch.ones(64))
    kda = build_model(
        resolve_preset("kda_1B").config.model_copy(update={"num_blocks": 1}), seed=3
    ).state_dict()
    a_log = kda["decoder.layers.0.mixer.A_log"].exp()
    assert a_log.min() >= 1 and a_log.max() <= 16
    dt = F.softplus(kda["decoder.layers.0.mixer.dt_bias"])
    assert dt.min() >= 1e-3 * 0.999 and dt.max() <= 0.1 * 1.001
    assert dt.log().std() > 0.5  # log-uniform spread, not a constant
    assert not kda["decoder.layers.0.mixer.g_b_proj.bias"].any()


@pytest.mark.slow
def test_scaled_output_init_only_when_asked():
    m = resolve_preset("gdn_1B").config.model_copy(
        update={"num_blocks": 2, "init_scaled_output": True}
    )
    sd = build_model(m, seed=1).state_dict()
    assert abs(sd["decoder.layers.1.mlp.linear_fc2.weight"].std().item() - 0.01) < 3e-4
    assert abs(sd["decoder.layers.1.mlp.linear_fc1.weight"].std().item() - 0.02) < 3e-4


def test_megatron_config_sets_every_field_explicitly():
    for name in ("tiny_kda", "tiny_hybrid"):
        m = resolve_preset(name).config
        kwargs = megatron_config.megatron_kwargs(m)
        needed = set(megatron_config.EXPLICIT_FIELDS)
        if m.mla is not None:
            needed |= set(megatron_config.MLA_FIELDS)
        assert needed <= set(kwargs), sorted(needed - set(kwargs))


def test_megatron_config_values_come_from_our_config():
    """Non-default values everywhere; any field left at megatron's default would not match."""
    base = resolve_preset("tiny_hybrid").config
    m = base.model_copy(
        update={
            "norm": base.norm.model_copy(update={"eps": 3e-3}),
            "dropout": base.dropout.model_copy(update={"hidden": 0.07, "attention": 0.03}),
            "init_std": 0.013,
            "mla": base.mla.model_copy(
                update={"rope_base": 1234.0, "rope_type": "yarn", "yarn": _yarn()}
            ),
        }
    )
    cfg = megatron_config.transformer_config(m)
    assert cfg.layernorm_epsilon == 3e-3 and cfg.normalization == "RMSNorm"
    assert (cfg.hidden_dropout, cfg.attention_dropout) == (0.07, 0.03)
    assert cfg.add_bias_linear is False and cfg.activation_func is F.silu
    assert cfg.gated_linear_unit is True and cfg.init_method_std == 0.013
    assert (cfg.rope_type, cfg.rotary_base, cfg.rotary_scaling_factor) == ("yarn", 1234.0, 2.0)
    assert (cfg.original_max_position_embeddings, cfg.beta_fast, cfg.beta_slow) == (512, 16.0, 2.0)
    assert (cfg.mscale, cfg.mscale_all_dim) == (1.5, 0.5)
    # every megatron field we set differs from what an unset field would give, or is asserted above
    defaults = {
        f.name: f.default for f in dataclasses.fields(cfg) if f.default is not dataclasses.MISSING
    }
    for key in (
        "layernorm_epsilon",
        "hidden_dropout",
        "attention_dropout",
        "add_bias_linear",
        "rotary_scaling_factor",
        "mscale_all_dim",
        "original_max_position_embeddings",
    ):
        assert getattr(cfg, key) != defaults[key], key

    model = build_model(m)
    norms = [mod for mod in model.modules() if isinstance(mod, NORMS)]
    assert norms and all(n.eps == 3e-3 for n in norms)
    assert model.config.hidden_dropout == 0.07
    attn = model.decoder.layers[0].self_attention
    assert attn.core_attention.dropout_p == 0.03
    # softmax scale = mscale(factor 2, all_dim 0.5)^2 / sqrt(16 + 8)
    mscale = 0.1 * 0.5 * math.log(2.0) + 1.0
    assert attn.softmax_scale == pytest.approx(mscale**2 / math.sqrt(24))


def _yarn():
    from zebractl.schemas.preset import YarnConfig

    return YarnConfig(
        factor=2.0,
        original_max_position_embeddings=512,
        beta_fast=16.0,
        beta_slow=2.0,
        mscale=1.5,
        mscale_all_dim=0.5,
    )


def test_layout_with_biases_and_layernorm_matches_the_built_model():
    base = resolve_preset("tiny_hybrid").config
    m = base.model_copy(
        update={"linear_bias": True, "norm": base.norm.model_copy(update={"type": "layernorm"})}
    )
    model = build_model(m, device="meta")
    assert {k: tuple(p.shape) for k, p in model.named_parameters()} == model_shapes(m)


def _mamba2_step_by_step(mixer: Mamba2Mixer, x):
    """Mamba2 recurrence one time step at a time (the reference for the SSD chunked scan)."""
    mb = mixer.cfg
    b, t, _ = x.shape
    nh, p, n, g = mixer.nheads, mb.head_dim, mb.state_dim, mb.num_groups
    z, xs, bb, cc, dt = mixer.in_proj(x).split(mixer.split, dim=-1)
    xbc = torch.cat([xs, bb, cc], -1)
    w = mixer.conv1d.weight.squeeze(1)  # [C, W]
    width = w.shape[1]
    padded = F.pad(xbc, (0, 0, width - 1, 0))
    conv = torch.stack(
        [(padded[:, i : i + width] * w.T).sum(1) + mixer.conv1d.bias for i in range(t)], 1
    )
    xs, bb, cc = F.silu(conv).split([mixer.d_inner, mixer.gn, mixer.gn], -1)
    dt = F.softplus(dt + mixer.dt_bias)
    a = -mixer.A_log.exp()
    h = torch.zeros(b, nh, p, n)
    ys = []
    for i in range(t):
        xi = xs[:, i].view(b, nh, p)
        bi = bb[:, i].view(b, g, n).repeat_interleave(nh // g, 1)
        ci = cc[:, i].view(b, g, n).repeat_interleave(nh // g, 1)
        decay = torch.exp(dt[:, i] * a)[:, :, None, None]
        h = decay * h + (dt[:, i, :, None, None] * xi[..., None] * bi[:, :, None, :])
        y = (h * ci[:, :, None, :]).sum(-1) + mixer.D[:, None] * xi
        ys.append(y.reshape(b, -1))
    y = torch.stack(ys, 1) * F.silu(z)
    yg = y.view(b, t, g, -1)
    y = (yg * torch.rsqrt(yg.square().mean(-1, keepdim=True) + mixer.norm.eps)).view(b, t, -1)
    return mixer.out_proj(y * mixer.norm.weight)


def test_mamba2_mixer_equals_step_by_step_recurrence():
    m = resolve_preset("tiny_mamba").config
    model = build_model(m, seed=int(torch.randint(0, 1000, ())))
    mixer = model.decoder.layers[0].mixer
    with torch.no_grad():
        for p in mixer.parameters():  # give D, norm and conv bias non-trivial values
            p.add_(torch.randn_like(p) * 0.05)
        x = torch.randn(2, 150, m.hidden_size)
        ours, ref = mixer(x), _mamba2_step_by_step(mixer, x)
    err = (ours - ref).abs().max().item()
    assert err < 1e-5, f"max abs diff {err:.2e}"


def test_kernel_options_follow_recipe_toggles():
    from zebractl.config.resolve import resolve_recipe
    from zebractl.model.model import kernel_options

    k = resolve_recipe("tiny_kda", ["kernels.fused_swiglu=false"]).run.kernels
    opts = kernel_options(k, "cpu")
    assert opts == KernelOptions(backend="torch", kernels=k) and opts.kernels is k
    assert opts.kernels.fused_swiglu is False and opts.kernels.fused_ce_chunks == 8
    with pytest.raises(RuntimeError, match="need a CUDA device"):
        kernel_options(k.model_copy(update={"backend": "fla"}), "cpu")
    default = kernel_options(None, "cpu")
    assert default.backend == "torch" and default.kernels == KernelsConfig()
    model = build_model(resolve_preset("tiny_kda").config, kernels=k, device="meta")
    assert model.opts.kernels is k


def test_every_kernel_toggle_is_declared_once_and_read_by_the_ops():
    """The ops read the schema's toggles themselves (``opts.kernels.<toggle>``): KernelOptions
    declares none of its own, and no toggle of the schema goes unread."""
    import inspect

    from zebractl.model import layers, ops
    from zebractl.model.mixers import common, mamba2

    assert [f.name for f in dataclasses.fields(KernelOptions)] == ["backend", "kernels"]
    from zebractl.runtime import kernel_cache
    from zebractl.train import compile_procs, cuda_graph, precompile, trainer

    source = inspect.getsource(ops) + inspect.getsource(layers)  # layers: fp8_mlp picks the MLP
    elsewhere = {  # not how ops compute
        "precompile": (precompile, "cfg.kernels.precompile"),
        "precompile_tilelang": (precompile, "cfg.kernels.precompile_tilelang"),
        "precompile_workers": (precompile, "cfg.kernels.precompile_workers"),
        "precompile_tilelang_overlap": (precompile, "cfg.kernels.precompile_tilelang_overlap"),
        "precompile_processes": (compile_procs, "k.precompile_processes"),
        "cuda_graph": (cuda_graph, "cfg.kernels.cuda_graph"),
        "compile": (mamba2, "opts.kernels.compile"),  # the glue around the ops
        "qkv_conv": (common, "mixer.opts.kernels.qkv_conv"),  # which convs the ops are given
        "lazy_framework_compile": (trainer, "cfg.kernels.lazy_framework_compile"),  # imports
        "lean_fla_import": (trainer, "lean = cfg.kernels.lean_fla_import"),  # imports
        "shipped_compiled": (kernel_cache, "compiled=kernels.shipped_compiled"),  # the cache
    }
    unread = [
        name
        for name in KernelsConfig.model_fields
        if name != "backend" and name not in elsewhere and f"opts.kernels.{name}" not in source
    ]
    assert not unread, unread
    for module, read in elsewhere.values():
        assert read in inspect.getsource(module), read
