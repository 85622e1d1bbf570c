"""recompute.mode on the model: what is run again in the backward pass, and that nothing changes.

Counts are exact (CPU, fp32, the torch kernels): the sublayers' forwards and the matrix
multiplications PyTorch dispatches during ``loss.backward()``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from zebractl.config.resolve import resolve_preset  # noqa: E402
from zebractl.model.model import build_model  # noqa: E402
from zebractl.model.recompute import GEMMS  # noqa: E402
from zebractl.schemas.recipe import RecomputeConfig  # noqa: E402


class _CountGemms(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in GEMMS:
            self.n += 1
        return func(*args, **(kwargs or {}))


def _step(name: str, mode: str, blocks: int | None = None, seed: int = 5):
    """(loss, gradients, sublayer forwards, GEMMs dispatched in backward) of one step."""
    m = resolve_preset(name).config
    model = build_model(m, seed=seed, recompute=RecomputeConfig(mode=mode, blocks=blocks))
    calls = {"n": 0}
    for layer in model.decoder.layers:  # the sublayers run as .step(): count their inner module
        inner = next(
            getattr(layer, a) for a in ("mixer", "mlp", "self_attention") if hasattr(layer, a)
        )
        inner.register_forward_pre_hook(lambda *_: calls.__setitem__("n", calls["n"] + 1))
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, m.vocab_size, (2, 32), generator=g)
    loss, tokens = model(ids, labels=torch.roll(ids, -1, 1))
    forwards = calls["n"]
    with _CountGemms() as gemms:
        (loss / tokens).backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, calls["n"] - forwards, gemms.n, len(model.decoder.layers)


@pytest.mark.parametrize("name", ["tiny_kda", "tiny_mamba", "tiny_hybrid"])
def test_the_modes_recompute_what_they_say_and_change_nothing(name):
    """Loss and every gradient bitwise equal; in the backward pass none runs no sublayer forward,
    selective runs every sublayer's forward again but no GEMM of it (its outputs were kept), full
    runs every forward again GEMMs included, and full with blocks=1 only the first block's."""
    loss, grads, again, gemms, n = _step(name, "none")
    assert again == 0 and gemms > 0
    for mode, blocks, want_again in (("selective", None, n), ("full", None, n), ("full", 1, 2)):
        l2, g2, a2, gm2, _ = _step(name, mode, blocks)
        assert torch.equal(loss, l2), (mode, loss, l2)
        assert g2.keys() == grads.keys()
        bad = [k for k in grads if not torch.equal(grads[k], g2[k])]
        assert not bad, (mode, blocks, bad[:5])
        assert a2 == want_again, (mode, blocks, a2)
        if mode == "selective":
            assert gm2 == gemms, (gm2, gemms)  # no forward GEMM again
        else:
            assert gm2 > gemms, (mode, blocks, gm2, gemms)


def test_no_recomputation_outside_training():
    m = resolve_preset("tiny_hybrid").config
    model = build_model(m, recompute=RecomputeConfig(mode="full")).eval()
    ids = torch.zeros(1, 8, dtype=torch.long)
    with torch.no_grad():
        model(ids)  # no checkpoint (PyTorch would warn under no_grad: warnings are errors here)
    model.train()
    with torch.no_grad():
        model(ids)


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["kda_300M", "zebra_mamba_300M_hybrid"])
def test_gpu_recompute_on_flas_kernels_within_bf16_noise(name):
    """FLA's kernels, bf16 autocast, a 300M model's shapes cut to 4 blocks (KDA; MLA + Mamba2),
    micro-batch 16 x 2048 (the parity run's shapes, so their tuned kernels apply): the loss of
    selective and full is none's within 1e-5 relative (the same forward) and every gradient is
    within rel L2 2e-2 of none's (the recomputed kernels' bf16 rounding; seed 11); the peak memory
    falls from none to selective to full."""
    m = resolve_preset(name, ["num_blocks=4"]).config
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, m.vocab_size, (16, 2048), generator=g).cuda()
    out = {}
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    for mode in ("none", "selective", "full"):
        model = build_model(m, device="cuda", seed=11, recompute=RecomputeConfig(mode=mode))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, tokens = model(ids, labels=torch.roll(ids, -1, 1))
        (loss / tokens).backward()
        grads = {k: p.grad.float() for k, p in model.named_parameters() if p.grad is not None}
        out[mode] = (loss.detach(), grads, torch.cuda.max_memory_allocated() / 2**30)
        del model
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    ref_loss, ref, _ = out["none"]
    for mode in ("selective", "full"):
        loss, grads, _ = out[mode]
        worst = max((_rel(grads[k], ref[k]), k) for k in ref)
        print(
            f"{name} {mode}: loss {loss.item():.6f} (none {ref_loss.item():.6f}), worst grad rel "
            f"L2 {worst[0]:.2e} ({worst[1]}), peak {out[mode][2]:.2f} GiB (none {out['none'][2]:.2f})"
        )
        assert abs(loss.item() - ref_loss.item()) <= 1e-5 * abs(ref_loss.item()), (mode, loss)
        assert worst[0] < 2e-2, (mode, worst)
    assert out["full"][2] < out["selective"][2] <= out["none"][2], {k: v[2] for k, v in out.items()}
