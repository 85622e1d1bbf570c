"""The files of a comparison: ``compare.md``, ``compare.json`` and the PNG plots (matplotlib): three
for a parity report, two for a fine-tune pair's before/after report."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _f(x: float | None, spec: str = ".4f") -> str:
    return "n/a" if x is None else format(x, spec)


def _throughput(r: Any) -> list[str]:
    a, b, t = r.a.label, r.b.label, r.throughput
    out = ["## Throughput", ""]
    if not t.meaningful:
        out += [f"**Not meaningful**: {t.note}.", ""]
    out += [f"| | {a} | {b} | A / B |", "|---|---:|---:|---:|"]
    tokens = "tokens/s/GPU" if t.meaningful else "tokens/s (CPU: not meaningful)"
    for key, name, spec in (
        ("tokens_per_s", tokens, ",.0f"),
        ("tflops_per_gpu", "TFLOP/s/GPU", ".1f"),
        ("mfu", "MFU", ".3f"),
        ("memory_gib", "peak memory (GiB)", ".1f"),
    ):
        out.append(
            f"| {name} | {_f(getattr(t.a, key), spec)} | {_f(getattr(t.b, key), spec)} | "
            f"{_f(getattr(t.ratio, key), '.3f')} |"
        )
    return out


def _differences(r: Any, *, tag_must_match: bool = True) -> list[str]:
    out = ["", "## Config differences between the runs", ""]
    if r.differences:
        out += ["| key | A | B | A from | B from |", "|---|---|---|---|---|"]
        out += [
            f"| {d.key}{' (must match)' if d.must_match and tag_must_match else ''} | `{d.a}` | "
            f"`{d.b}` | {d.a_source} | {d.b_source} |"
            for d in r.differences
        ]
    else:
        out.append(
            "None: the same resolved config (the newest of each run"
            + ("; see the changes within a run below)." if r.config_changes else ").")
        )
    return out


def _finetune_markdown(r: Any) -> str:
    f = r.finetune
    after, before = (r.a, r.b) if f.after == "a" else (r.b, r.a)
    A, B = f.after.upper(), f.before.upper()
    chat = ": its losses are over the assistant tokens only" if f.data_format == "chat" else ""
    start = (
        f"{before.label}'s checkpoint of iteration {f.iteration} (`{f.checkpoint}`)"
        if f.iteration is not None
        else f"{before.label} (which checkpoint: not recorded)"
    )
    out = [
        f"# Fine-tune: {after.label} from {before.label}",
        "",
        f"- After ({A}): `{after.run}`, {after.iterations} iterations on data.format "
        f"{f.data_format}{chat}",
        f"- Before ({B}): `{before.run}`, {before.iterations} iterations",
        f"- {A}'s weights started from {start}: init_from `{f.init_from}` ({f.given_by}; "
        f"recorded in `{f.recorded_in}`)",
        "- A before/after report, not a parity report: the runs trained on different data with "
        "different schedules, so no loss-parity number (iteration-1 Δ, last-half Δ%) is computed "
        "and no check applies (`compare --assert` refuses this pair).",
        "",
        *_differs(r),
        f"## Eval: after − before ({A} − {B})",
        "",
    ]
    if f.eval:
        out += [
            f"Δ = after − before = {A} − {B}: accuracies in points, higher is better; "
            "perplexity and bits per byte as lm-eval gives them, lower is better. Before: "
            f"iteration {_f(f.eval_before_iteration, 'd')}; after: iteration "
            f"{_f(f.eval_after_iteration, 'd')}.",
            "",
            f"| task | metric | before ({B}) | after ({A}) | Δ ({A} − {B}) | ± stderr before / after |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for e in f.eval:
            spec = ".2f" if e.unit == "points" else ".4f"
            metric = e.metric + (" (points)" if e.unit == "points" else "")
            better = "" if e.delta == 0 or (e.delta > 0) == e.higher_is_better else " (worse)"
            out.append(
                f"| {e.task} | {metric} | {e.before:{spec}} | {e.after:{spec}} | "
                f"{e.delta:+{spec}}{better} | {_f(e.before_stderr, spec)} / "
                f"{_f(e.after_stderr, spec)} |"
            )
    else:
        out.append("No task to compare.")
    if f.eval_not_compared:
        out += ["", "Not compared:", ""]
        out += [f"- {x.task}: {x.reason}" for x in f.eval_not_compared]
    if f.notes:
        out += ["", "Notes:", ""]
        out += [f"- {n}" for n in f.notes]
    what = "assistant-token loss" if f.data_format == "chat" else "loss"
    out += ["", f"## Fine-tune {what} ({after.label})", ""]
    if f.train_loss:
        first, last = f.train_loss[0], f.train_loss[-1]
        out.append(
            f"- training, iteration {first.iteration} (the initial weights, before any update, "
            f"on the first batch): {first.loss:.4f}; iteration {last.iteration}: {last.loss:.4f} "
            f"(Δ {last.loss - first.loss:+.4f})"
        )
    if f.val_loss:
        out.append(
            "- validation on its held-out data: "
            + ", ".join(f"iteration {v.iteration}: {v.loss:.4f}" for v in f.val_loss)
        )
    v = r.val_loss
    out += [
        f"- each run's last validation loss on its own held-out data: {A} {_f(v.a)}, {B} "
        f"{_f(v.b)} (other data: no delta)",
        "",
    ]
    out += _throughput(r)
    out += _differences(r, tag_must_match=False)
    out += _changes(r)
    return "\n".join(out) + "\n"


def _starts(s: Any) -> str:
    parts = []
    for x in s.starts:
        if x.event == "found":
            parts.append(
                f"its resolved config of {x.created} (trained before the history was kept)"
            )
        else:
            parts.append(f"{x.event} at iteration {x.iteration} on {x.device} (`{x.run_id}`)")
    return "; ".join(parts) or "none recorded"


def _changes(r: Any) -> list[str]:
    """The values that changed within a run, at a resume."""
    out = ["", "## Config changes within a run", ""]
    if r.config_changes:
        out += [
            "| run | from iteration | key | before | after | before from | after from |",
            "|---|---:|---|---|---|---|---|",
        ]
        out += [
            f"| {c.side.upper()} | {_f(c.iteration, 'd')} | {c.key} | `{c.before}` | `{c.after}` | "
            f"{c.before_source} | {c.after_source} |"
            for c in r.config_changes
        ]
    else:
        out.append("None: each run trained under one resolved config throughout.")
    out += ["", f"- A's sessions: {_starts(r.a)}", f"- B's sessions: {_starts(r.b)}"]
    return out


def _changed_warning(r: Any) -> list[str]:
    if not r.config_changes:
        return []
    said = "; ".join(
        f"{c.side.upper()} from iteration {_f(c.iteration, 'd')}: {c.key} `{c.before}` → "
        f"`{c.after}`"
        for c in r.config_changes
    )
    return [
        f"**Config changed within a run** (at a resume): {said}. Its curve was not trained under "
        'one config; see "Config changes within a run".',
        "",
    ]


def verdict_word(r: Any) -> str:
    """PASS, FAIL, NOTHING TO CHECK, or NO VERDICT (runs of different models, a fine-tune pair)."""
    return r.verdict.result or "NO VERDICT"


def _differs(r: Any) -> list[str]:
    """The config differences a verdict is read with, right under it."""
    from zebractl.compare.verdict import SHOWN, listed, other_differences

    rows = other_differences(r)
    if not rows:
        return []
    more = " (every one, with where it came from: Config differences below)"
    also = "also " if r.kind == "models_differ" else ""
    return [
        f"The runs {also}differ in (A ≠ B): {listed(rows)}"
        + (more if len(rows) > SHOWN else "")
        + ".",
        "",
    ]


def _verdict_head(r: Any) -> list[str]:
    """A parity report's first lines: the verdict, its bounds, the differences it is read with."""
    word = verdict_word(r)
    bounds = r.verdict.reason if r.checks else "no common iteration to check"
    return [
        f"# Parity {word}: {r.a.label} vs {r.b.label}",
        "",
        f"**{word}**: {bounds}",
        "",
        *_differs(r),
    ]


