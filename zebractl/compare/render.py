"""The files of a comparison: ``compare.md``, ``compare.json`` and three PNG plots (matplotlib)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _f(x: float | None, spec: str = ".4f") -> str:
    return "n/a" if x is None else format(x, spec)


def markdown(r: Any) -> str:
    """The report as Markdown (tables like the seed's)."""
    a, b = r.a.label, r.b.label
    out = [
        f"# Parity: {a} vs {b}",
        "",
        f"- A: `{r.a.run}` ({r.a.iterations} iterations)",
        f"- B: `{r.b.run}` ({r.b.iterations} iterations)",
        f"- iteration-1 Δ loss: {_f(r.iteration1_delta, '+.6f')}; last-half mean |Δ%|: "
        f"{_f(r.last_half_mean_abs_pct, '.3f')}",
        "",
        "## Loss",
        "",
        f"| iteration | {a} | {b} | Δ | Δ% |",
        "|---:|---:|---:|---:|---:|",
    ]
    out += [
        f"| {x.iteration} | {x.a:.4f} | {x.b:.4f} | {x.delta:+.4f} | {x.delta_pct:+.3f} |"
        for x in r.loss
    ]
    v = r.val_loss
    out += ["", f"Validation loss: A {_f(v.a)}, B {_f(v.b)}, Δ {_f(v.delta, '+.4f')}", ""]
    t = r.throughput
    out += ["## Throughput", "", f"| | {a} | {b} | A / B |", "|---|---:|---:|---:|"]
    for key, name, spec in (
        ("tokens_per_s", "tokens/s/GPU", ",.0f"),
        ("tflops_per_gpu", "TFLOP/s/GPU", ".1f"),
        ("mfu", "MFU", ".3f"),
        ("memory_gib", "peak memory (GiB)", ".1f"),
    ):
        out.append(
            f"| {name} | {_f(getattr(t.a, key), spec)} | {_f(getattr(t.b, key), spec)} | "
            f"{_f(getattr(t.ratio, key), '.3f')} |"
        )
    if r.eval:
        out += [
            "",
            "## Eval (points)",
            "",
            f"| task | metric | {a} | {b} | Δ |",
            "|---|---|---:|---:|---:|",
        ]
        out += [
            f"| {e.task} | {e.metric} | {e.a:.2f} | {e.b:.2f} | {e.delta_pp:+.2f} |" for e in r.eval
        ]
        out += ["", f"Mean |Δ|: {_f(r.eval_mean_abs_pp, '.2f')} points"]
    out += ["", "## Config differences", ""]
    if r.differences:
        out += ["| key | A | B | A from | B from |", "|---|---|---|---|---|"]
        out += [
            f"| {d.key}{' (must match)' if d.must_match else ''} | `{d.a}` | `{d.b}` | "
            f"{d.a_source} | {d.b_source} |"
            for d in r.differences
        ]
    else:
        out.append("None: the same resolved config.")
    if r.checks:
        out += [
            "",
            "## Checks",
            "",
            "| check | value | tolerance | result |",
            "|---|---:|---:|---|",
        ]
        out += [
            f"| {c.what.replace('|', chr(92) + '|')} | {c.value:.6g} | {c.tolerance:.6g} | {'ok' if c.ok else 'FAIL'} |"
            for c in r.checks
        ]
    return "\n".join(out) + "\n"


def plots(r: Any, folder: Path) -> list[Path]:
    """loss.png, delta.png and throughput.png in ``folder``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    c = r.curves
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(c.iterations, c.a, label=r.a.label)
    ax.plot(c.iterations, c.b, label=r.b.label, linestyle="--")
    ax.set(xlabel="iteration", ylabel="training loss", title="Loss")
    ax.legend()
    files.append(folder / "loss.png")
    fig.savefig(files[-1], dpi=100, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3))
    pct = [100 * (y - x) / x for x, y in zip(c.a, c.b, strict=True)]
    ax.plot(c.iterations, pct)
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set(xlabel="iteration", ylabel="Δ% (B - A)", title="Loss difference")
    files.append(folder / "delta.png")
    fig.savefig(files[-1], dpi=100, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(4, 3))
    vals = [r.throughput.a.tokens_per_s or 0.0, r.throughput.b.tokens_per_s or 0.0]
    ax.bar([r.a.label, r.b.label], vals)
    ax.set(ylabel="tokens/s/GPU", title="Throughput")
    files.append(folder / "throughput.png")
    fig.savefig(files[-1], dpi=100, bbox_inches="tight")
    plt.close(fig)
    return files


def write(r: Any, folder: Path) -> Any:
    """Write every file; returns the report with ``files`` filled in.

    Under the lock of the run directory holding ``folder`` (:func:`~zebractl.run.lock.writer_root`;
    re-entrant: ``zebractl compare`` holds it for the whole command already)."""
    from zebractl.run import lock
    from zebractl.run.rundir import write_text_atomic

    with lock.hold(lock.writer_root(folder), "compare"):
        folder.mkdir(parents=True, exist_ok=True)
        pngs = plots(r, folder)
        md = folder / "compare.md"
        js = folder / "compare.json"
        r = r.model_copy(update={"files": [str(md), str(js), *map(str, pngs)]})
        write_text_atomic(md, markdown(r))
        write_text_atomic(js, r.model_dump_json(by_alias=True, indent=2) + "\n")
    return r
