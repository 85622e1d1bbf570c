"""zebractl.runtime.lazy_compile: torch.compile wrappers made on a function's first call.

The compiled functions use the ``eager`` backend (TorchDynamo's graph, no code generation) so the
tests need no C compiler; the results are compared bitwise with the plain function (seed 0).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from zebractl.runtime import lazy_compile as lc  # noqa: E402


def _f(x):
    return torch.sin(x) * 2 + 1


def test_a_function_is_compiled_on_its_first_call_and_gives_the_same_result():
    torch.manual_seed(0)
    x = torch.randn(8, 5)
    real = torch.compile
    with lc.deferred_compile():
        assert torch.compile is not real
        g = torch.compile(_f, backend="eager", fullgraph=True)
        h = torch.compile(backend="eager")(_f)  # the decorator form with options
    assert torch.compile is real  # restored
    assert g.zebractl_compiled == [] and h.zebractl_compiled == []  # nothing made at import
    assert torch.equal(g(x), _f(x)) and torch.equal(h(x), _f(x))
    assert len(g.zebractl_compiled) == 1
    made = g.zebractl_compiled[0]
    g(x)
    assert g.zebractl_compiled == [made]  # made once
    assert g.__name__ == "_f" and g.__wrapped__ is _f


def test_a_module_goes_to_torch_compile_at_once():
    m = torch.nn.Linear(3, 2)
    with lc.deferred_compile():
        c = torch.compile(m, backend="eager")
    assert not hasattr(c, "zebractl_compiled") and type(c).__name__ == "OptimizedModule"


def test_torch_compile_is_restored_when_the_import_fails():
    real = torch.compile
    with pytest.raises(RuntimeError), lc.deferred_compile():
        raise RuntimeError("import failed")
    assert torch.compile is real


def test_inside_a_compiled_region_the_function_is_traced_inline():
    with lc.deferred_compile():
        inner = torch.compile(_f, backend="eager")

    def outer(x):
        return inner(x) * 3

    torch.manual_seed(0)
    x = torch.randn(4, 4)
    compiled = torch.compile(outer, backend="eager", fullgraph=True)
    got = compiled(x)
    assert inner.zebractl_compiled == []  # traced into the outer graph, not compiled apart
    assert torch.equal(got, outer(x))


PROBE = """
import json, sys, time
import torch
from zebractl.runtime.lazy_compile import import_frameworks
t = time.perf_counter()
done = import_frameworks(fla=True)
print(json.dumps({"done": done, "s": time.perf_counter() - t,
                  "inductor": "torch._inductor.compile_fx" in sys.modules,
                  "again": import_frameworks(fla=True)}))
"""


def test_importing_megatron_and_fla_skips_torch_inductor():
    """A fresh interpreter: the import of megatron-core and FLA leaves TorchInductor unimported
    (with the wrappers made at import, megatron's jit_fuser and FLA's MLP import it)."""
    pytest.importorskip("megatron.core")
    pytest.importorskip("fla")
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, check=True
    )
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    print(doc)
    assert doc["done"][:2] == ["megatron.core", "fla"] and doc["again"] == []
    assert doc["inductor"] is False


def test_train_imports_the_frameworks_lazily_only_when_asked(fast, tmp_path, monkeypatch):
    """``kernels.lazy_framework_compile: true``: the trainer calls import_frameworks, for megatron
    only on a CPU (FLA is imported only once a GPU is set); false: it does not. What the deferred
    import changes is tested above (the same function, made on its first call)."""
    pytest.importorskip("megatron.core")
    calls = []
    monkeypatch.setattr(lc, "import_frameworks", lambda fla: calls.append(fla) or [])
    sets = ("schedule.iterations=2", "checkpoint.enabled=false")
    fast.train("tiny_kda", tmp_path / "eager", "kernels.lazy_framework_compile=false", *sets)
    assert calls == []
    fast.train("tiny_kda", tmp_path / "lazy", "kernels.lazy_framework_compile=true", *sets)
    assert calls == [False]
    assert fast.losses(tmp_path / "lazy") and fast.losses(tmp_path / "eager")  # both trained