def _models_head(r: Any) -> list[str]:
    """The first lines of runs of different models: no verdict, the models and their fields."""
    out = [
        f"# Models differ: {r.a.label} vs {r.b.label}",
        "",
        "**No parity verdict**: the runs are of different models, and a verdict compares runs of "
        "one model; the curves and numbers below are a plain comparison, with no tolerance.",
        "",
        f"- A: {r.a.model or 'a model its record does not describe'}",
        f"- B: {r.b.model or 'a model its record does not describe'}",
        "",
        "| model field | A | B |",
        "|---|---|---|",
    ]
    out += [f"| {d.key} | `{_cell(d.a)}` | `{_cell(d.b)}` |" for d in r.model_differences]
    return [*out, "", *_differs(r)]


def _cell(value: Any) -> str:
    from zebractl.config.models import show

    return show(value).replace("|", "\\|")


def markdown(r: Any) -> str:
    """The report as Markdown (tables like the seed's): the verdict first, or, for runs of
    different models, that there is none and where the models differ."""
    if r.kind == "finetune":
        return _finetune_markdown(r)
    a, b = r.a.label, r.b.label
    plain = r.kind == "models_differ"
    out = [
        *(_models_head(r) if plain else _verdict_head(r)),
        *_changed_warning(r),
        f"- A: `{r.a.run}` ({r.a.iterations} iterations, on {r.a.device or 'a device not recorded'})",
        f"- B: `{r.b.run}` ({r.b.iterations} iterations, on {r.b.device or 'a device not recorded'})",
        "- Δ = A − B (positive: A's loss is higher); Δ% = 100 (A − B) / B, relative to B",
        f"- iteration-1 Δ loss: {_f(r.iteration1_delta, '+.6f')}; last-half mean |Δ%|: "
        f"{_f(r.last_half_mean_abs_pct, '.3f')}",
        "",
        "## Loss" + (" (a plain comparison: no tolerance applies)" if plain else ""),
        "",
        f"| iteration | {a} | {b} | Δ (A − B) | Δ% (of B) | LR A | LR B |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    out += [
        f"| {x.iteration} | {x.a:.4f} | {x.b:.4f} | {x.delta:+.4f} | {x.delta_pct:+.3f} | "
        f"{_f(x.lr_a, '.3e')} | {_f(x.lr_b, '.3e')} |"
        for x in r.loss
    ]
    v = r.val_loss
    out += ["", f"Validation loss: A {_f(v.a)}, B {_f(v.b)}, Δ (A − B) {_f(v.delta, '+.4f')}", ""]
    out += _throughput(r)
    if r.eval:
        out += [
            "",
            "## Eval (points)",
            "",
            f"| task | metric | {a} | {b} | Δ (A − B) |",
            "|---|---|---:|---:|---:|",
        ]
        out += [
            f"| {e.task} | {e.metric} | {e.a:.2f} | {e.b:.2f} | {e.delta_pp:+.2f} |" for e in r.eval
        ]
        out += ["", f"Mean |Δ|: {_f(r.eval_mean_abs_pp, '.2f')} points"]
    out += _differences(r)
    out += _changes(r)
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


