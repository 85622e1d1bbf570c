"""Generation steps on FLA's fused recurrent kernels (``zebractl.model.ops.recurrent_step``).

CPU: when the fla backend takes FLA's fused recurrent kernel (a call that keeps its state, at most
64 tokens, no gradient recorded) and when its chunk kernels; that both get the same arguments (the
chunk-only ones aside), each a named parameter of FLA's fused recurrent function (nothing lands
in its ``**kwargs``, where it would be ignored); and that the torch backend never calls FLA and
steps a state as the step-by-step reference does (1e-5). Triton's interpreter cannot run these
kernels here (their loop bounds trip it), so the numbers are the GPU's.

GPU: on a state left by 80 tokens of the chunk kernels, steps of 1 and 7 tokens through the fused
recurrent kernel against the chunk kernels on the same inputs (``torch.enable_grad()`` keeps a call on
them), output and final state, and both against the torch backend's fp32 recurrence, relative L2:
the step against the torch backend within 1e-4 in fp32 (the same fp32 recurrence: 1.5e-7 seen for
KDA on an H100) and 1e-2 in bf16 (bf16 outputs; the torch path rounds the normalised q/k to bf16:
4.5e-3 seen); against the chunk kernels within 5e-3 in fp32 (their tf32 products: 1.2e-3 seen) and
2e-2 in bf16 (6.5e-3 seen). Cases: KDA (gate and q/k norm inside and outside the kernel, negative
eigenvalues, the bounded gate), GDN (grouped values), Mamba2's SSD (both ``ssd_precision``
settings); bf16, and fp32 for each op's defaults. Seeds are printed. Tiny shapes: FLA autotunes its
chunk kernels for them on a cold kernel cache (minutes on an H100).
"""

from __future__ import annotations

import importlib
import inspect

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("fla.ops.kda")

from zebractl.model import ops  # noqa: E402
from zebractl.model.ops import torch_ops as T  # noqa: E402
from zebractl.schemas.recipe import KernelsConfig  # noqa: E402

KERNELS = {
    "kda": ("fla.ops.kda", "chunk_kda", "fused_recurrent_kda", {"safe_gate", "cu_seqlens"}),
    "gdn": (
        "fla.ops.gated_delta_rule",
        "chunk_gated_delta_rule",
        "fused_recurrent_gated_delta_rule",
        {"cu_seqlens"},
    ),
    "ssd": ("fla.ops.simple_gla", "chunk_simple_gla", "fused_recurrent_simple_gla", {"cu_seqlens"}),
}
"""op -> (FLA module, chunk function, fused recurrent function, arguments only the chunk takes)."""


def _rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _inputs(op: str, t: int, gen: torch.Generator, dtype=torch.float32, device="cpu"):
    """(positional operands, keyword options, a state) of ``ops.<op>`` for ``t`` tokens: raw
    projections of a plausible scale, grouped values (HV = 2 H) for the delta rules."""
    b, h, hv, dk, dv = 2, 2, 4, 32, 16

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device, dtype)

    if op == "ssd":
        g = (-torch.rand(b, t, hv, generator=gen) * 0.5).to(device)
        args = (r(b, t, hv, dk), r(b, t, hv, dk, scale=0.1), r(b, t, hv, dv), g)
        return args, {}, (torch.randn(b, hv, dk, dv, generator=gen) * 0.1).to(device)
    gate = r(b, t, hv, dk) if op == "kda" else r(b, t, hv)
    a_log = (torch.rand(hv, generator=gen) * 2).to(device)
    dt_bias = (torch.randn(hv * dk if op == "kda" else hv, generator=gen) * 0.5).to(device)
    args = (r(b, t, h, dk), r(b, t, h, dk), r(b, t, hv, dv), gate, r(b, t, hv), a_log, dt_bias)
    return args, {}, (torch.randn(b, hv, dk, dv, generator=gen) * 0.1).to(device)


def _recorder(calls: list, name: str):
    def fake(*args, **kw):
        calls.append((name, args, kw))
        v = args[2]
        return torch.zeros_like(v), torch.zeros(v.shape[0], v.shape[2], args[0].shape[-1], 1)

    return fake


def test_when_a_call_runs_the_fused_recurrent_kernel():
    fla, torch_ = ops.KernelOptions("fla"), ops.KernelOptions("torch")
    one, many = torch.zeros(1, 1, 2), torch.zeros(1, ops.RECURRENT_MAX_TOKENS + 1, 2)
    edge = torch.zeros(1, ops.RECURRENT_MAX_TOKENS, 2)
    cu = torch.tensor([0, 1])
    with torch.no_grad():
        assert ops.recurrent_step(fla, one, None, True)
        assert ops.recurrent_step(fla, edge, None, True)
        assert not ops.recurrent_step(fla, many, None, True)  # a prompt: the chunk kernels
        assert not ops.recurrent_step(fla, one, None, False)  # no cache: the chunk kernels
        assert not ops.recurrent_step(fla, one, cu, True)
        assert not ops.recurrent_step(torch_, one, None, True)
    with torch.enable_grad():  # training: FLA's fused recurrent kernels have no backward
        assert not ops.recurrent_step(fla, one, None, True)


