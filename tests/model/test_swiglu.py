"""zebractl's packed SwiGLU (``zebractl.model.ops.glu``, ``kernels.swiglu_kernel: packed``).

CPU: the autograd function runs its Triton kernels in Triton's interpreter (``TRITON_INTERPRET=1``,
in a subprocess: the variable must be set before the kernels are defined) on fresh random inputs,
against an fp64 reference from the same (already rounded) inputs. Tolerances (relative L2): fp32
1e-6 (a few fp32 operations per element); bf16 4e-3 (one rounding to bf16; Triton 3.6's interpreter
truncates fp32 -> bf16, 3.3e-3 on Gaussian data). GPU: against FLA's ``swiglu`` on the two halves,
the output and the gradient bitwise equal (the same arithmetic, term for term), and the MLP's loss
and gradients with ``swiglu_kernel`` packed equal to fla's bitwise.
"""

from __future__ import annotations

import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

CASE = textwrap.dedent(
    """
    import json, sys, torch
    from zebractl.model.ops.glu import packed_swiglu

    torch.manual_seed(int(sys.argv[1]))
    out = []
    # (leading shape, F, dtype): a ragged row tile and column block; bf16 as the MLP runs it;
    # a width over one column block (two blocks of 1024, the second ragged)
    for lead, f, dt in [((3, 7), 96, "float32"), ((2, 33), 256, "bfloat16"),
                        ((5,), 1500, "float32")]:
        dt = getattr(torch, dt)
        h = torch.randn(*lead, 2 * f).mul(3).to(dt).requires_grad_()
        dout = torch.randn(*lead, f).to(dt)
        o = packed_swiglu(h)
        o.backward(dout)
        hr = h.detach().double().requires_grad_()
        g, u = hr.chunk(2, -1)
        ref = torch.nn.functional.silu(g) * u
        ref.backward(dout.double())
        err = lambda a, b: ((a.double() - b).norm() / b.norm()).item()
        out.append({"case": [list(lead), f, str(dt)], "out": err(o, ref.detach()),
                    "grad": err(h.grad, hr.grad), "shape": list(o.shape) == list(ref.shape),
                    "dtypes": [str(o.dtype), str(h.grad.dtype)]})
    print(json.dumps(out))
    """
)


def test_packed_swiglu_in_the_interpreter_against_fp64(triton_interpreted):
    seed = torch.randint(0, 2**31, ()).item()
    print("seed", seed)
    rows = triton_interpreted(CASE, seed)
    assert len(rows) == 3
    for row in rows:
        tol = 1e-6 if row["case"][2] == "torch.float32" else 4e-3
        assert row["out"] <= tol and row["grad"] <= tol, (seed, row)
        assert row["shape"] and row["dtypes"] == [row["case"][2]] * 2, (seed, row)


def test_an_odd_width_is_refused():
    from zebractl.model.ops.glu import packed_swiglu

    with pytest.raises(ValueError, match="even last dimension"):
        packed_swiglu(torch.zeros(2, 5))


def test_the_option_falls_back_to_the_halves_off_the_fla_backend():
    """On the torch backend (CPU) ``swiglu_kernel: packed`` computes what the halves do."""
    from zebractl.model import ops
    from zebractl.schemas.recipe import KernelsConfig

    torch.manual_seed(0)
    h = torch.randn(4, 10)
    opts = ops.KernelOptions("torch", KernelsConfig(swiglu_kernel="packed"))
    g, u = h.chunk(2, -1)
    assert torch.equal(ops.swiglu_packed(opts, h), torch.nn.functional.silu(g) * u)


@pytest.mark.gpu
def test_packed_swiglu_equals_fla_bitwise_on_the_gpu():
    from fla.modules.activations.ops import swiglu as fla_swiglu

    from zebractl.model.ops.glu import packed_swiglu

    seed = torch.randint(0, 2**31, ()).item()
    print("seed", seed)
    torch.manual_seed(seed)
    for n, f in [(4096, 4096), (1000, 1376)]:
        h = torch.randn(2, n, 2 * f, device="cuda").mul(3).bfloat16()
        dout = torch.randn(2, n, f, device="cuda").bfloat16()
        a = h.clone().requires_grad_()
        b = h.clone().requires_grad_()
        oa = packed_swiglu(a)
        g, u = b.chunk(2, -1)
        ob = fla_swiglu(g, u)
        oa.backward(dout)
        ob.backward(dout)
        assert torch.equal(oa, ob), (seed, n, f)
        assert torch.equal(a.grad, b.grad), (seed, n, f)