def _throughput_plot(r: Any, folder: Path, plt: Any) -> Path:
    fig, ax = plt.subplots(figsize=(4, 3))
    vals = [r.throughput.a.tokens_per_s or 0.0, r.throughput.b.tokens_per_s or 0.0]
    ax.bar([r.a.label, r.b.label], vals)
    meaningful = r.throughput.meaningful
    ax.set(
        ylabel="tokens/s/GPU" if meaningful else "tokens/s",
        title="Throughput" if meaningful else "Throughput (CPU: not meaningful)",
    )
    path = folder / "throughput.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def _finetune_plots(r: Any, folder: Path, plt: Any) -> list[Path]:
    """loss.png: the fine-tuned run's training and validation loss; throughput.png."""
    f = r.finetune
    after = r.a if f.after == "a" else r.b
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([x.iteration for x in f.train_loss], [x.loss for x in f.train_loss], label="training")
    if f.val_loss:
        ax.plot([x.iteration for x in f.val_loss], [x.loss for x in f.val_loss], "o--",
                label="validation")  # fmt: skip
    what = "assistant-token loss" if f.data_format == "chat" else "loss"
    ax.set(xlabel="iteration", ylabel=what, title=f"Fine-tune: {after.label}")
    ax.legend()
    path = folder / "loss.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return [path, _throughput_plot(r, folder, plt)]


