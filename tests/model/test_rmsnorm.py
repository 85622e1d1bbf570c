"""zebractl's fused-RMSNorm backward kernel (``zebractl.model.ops.rmsnorm``).

CPU: the Triton kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``, in a subprocess: the
variable must be set before the kernel is defined) on fresh random inputs, against an fp64
reference computed from the same (already rounded) inputs. Tolerances (relative L2): fp32 outputs
1e-6 (fp32 arithmetic over rows of up to 1024); bf16 outputs 4e-3 (one rounding to bf16, unit
roundoff 2^-9 = 2e-3 per element). GPU: the whole function against FLA's ``rms_norm`` on the same
inputs, forward bitwise (it is FLA's forward) and gradients within 1e-5 (fp32 outputs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

CASE = textwrap.dedent(
    """
    import json, sys, torch
    from zebractl.model.ops.rmsnorm import rms_norm_bwd

    torch.manual_seed(int(sys.argv[1]))
    out = []
    # (rows, width, dtype of dx, dtype of the residual or None): fp32 alone; the torch_fused
    # engine's bf16 branch with an fp32 residual stream; bf16 throughout; a ragged last tile
    for t, d, xd, rd in [(37, 96, "float32", None), (64, 1024, "bfloat16", "float32"),
                         (50, 200, "bfloat16", "bfloat16"), (13, 1024, "float32", "float32")]:
        xd, rd = getattr(torch, xd), rd and getattr(torch, rd)
        x = torch.randn(t, d).to(rd or xd)  # the stored sum (residual dtype)
        w = torch.randn(d)
        dy = torch.randn(t, d).to(xd)
        dres = torch.randn(t, d).to(rd) if rd else None
        eps = 1e-6
        rstd = torch.rsqrt(x.double().pow(2).mean(-1) + eps).float()
        xr = x.double().requires_grad_()
        wr = w.double().requires_grad_()
        y = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + eps) * wr
        y.backward(dy.double())
        ref_dx = xr.grad + (dres.double() if dres is not None else 0)
        dx, dw, dres_in = rms_norm_bwd(dy, x, w, rstd, dres, xd, rd)
        err = lambda a, b: ((a.double() - b).norm() / b.norm()).item()
        out.append({"case": [t, d, str(xd), str(rd)], "dx": err(dx, ref_dx), "dx_dtype": str(dx.dtype),
                    "dw": err(dw, wr.grad), "dres_in": None if dres_in is None else err(dres_in, ref_dx),
                    "same": dres_in is dx, "dres_dtype": None if dres_in is None else str(dres_in.dtype)})
    print(json.dumps(out))
    """
)


def test_backward_kernel_in_the_interpreter_against_fp64():
    seed = torch.randint(0, 2**31, ()).item()
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run(
        [sys.executable, "-c", CASE, str(seed)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    for row in rows:
        tol = 1e-6 if row["dx_dtype"] == "torch.float32" else 4e-3
        assert row["dx"] <= tol and row["dw"] <= 1e-6, (seed, row)
        t, d, xd, rd = row["case"]
        if rd == "None":
            assert row["dres_in"] is None
        else:
            assert row["dres_dtype"] == rd and row["same"] == (rd == xd), (seed, row)
            assert row["dres_in"] <= (1e-6 if rd == "torch.float32" else 4e-3), (seed, row)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("prenorm", [False, True])
def test_gpu_matches_flas_rms_norm(prenorm):
    from fla.modules.norm.layernorm import rms_norm as fla_rms_norm

    from zebractl.model.ops.rmsnorm import rms_norm

    t, d = 4096 + 7, 1024
    x = torch.randn(t, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    res = torch.randn(t, d, device="cuda", dtype=torch.float32, requires_grad=True)
    w = torch.randn(d, device="cuda", requires_grad=True)
    dy = torch.randn(t, d, device="cuda", dtype=torch.bfloat16)
    dr = torch.randn(t, d, device="cuda", dtype=torch.float32)
    grads = []
    for fn in (fla_rms_norm, None):
        for p in (x, res, w):
            p.grad = None
        if fn is None:
            out = rms_norm(x, w, 1e-6, residual=res if prenorm else None, prenorm=prenorm)
        else:
            out = fn(x, w, None, residual=res if prenorm else None, eps=1e-6, prenorm=prenorm)
        if prenorm:
            torch.autograd.backward(out, (dy, dr))
            grads.append((out[0].detach(), x.grad, res.grad, w.grad))
        else:
            out.backward(dy)
            grads.append((out.detach(), x.grad, w.grad))
    (fy, *fg), (oy, *og) = grads
    assert torch.equal(fy, oy)  # the same forward kernel
    for a, b in zip(fg, og, strict=True):
        rel = ((a.double() - b.double()).norm() / a.double().norm()).item()
        tol = 1e-5 if a.dtype == torch.float32 else 4e-3
        assert rel <= tol, (a.dtype, rel)
