"""Engine pieces that run on CPU (the Megatron optimizer itself is CUDA-only: test_engine_gpu.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from zebractl.config.resolve import resolve_recipe  # noqa: E402
from zebractl.train import engine as eng  # noqa: E402

SETS = ["data.paths=[{path: /nonexistent}]"]


def _model_and_batch():
    from zebractl.model.model import build_model

    cfg = resolve_recipe("tiny_kda", SETS).run
    model = build_model(cfg.model, kernels=cfg.kernels, device="cpu", seed=7)
    x = torch.randint(0, cfg.model.vocab_size, (2, 16))
    return cfg, model, x


def test_megatron_ddp_buffers_feed_the_nonfinite_check(process_group):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    from zebractl.runtime import megatron_compat

    _, model, x = _model_and_batch()
    with megatron_compat.patched():  # megatron's DDP allocates on torch.cuda.current_device()
        ddp = DistributedDataParallel(
            model.config, DistributedDataParallelConfig(grad_reduce_in_fp32=True), model
        )
    loss, _ = ddp(x, labels=x, loss_mask=torch.ones_like(x, dtype=torch.float32))
    loss.backward()
    ddp.finish_grad_sync()
    engine = eng.MegatronEngine.__new__(eng.MegatronEngine)  # the checks need only the DDP wrapper
    engine.forward = ddp
    assert bool(engine.grads_finite())
    ddp.buffers[0].grad_data[torch.randint(0, ddp.buffers[0].grad_data.numel(), ())] = float("inf")
    assert not bool(engine.grads_finite())


def test_torch_engine_nonfinite_check_and_no_decay_groups():
    cfg, model, x = _model_and_batch()
    engine = eng.TorchEngine(cfg, model, torch.device("cpu"), world=1)
    loss, _ = engine.forward(x, labels=x, loss_mask=torch.ones_like(x, dtype=torch.float32))
    loss.backward()
    assert bool(engine.grads_finite())
    decay, no_decay = engine.optimizer.param_groups
    assert no_decay["wd_mult"] == 0.0 and decay["wd_mult"] == 1.0
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(names[id(p)].endswith(("bias", "norm.weight")) for p in no_decay["params"])
    next(p for p in engine.params if p.grad is not None).grad.view(-1)[0] = float("nan")
    assert not bool(engine.grads_finite())


def test_no_decay_globs_address_the_bare_model_under_megatron_ddp():
    cfg = resolve_recipe("tiny_kda", [*SETS, "optimizer.no_decay=['embedding.*']"]).run
    assert eng._no_decay(cfg, "module.embedding.word_embeddings.weight")
    assert eng._no_decay(cfg, "embedding.word_embeddings.weight")
    assert not eng._no_decay(cfg, "module.decoder.final_norm.weight")


def test_restore_step_counts_undoes_megatrons_reset_and_resumes_the_same_update():
    """megatron 0.16.1's dp_reshardable load leaves every AdamW step count at the template's 0 (one
    tensor shared by all parameters); restore_step_counts puts back the saved group step, one
    tensor per parameter, and the next update equals the uninterrupted optimizer's bitwise."""
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ()).item()))
    shapes = [(7, 5), (3,)]
    init = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(4)]

    def run(steps, tamper=False):
        ps = [torch.nn.Parameter(t.clone()) for t in init]
        opt = torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)
        for i in range(steps):
            for p, g in zip(ps, grads[i], strict=True):
                p.grad = g.clone()
            opt.step()
            if tamper and i == 2:
                # what the load leaves: the saved step in the group, a shared zero in the state
                shared = torch.zeros(())
                for group in opt.param_groups:
                    group["step"] = 3.0
                    for p in group["params"]:
                        opt.state[p]["step"] = shared
                eng.restore_step_counts(opt)
                steps_now = [opt.state[p]["step"] for p in ps]
                assert [float(s) for s in steps_now] == [3.0, 3.0]
                assert steps_now[0] is not steps_now[1]  # each its own counter
        return [p.detach() for p in ps]

    for a, b in zip(run(4), run(4, tamper=True), strict=True):
        assert torch.equal(a, b)


def test_restore_step_counts_leaves_optimizers_without_a_group_step_alone():
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.AdamW([p])
    p.grad = torch.ones(2)
    opt.step()
    before = opt.state[p]["step"]
    eng.restore_step_counts(opt)  # no "step" in the group (TE/Apex keep theirs there natively)
    assert opt.state[p]["step"] is before


@pytest.mark.parametrize(
    ("sets", "device", "world", "message"),
    [
        ([], "cpu", 1, "needs a CUDA GPU"),
        (["optimizer.impl=megatron"], "cuda", 1, "needs optimizer.impl torch_fused"),
        ([], "cuda", 2, "needs one GPU"),
    ],
)
def test_cuda_graph_is_refused_where_it_cannot_run(sets, device, world, message):
    from zebractl.errors import ConfigError

    cfg = resolve_recipe(
        "tiny_kda", ["data.paths=[{path: /unused}]", "kernels.cuda_graph=true", *sets]
    ).run
    with pytest.raises(ConfigError, match=message):
        eng.check_engine(cfg, torch.device(device), world)
    off = cfg.model_copy(update={"kernels": cfg.kernels.model_copy(update={"cuda_graph": False})})
    if device == "cpu":
        eng.check_engine(off, torch.device(device), world)  # the same run without it is fine


def test_static_gradients_are_zeroed_in_place_not_freed():
    cfg = resolve_recipe("tiny_kda", ["data.paths=[{path: /unused}]"]).run
    model = torch.nn.Linear(3, 2)
    engine = eng.TorchEngine(cfg, model, torch.device("cpu"), 1)
    model(torch.ones(1, 3)).sum().backward()
    grad = model.weight.grad
    engine.grads_static = True  # what a captured CUDA graph sets: it adds into these buffers
    engine.zero_grad()
    assert model.weight.grad is grad and not grad.any()
    engine.grads_static = False
    engine.zero_grad()
    assert model.weight.grad is None