def plots(r: Any, folder: Path) -> list[Path]:
    """loss.png, delta.png and throughput.png in ``folder`` (a fine-tune pair: loss.png, the
    fine-tuned run's own curve, and throughput.png)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if r.kind == "finetune":
        return _finetune_plots(r, folder, plt)
    files = []
    for name, make in (("loss.png", loss_figure), ("delta.png", delta_figure)):
        fig = make(r, plt)
        files.append(folder / name)
        fig.savefig(files[-1], dpi=100, bbox_inches="tight")
        plt.close(fig)
    files.append(_throughput_plot(r, folder, plt))
    return files


def loss_figure(r: Any, plt: Any) -> Any:
    """loss.png: both training curves, each run's validation losses as markers, and a dotted line
    at each resume that changed a run's config."""
    c = r.curves
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(c.iterations, c.a, label=f"A {r.a.label} (training)")
    ax.plot(c.iterations, c.b, label=f"B {r.b.label} (training)", linestyle="--")
    for side, points, marker in (("A", c.val_a, "o"), ("B", c.val_b, "s")):
        label = r.a.label if side == "A" else r.b.label
        if points:
            ax.plot([p.iteration for p in points], [p.loss for p in points], marker,
                    linestyle=":", label=f"{side} {label} (validation)")  # fmt: skip
    for at in sorted({x.iteration for x in r.config_changes if x.iteration is not None}):
        ax.axvline(at, color="red", linestyle=":", linewidth=1.0, label="config changed (resume)")
    ax.set(xlabel="iteration", ylabel="loss", title="Loss")
    handles, labels = ax.get_legend_handles_labels()
    keep = dict(zip(labels, handles, strict=True))  # one entry per label
    ax.legend(keep.values(), keep.keys())
    return fig


def delta_figure(r: Any, plt: Any) -> Any:
    """delta.png: Δ% = 100 (A - B) / B, the tolerance band of the last-half check (±its bound)
    and where its last half begins."""
    c = r.curves
    fig, ax = plt.subplots(figsize=(7, 3))
    pct = [100 * (x - y) / y for x, y in zip(c.a, c.b, strict=True)]
    tol = next((x for x in r.checks if x.name == "last_half_pct"), None)
    if tol is not None:
        ax.axhspan(-tol.tolerance, tol.tolerance, color="tab:green", alpha=0.15,
                   label=f"tolerance ±{tol.tolerance:g}% (last-half mean |Δ%|)")  # fmt: skip
    if c.iterations:
        ax.axvline(c.iterations[-1] / 2, color="grey", linestyle=":", linewidth=1.0,
                   label="last half begins")  # fmt: skip
    ax.plot(c.iterations, pct, label="Δ%")
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set(xlabel="iteration", ylabel="Δ% = 100 (A − B) / B", title="Loss difference, A − B")
    ax.legend()
    return fig


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
