"""Export a zebractl checkpoint to a Hugging Face folder: FLA's classes for pure KDA / GDN models
(format ``fla``), zebractl's own ``ZebraForCausalLM`` (:mod:`zebractl.hf`, format ``zebra``) for every
layout, hybrids and pure Mamba2 included.

``export_hf(SOURCE, OUTPUT)``: SOURCE is a run directory (its newest complete checkpoint, or
``iteration``), its checkpoints folder or one checkpoint folder inside a run. The weights are read
through megatron's sharded checkpoint loader into a CPU model (any data-parallel size the checkpoint
was written with), mapped by the declarative tables of :mod:`zebractl.hf.mapping`, cast to the
export dtype and written as ``model.safetensors`` (sharded with ``model.safetensors.index.json``
above ``max_shard_bytes``), with FLA's ``config.json``, ``generation_config.json``, the tokenizer the
data was prepared with (the dataset's ``tokenizer/``) and a model card. The folder is written under
``OUTPUT.tmp`` and renamed into place at the end: a crash never leaves a folder that looks complete.

``--format auto`` picks ``fla`` where FLA has a class (pure KDA, pure GDN) and ``zebra`` elsewhere.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from zebractl.errors import ConfigError
from zebractl.hf.load import (
    FLA_CLASSES,
    ZEBRACTL_KEY,
    architecture,
    hf_model_config,
    is_hf_folder,
    load_hf_state,
)
from zebractl.schemas.recipe import RunConfig
from zebractl.schemas.reports import ConvertReport

Tensor = torch.Tensor

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
HF_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}
SHARD_BYTES = 5 * 2**30
"""Above this many bytes of tensors the export is sharded (Hugging Face's usual 5 GB)."""


@dataclass
class Source:
    """A checkpoint of a zebractl run and the run's resolved config."""

    run_root: Path
    cfg: RunConfig
    recipe: str
    provenance: dict[str, str]
    checkpoint: Any  # zebractl.run.checkpoint.Checkpoint
    skipped: list[str] = field(default_factory=list)
    """Damaged checkpoints passed over to reach ``checkpoint`` (``FOLDER: reason``, newest first)."""

    def announce(self, console: Callable[[str], None], verb: str, more: str = "") -> None:
        """Say which checkpoint is used (``verb``: reading, converting ...; ``more`` after its
        iteration) and each damaged one passed over, one line each."""
        for line in self.skipped:
            console(f"warning: skipped damaged checkpoint {line}")
        console(f"{verb} {self.checkpoint.folder} (iteration {self.iteration}){more}")

    @property
    def iteration(self) -> int:
        return self.checkpoint.iteration


def checkpoint_choice(choice: int | str | None) -> int | Path | None:
    """``--checkpoint ITER|PATH``: an iteration (digits) or a checkpoint folder's path."""
    if choice is None or isinstance(choice, int):
        return choice
    text = str(choice).strip()
    if not text:
        raise ConfigError("--checkpoint: expected an iteration or a checkpoint folder, got ''")
    return int(text) if text.isdigit() else Path(text)


def open_source(path: Path, iteration: int | str | None = None) -> Source:
    """The run and checkpoint ``path`` names (see the module docstring); ``iteration``
    (``--checkpoint``) chooses one: an iteration of the run, or a checkpoint folder of it."""
    from zebractl.run import checkpoint as ckpt
    from zebractl.run.rundir import RunDir

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such run directory or checkpoint")
    root = next(
        (p for p in (path, path.parent, path.parent.parent) if (p / RunDir.CONFIG).is_file()), None
    )
    if root is None:
        raise ConfigError(
            f"{path}: no {RunDir.CONFIG} here or above it; pass the run directory (or a "
            "checkpoint inside one) that `zebractl train` wrote"
        )
    record = RunDir(root).read_config()
    try:
        cfg = RunConfig.model_validate(record.config)
    except Exception as exc:  # noqa: BLE001 - a damaged record is a usage error
        raise ConfigError(f"{root / RunDir.CONFIG}: not a valid resolved config ({exc})") from None
    if cfg.parallelism.tp != 1 or cfg.parallelism.pp != 1:
        raise ConfigError(
            f"{root}: trained with tensor/pipeline parallelism (tp {cfg.parallelism.tp}, pp "
            f"{cfg.parallelism.pp}); convert supports tp = pp = 1, as training does"
        )
    run = RunDir.for_recipe(cfg, record.name, root)
    if not run.checkpoints.is_absolute() and not run.checkpoints.exists():
        run = RunDir(root)
    choice = checkpoint_choice(iteration)
    if isinstance(choice, Path):
        if not (choice / ckpt.MARKER).is_file():
            raise ConfigError(
                f"--checkpoint {choice}: not a complete checkpoint folder (no {ckpt.MARKER}); "
                f"complete ones of {root}: {[str(c.folder) for c in ckpt.complete(run.checkpoints)]}"
            )
        if choice.resolve().parent != run.checkpoints.resolve():
            raise ConfigError(
                f"--checkpoint {choice}: not a checkpoint of {root} (its checkpoints are in "
                f"{run.checkpoints})"
            )
        try:
            found = ckpt.check_intact(choice)
        except ckpt.DamagedCheckpoint as exc:
            raise ConfigError(f"--checkpoint: checkpoint {exc}") from None
        return Source(root, cfg, record.recipe, record.provenance, found)
    iteration = choice
    skipped: list[str] = []
    if iteration is not None:
        folder = ckpt.checkpoint_dir(run.checkpoints, iteration)
        if not folder.is_dir():
            have = [c.iteration for c in ckpt.complete(run.checkpoints)]
            raise ConfigError(
                f"{folder}: no checkpoint of iteration {iteration} (complete: {have})"
            )
        try:
            found = ckpt.check_intact(folder)
        except ckpt.DamagedCheckpoint as exc:
            raise ConfigError(f"--checkpoint {iteration}: checkpoint {exc}") from None
    elif path.resolve() == root.resolve():
        found = ckpt.find(run.checkpoints, skipped)
    else:
        found = ckpt.find(path, skipped)
    return Source(root, cfg, record.recipe, record.provenance, found, skipped)


def load_model(src: Source) -> Any:
    """The checkpoint's model on CPU, in the dtype its engine held it (torch kernels)."""
    from zebractl.model.model import build_model
    from zebractl.run.checkpoint import load_weights
    from zebractl.runtime import dist

    kernels = src.cfg.kernels.model_copy(update={"backend": "torch", "fp8_mlp": "off"})
    # the model as the engine held it: the megatron engine's bf16 params (fp32 mains live in the
    # optimizer state), the torch_fused engine's fp32 params
    bf16 = src.checkpoint.marker.optimizer_impl == "megatron" and src.cfg.precision == "bf16"
    dtype = torch.bfloat16 if bf16 else torch.float32
    with dist.scoped():  # megatron's loader needs a process group; none is left behind
        model = build_model(
            src.cfg.model, kernels=kernels, device="cpu", seed=src.cfg.seed, params_dtype=dtype
        )
        load_weights(src.checkpoint.folder, model)
    return model


def model_state(model: Any) -> dict[str, Tensor]:
    """A model's weights (fp32, CPU), by our (megatron) names."""
    return {
        k: v.detach().float()
        for k, v in model.state_dict().items()
        if not k.endswith("_extra_state")
    }


def load_state(src: Source) -> dict[str, Tensor]:
    """The checkpoint's model weights (fp32, CPU), by our (megatron) names."""
    return model_state(load_model(src))


def mla_rope(model: Any) -> dict[str, Any] | None:
    """MLA's rotary frequencies, their scale and the softmax scale as a built model computes them
    (``ZebraConfig.mla_rope``); None without MLA. Every MLA sublayer of a model has the same."""
    for layer in model.decoder.layers:
        attn = getattr(layer, "self_attention", None)
        if attn is not None:
            table = attn.rotary_pos_emb  # zebractl.model.attention.RotaryTable
            return {
                "inv_freq": [float(x) for x in table._inv_freq.tolist()],
                "mscale": float(table.mscale),
                "softmax_scale": float(attn.softmax_scale),
            }
    return None


def zebra_config(m: Any, rope: dict[str, Any] | None) -> dict[str, Any]:
    """The ``ZebraConfig`` values that define the model (checked by verify and import)."""
    return {"model_type": "zebra", ZEBRACTL_KEY: m.model_dump(mode="json"), "mla_rope": rope}


def export_format(cfg: RunConfig, fmt: str) -> str:
    """``fla`` or ``zebra`` for ``--format`` (``auto``: FLA's class where there is one)."""
    from zebractl.hf import mapping

    if fmt not in ("auto", *mapping.FORMATS):
        raise ConfigError(f"--format {fmt}: expected auto, fla or zebra")
    try:
        fam = mapping.family(cfg.model)
    except mapping.MappingError:
        fam = None
    if fmt == "fla" and fam is None:
        raise ConfigError(
            f"--format fla: FLA has classes for pure KDA and pure GDN models only; this model's "
            f"blocks are {sorted(set(cfg.model.blocks))} (use --format zebra or auto)"
        )
    m = cfg.model
    if (fmt == "zebra" or fam is None) and (m.norm.type != "rmsnorm" or m.linear_bias):
        raise ConfigError(
            "--format zebra: ZebraForCausalLM holds rmsnorm models without linear biases; this "
            f"model has norm.type {m.norm.type} and linear_bias {str(m.linear_bias).lower()}"
        )
    return fmt if fmt != "auto" else ("fla" if fam is not None else "zebra")


def write_safetensors(tensors: dict[str, Tensor], folder: Path, max_shard_bytes: int) -> list[str]:
    """``model.safetensors``, or shards + ``model.safetensors.index.json`` above the limit."""
    from safetensors.torch import save_file

    names = sorted(tensors)
    total = sum(tensors[n].numel() * tensors[n].element_size() for n in names)
    groups: list[list[str]] = [[]]
    size = 0
    for n in names:
        b = tensors[n].numel() * tensors[n].element_size()
        if groups[-1] and size + b > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(n)
        size += b
    meta = {"format": "pt"}
    if len(groups) == 1:
        save_file({n: tensors[n].contiguous() for n in names}, folder / "model.safetensors", meta)
        return ["model.safetensors"]
    files = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    weight_map = {}
    for file, group in zip(files, groups, strict=True):
        save_file({n: tensors[n].contiguous() for n in group}, folder / file, meta)
        weight_map |= dict.fromkeys(group, file)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return files


def dataset_dir(cfg: RunConfig) -> Path | None:
    """The first dataset folder of the run's data (None for raw prefixes)."""
    if not cfg.data.paths:
        return None
    p = Path(cfg.data.paths[0].path)
    return p if (p / "manifest.json").is_file() else None


def data_chat_template(cfg: RunConfig) -> dict | None:
    """The chat template the run's data was prepared with (its manifest's ``chat.template``:
    name, source, sha256, text), or None for data that is no chat data."""
    folder = dataset_dir(cfg)
    if folder is None:
        return None
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    chat = manifest.get("chat") if isinstance(manifest, dict) else None
    template = chat.get("template") if isinstance(chat, dict) else None
    return template if isinstance(template, dict) and template.get("text") else None


def _token_ids(tok_dir: Path) -> dict[str, int]:
    """bos/eos ids of the dataset's tokenizer (those its config names)."""
    out: dict[str, int] = {}
    try:
        conf = json.loads((tok_dir / "tokenizer_config.json").read_text())
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    except Exception:  # noqa: BLE001 - the ids are optional facts: a bad file just omits them
        return out
    for key in ("bos", "eos"):
        t = conf.get(f"{key}_token")
        t = t.get("content") if isinstance(t, dict) else t
        if isinstance(t, str) and tok.token_to_id(t) is not None:
            out[f"{key}_token_id"] = int(tok.token_to_id(t))
    return out


def _final_loss(run_root: Path, iteration: int) -> float | None:
    path = run_root / "metrics.jsonl"
    loss = None
    try:
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("kind", "train") == "train" and r.get("iteration", 0) <= iteration:
                loss = r.get("loss", loss)
    except OSError:
        return None
    return loss


def _peak_rss_gib() -> float | None:
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    except (ImportError, OSError):
        return None


def model_card(src: Source, res: ConvertReport, model_class: str, fmt: str = "fla") -> str:
    """The README.md of an export ``res`` of ``src`` (``res.files`` and timings not yet known)."""
    m = src.cfg.model
    tokens = src.checkpoint.marker.consumed_samples * src.cfg.data.seq_length
    loss = _final_loss(src.run_root, src.iteration)
    prov = "\n".join(
        f"| `{k}` | {v} |" for k, v in sorted(src.provenance.items()) if v != "default"
    )
    if fmt == "fla":
        arch = f"FLA `{model_class}`"
        register = "import fla  # registers FLA's model classes with transformers"
        note = "FLA's kernels need a CUDA GPU"
    else:
        arch = f"zebractl `{model_class}` (`zebractl.hf`; blocks {res.architecture})"
        register = (
            "import zebractl.hf  # registers ZebraConfig / ZebraForCausalLM with transformers"
        )
        note = (
            "It runs FLA's kernels on a CUDA GPU and zebractl's PyTorch references on CPU; "
            "`generate` keeps a cache (recurrent and convolution states, MLA keys and values); "
            "padded batches are not supported"
        )
    return f"""---
library_name: transformers
tags: [zebractl, flash-linear-attention, {res.architecture.replace("+", ", ")}]
---
# {src.recipe} — iteration {src.iteration}

{m.description or res.architecture}, exported by zebractl from `{src.checkpoint.folder}`.

| | |
|---|---|
| architecture | {arch} ({m.num_blocks} blocks, hidden {m.hidden_size}) |
| parameters | {res.parameters:,} |
| dtype | {res.dtype} |
| iteration | {src.iteration} |
| tokens seen | {tokens:,} |
| final training loss | {"n/a" if loss is None else f"{loss:.4f}"} |
| tokenizer | {res.tokenizer or "not exported (the run's data had none)"} |

## Load

```python
{register}
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("{Path(res.output).name}")
tokenizer = AutoTokenizer.from_pretrained("{Path(res.output).name}")
```

{note}; `zebractl verify` checks this folder against the checkpoint.

## Recipe (values not at their defaults, with where they were set)

| key | source |
|---|---|
{prov}
"""


def tokenizer_dir(cfg: RunConfig) -> Path | None:
    """The ``tokenizer/`` folder of the run's dataset (None when it has none)."""
    data = dataset_dir(cfg)
    return data / "tokenizer" if data is not None and (data / "tokenizer").is_dir() else None


def hf_config(
    m: Any, fmt: str, rope: dict[str, Any] | None, tok_dir: Path | None, dt: torch.dtype
) -> tuple[Any, str, str]:
    """The Hugging Face config of model ``m`` in format ``fmt``; with its family and class name."""
    from zebractl.hf import mapping

    ids = _token_ids(tok_dir) if tok_dir is not None else {}
    if fmt == "fla":
        import fla.models as fm

        fam = mapping.family(m)
        config_cls, model_cls = FLA_CLASSES[fam]
        config = getattr(fm, config_cls)(
            **mapping.fla_config(m, keep_padding=True),
            **ids,
            **{ZEBRACTL_KEY: m.model_dump(mode="json")},
        )
    else:
        from zebractl.hf import ZebraConfig

        fam = architecture(m)
        model_cls = "ZebraForCausalLM"
        config = ZebraConfig(**{ZEBRACTL_KEY: m.model_dump(mode="json")}, mla_rope=rope, **ids)
    config.architectures = [model_cls]
    config.dtype = HF_DTYPE_NAMES[dt]
    return config, fam, model_cls


def in_memory(src: Source, dtype: torch.dtype) -> Any:
    """The checkpoint as a ``ZebraForCausalLM`` in memory (CPU, ``dtype``, eval mode): what
    ``convert --format zebra`` would write and ``from_pretrained`` load, with no folder written."""
    from zebractl.hf import ZebraForCausalLM, mapping

    model = load_model(src)
    rope = mla_rope(model)
    theirs = mapping.to_hf(model_state(model), src.cfg.model, "zebra", keep_padding=True)
    del model
    config, _, _ = hf_config(src.cfg.model, "zebra", rope, tokenizer_dir(src.cfg), dtype)
    hf = ZebraForCausalLM(config)
    missing, unexpected = hf.load_state_dict(
        {k: v.to(dtype) for k, v in theirs.items()}, strict=False
    )
    tied = set(getattr(hf, "_tied_weights_keys", None) or ())
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:  # the tables and the class disagree: a bug, not a usage error
        raise RuntimeError(f"in-memory export: missing {missing}, unexpected {unexpected}")
    return hf.to(dtype).eval()


def export_hf(
    source: Path,
    output: Path,
    *,
    iteration: int | str | None = None,
    dtype: str = "bf16",
    fmt: str = "auto",
    max_shard_bytes: int = SHARD_BYTES,
    console: Callable[[str], None] = print,
) -> ConvertReport:
    """Write the Hugging Face folder of a checkpoint (see the module docstring); its report."""
    from zebractl.hf import mapping

    output = Path(output)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ConfigError(f"{output}: exists and is not an empty folder; choose a new output")
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype}: expected one of {', '.join(DTYPES)}")
    t0 = time.perf_counter()
    src = open_source(source, iteration)
    fmt = export_format(src.cfg, fmt)
    m = src.cfg.model
    src.announce(console, "reading")
    model = load_model(src)
    rope = mla_rope(model)
    # the vocabulary's padding rows are kept: the export computes exactly the trained softmax
    theirs = mapping.to_hf(model_state(model), m, fmt, keep_padding=True)
    del model
    dt = DTYPES[dtype]
    theirs = {k: v.to(dt).contiguous() for k, v in theirs.items()}

    tmp = output.with_name(output.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shards = write_safetensors(theirs, tmp, max_shard_bytes)

    from transformers import GenerationConfig

    tok_dir = tokenizer_dir(src.cfg)
    config, fam, model_cls = hf_config(m, fmt, rope, tok_dir, dt)
    config.save_pretrained(tmp)
    GenerationConfig.from_model_config(config).save_pretrained(tmp)
    tokenizer = None
    if tok_dir is not None:
        for f in tok_dir.iterdir():
            if f.is_file():
                shutil.copy2(f, tmp / f.name)
        tokenizer = str(tok_dir)
    template = data_chat_template(src.cfg)
    if template is not None:  # what the model was fine-tuned on, over the tokenizer's own
        (tmp / "chat_template.jinja").write_text(template["text"], encoding="utf-8")
    res = ConvertReport(
        output=str(output),
        format=fmt,
        architecture=fam,
        iteration=src.iteration,
        dtype=dtype,
        tensors=len(theirs),
        parameters=sum(v.numel() for v in theirs.values()),
        bytes=sum(v.numel() * v.element_size() for v in theirs.values()),
        shards=shards,
        tokenizer=tokenizer,
        files=[],
        seconds=0.0,
        peak_rss_gib=None,
    )
    (tmp / "README.md").write_text(model_card(src, res, model_cls, fmt))
    if output.exists():
        output.rmdir()  # empty (checked above)
    tmp.rename(output)
    return res.model_copy(
        update={
            "files": sorted(p.name for p in output.iterdir()),
            "seconds": time.perf_counter() - t0,
            "peak_rss_gib": _peak_rss_gib(),
        }
    )


# ---- import: a Hugging Face folder (ours or FLA's) -> our weights ----------------------------------


def import_hf(
    folder: Path, output: Path, *, preset: str | None = None, console: Callable[[str], None] = print
) -> ConvertReport:
    """Write an HF folder (ours or FLA's) as a zebractl checkpoint folder for ``--init-from``:
    ``OUTPUT/iter_0000000`` (:func:`write_weights`); its report."""
    t0 = time.perf_counter()
    folder, output = Path(folder), Path(output)
    if not is_hf_folder(folder):
        what = "config.json" if not (folder / "config.json").is_file() else "model.safetensors"
        raise ConfigError(
            f"{folder}: not a Hugging Face folder (no {what}; expected config.json and "
            "model.safetensors or model.safetensors.index.json)"
        )
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ConfigError(f"{output}: exists and is not an empty folder; choose a new output")
    m = hf_model_config(folder, preset)
    sd = load_hf_state(folder, m)
    console(f"writing {output} ({architecture(m)}, {len(sd)} tensors)")
    return write_weights(m, sd, output, t0)


def write_weights(m: Any, sd: dict[str, Tensor], output: Path, t0: float) -> ConvertReport:
    """Write our-named weights ``sd`` of model ``m`` as ``OUTPUT/iter_0000000`` (megatron
    torch_dist, weights only, with its marker): what every import ends with. The report's
    ``output`` is that checkpoint folder (fp32, iteration 0)."""
    from zebractl import __version__
    from zebractl.model.model import build_model
    from zebractl.run import checkpoint as ckpt
    from zebractl.run.records import CheckpointMarker
    from zebractl.runtime import dist

    marker = CheckpointMarker(iteration=0, consumed_samples=0, zebractl_version=__version__)
    with dist.scoped():  # megatron's writer needs a process group; none is left behind
        model = build_model(m, kernels=None, device="cpu")
        own = model.state_dict()
        ckpt.load_model_state(
            model, {k: v.to(own[k].dtype) if k in own else v for k, v in sd.items()}
        )
        state = {"model": model.sharded_state_dict(metadata=ckpt.sharded_metadata())}
        final = ckpt.save(output, 0, state, marker, keep_last=0, is_writer=True)
    parameters = sum(v.numel() for v in sd.values())
    return ConvertReport(
        output=str(final),
        format="megatron",
        architecture=architecture(m),
        iteration=0,
        dtype="fp32",
        tensors=len(sd),
        parameters=parameters,
        bytes=4 * parameters,
        shards=[],
        tokenizer=None,
        files=sorted(p.name for p in final.iterdir()),
        seconds=time.perf_counter() - t0,
        peak_rss_gib=None,
    )