@pytest.mark.parametrize(
    "op,kernels,extra",
    [
        ("kda", {}, {}),
        ("kda", {"kda_gate_in_kernel": False, "qk_l2norm_in_kernel": False},
         {"allow_neg_eigval": True}),
        ("kda", {}, {"safe_gate": True, "lower_bound": -5.0}),
        ("gdn", {}, {}),
        ("gdn", {"gdn_gate_in_kernel": False, "qk_l2norm_in_kernel": False},
         {"allow_neg_eigval": True}),
        ("ssd", {}, {}),
    ],
)  # fmt: skip
def test_a_step_passes_the_chunk_arguments_to_the_fused_recurrent_kernel(
    op, kernels, extra, monkeypatch
):
    module, chunk, fused, chunk_only = KERNELS[op]
    mod = importlib.import_module(module)
    real = getattr(mod, fused)
    calls: list = []
    for name in (chunk, fused):
        monkeypatch.setattr(mod, name, _recorder(calls, name))
    if not kernels.get("qk_l2norm_in_kernel", True):  # FLA's l2norm outside the kernel
        monkeypatch.setattr("fla.modules.norm.l2norm.l2norm", T.l2norm)
    args, _, s0 = _inputs(op, 1, torch.Generator().manual_seed(0))
    opts = ops.KernelOptions("fla", KernelsConfig(**kernels))
    fn = getattr(ops, op)
    with torch.no_grad():
        out = fn(opts, *args, initial_state=s0, output_final_state=True, **extra)
    with torch.enable_grad():
        fn(opts, *args, initial_state=s0, output_final_state=True, **extra)
    assert out[0].dtype == args[2].dtype
    (n_step, a_step, k_step), (n_chunk, a_chunk, k_chunk) = calls
    assert (n_step, n_chunk) == (fused, chunk)
    assert len(a_step) == len(a_chunk) and all(
        torch.equal(x, y) for x, y in zip(a_step, a_chunk, strict=True)
    )
    assert set(k_chunk) - set(k_step) == chunk_only
    for key, value in k_step.items():
        other = k_chunk[key]
        same = torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other
        assert same, (op, key)
    assert k_step["initial_state"] is s0 and k_step["output_final_state"] is True
    # every argument is one of the fused function's own parameters (none lost in **kwargs)
    bound = inspect.signature(real).bind(*a_step, **k_step)
    var_kw = [
        p.name for p in inspect.signature(real).parameters.values() if p.kind == p.VAR_KEYWORD
    ]
    assert all(not bound.arguments.get(name) for name in var_kw), bound.arguments
    if op == "ssd":
        assert all(x.dtype == torch.float32 for x in a_step) and k_step["scale"] == 1.0
        assert k_step["g"].dtype == torch.float32
        return
    assert torch.equal(bound.arguments["beta"], args[4])
    assert bound.arguments["use_beta_sigmoid_in_kernel"] is True
    gate_in = kernels.get(f"{op}_gate_in_kernel", True)
    assert bound.arguments.get("use_gate_in_kernel", False) is gate_in
    if gate_in:  # the raw decay logits and the decay parameters go in
        assert torch.equal(bound.arguments["g"], args[3])
        assert bound.arguments["A_log"] is args[5] and bound.arguments["dt_bias"] is args[6]


def test_a_mixed_precision_ssd_step_rounds_its_operands_as_the_mixed_scan(monkeypatch):
    """``ssd_precision: mixed`` with 16-bit x: the chunk path (``ssd_mixed``) takes q and k in
    x's dtype; the step rounds them alike, then runs the fused recurrent kernel in fp32."""
    calls: list = []
    monkeypatch.setattr("fla.ops.simple_gla.fused_recurrent_simple_gla", _recorder(calls, "step"))
    (c, b, x, g), _, s0 = _inputs("ssd", 1, torch.Generator().manual_seed(0))
    opts = ops.KernelOptions("fla", KernelsConfig(ssd_precision="mixed"))
    with torch.no_grad():
        o, _ = ops.ssd(opts, c, b, x.bfloat16(), g, initial_state=s0, output_final_state=True)
    ((_, (qq, kk, xx), kw),) = calls
    assert torch.equal(qq, c.bfloat16().float()) and torch.equal(kk, b.bfloat16().float())
    assert torch.equal(xx, x.bfloat16().float()) and o.dtype == torch.bfloat16
    assert kw["initial_state"] is s0 and kw["scale"] == 1.0


@pytest.mark.parametrize("op", ["kda", "gdn", "ssd"])
def test_the_torch_backend_steps_as_the_reference_without_fla(op, monkeypatch):
    module, chunk, fused, _ = KERNELS[op]
    for name in (chunk, fused):
        monkeypatch.setattr(f"{module}.{name}", lambda *a, **k: pytest.fail("FLA was called"))
    seed = int(torch.randint(0, 2**31 - 1, ()))
    print("seed", seed)
    args, _, s0 = _inputs(op, 3, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        o, s = getattr(ops, op)(
            ops.KernelOptions("torch"), *args, initial_state=s0, output_final_state=True
        )
        ref_o, ref_s = _reference(op, args, s0)
    assert _rel(o, ref_o) <= 1e-5 and _rel(s, ref_s) <= 1e-5, seed


def _reference(op: str, args, s0):
    """The step-by-step fp32 recurrence of ``ops.<op>``'s default semantics (gate and beta
    sigmoid applied, q/k L2-normalised; SSD's scale 1)."""
    if op == "ssd":
        return T.recurrent_scalar_gla(*args, scale=1.0, initial_state=s0, output_final_state=True)
    q, k, v, f, beta, a_log, dt_bias = args
    g = T.kda_gate(f, a_log, dt_bias) if op == "kda" else T.gdn_gate(f, a_log, dt_bias)
    return T.recurrent_delta_rule(
        T.l2norm(q), T.l2norm(k), v, g, torch.sigmoid(beta.float()),
        initial_state=s0, output_final_state=True,
    )  # fmt: skip


BF16, FP32 = torch.bfloat16, torch.float32
GPU_CASES = [
    ("kda", {}, {}, BF16),
    ("kda", {}, {}, FP32),
    ("kda", {"kda_gate_in_kernel": False, "qk_l2norm_in_kernel": False}, {"allow_neg_eigval": True}, BF16),
    ("kda", {}, {"safe_gate": True, "lower_bound": -5.0}, BF16),
    ("gdn", {}, {}, BF16),
    ("gdn", {}, {}, FP32),
    ("gdn", {"gdn_gate_in_kernel": False, "qk_l2norm_in_kernel": False}, {"allow_neg_eigval": True}, BF16),
    ("ssd", {}, {}, BF16),
    ("ssd", {}, {}, FP32),
    ("ssd", {"ssd_precision": "mixed"}, {}, BF16),
]  # fmt: skip
TOL = {BF16: {"chunk": 2e-2, "ref": 1e-2}, FP32: {"chunk": 5e-3, "ref": 1e-4}}
"""Relative L2 bounds against the chunk kernels and against the torch backend's recurrence."""


@pytest.mark.gpu
@pytest.mark.parametrize("op,kernels,extra,dtype", GPU_CASES)
def test_the_fused_recurrent_step_equals_the_chunk_kernels_on_the_gpu(
    op, kernels, extra, dtype, monkeypatch
):
    """Also against the torch backend (the reference): the fused recurrent kernel is the same
    fp32 recurrence (fp32 inputs: 1.5e-7 on an H100), the chunk kernels' products are tf32/bf16."""
    module, _, fused, _ = KERNELS[op]
    mod = importlib.import_module(module)
    real, used = getattr(mod, fused), []
    monkeypatch.setattr(mod, fused, lambda *a, **k: used.append(1) or real(*a, **k))
    seed = int(torch.randint(0, 2**31 - 1, ()))
    print("seed", seed)
    gen = torch.Generator().manual_seed(seed)
    opts = ops.KernelOptions("fla", KernelsConfig(**kernels))
    fn = getattr(ops, op)
    prefix, _, _ = _inputs(op, 80, gen, dtype, "cuda")
    with torch.no_grad():  # 80 tokens: the chunk kernels leave the state
        _, s0 = fn(opts, *prefix, output_final_state=True, **extra)
    assert not used
    for t in (1, 7):
        args, _, _ = _inputs(op, t, gen, dtype, "cuda")
        with torch.no_grad():
            o_step, s_step = fn(opts, *args, initial_state=s0, output_final_state=True, **extra)
        with torch.enable_grad():
            o_chunk, s_chunk = fn(opts, *args, initial_state=s0, output_final_state=True, **extra)
        ref_opts = ops.KernelOptions("torch", KernelsConfig(backend="torch"))
        with torch.no_grad():
            o_ref, s_ref = fn(ref_opts, *args, initial_state=s0, output_final_state=True, **extra)
        errs = {
            "o step-chunk": _rel(o_step, o_chunk),
            "s step-chunk": _rel(s_step, s_chunk),
            "o step-ref": _rel(o_step, o_ref),
            "o chunk-ref": _rel(o_chunk, o_ref),
            "s step-ref": _rel(s_step, s_ref),
        }
        print(op, kernels, extra, dtype, t, {k: f"{v:.2e}" for k, v in errs.items()})
        assert o_step.dtype == o_chunk.dtype == args[2].dtype
        assert s_step.dtype == torch.float32 and s_step.shape == s_chunk.shape == s0.shape
        bounds = {k: TOL[dtype]["ref" if "step-ref" in k else "chunk"] for k in errs}
        assert all(errs[k] <= bounds[k] for k in errs), (seed, t, errs, bounds)
    assert len(used) == 2  # the steps took the fused recurrent kernel, the rest did not
