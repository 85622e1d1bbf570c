"""The ``kernels`` section of a recipe: the kernel backend, every fusion toggle and the start-up
levers, as explicit keys (split from :mod:`zebractl.schemas.recipe`, which re-exports it)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from zebractl.schemas.base import StrictModel


class KernelsConfig(StrictModel):
    """Kernel backend and every FLA fusion toggle, as explicit booleans."""

    backend: Literal["auto", "fla", "torch"] = "auto"
    """auto: FLA Triton kernels on CUDA, pure PyTorch elsewhere; fla/torch force one."""
    fused_rmsnorm: bool = True
    """FLA fused RMSNorm (with residual add) for pre-norms and the final norm."""
    rmsnorm_backward: Literal["fla", "tiled"] = "tiled"
    """Backward kernel of the fused RMSNorm: fla = FLA 0.6.0's, which for rows wider than 512
    gives each program one row at a time (19.7 ms of a 301 ms kda_300M step at micro-batch 32 on
    an H100, three times its forward); tiled = zebractl's (a tile of rows per program, FLA's
    arithmetic with one rounding per output, GPU-tested against fp64). tiled with swiglu_kernel
    packed: 1.06x the step of FLA's two kernels on an H100 (benchmarks/README.md, 2026-12-06)."""
    rmsnorm_forward: Literal["fla", "tiled"] = "fla"
    """Forward kernel of the fused RMSNorm with ``rmsnorm_backward: tiled``: fla = FLA 0.6.0's
    (one program per row for rows wider than 512: 6.5 ms of kda_300M's step at micro-batch 32 on an
    H100, where its memory traffic takes 4.0 ms; benchmarks/README.md, 2026-12-06, 45a9fe8);
    tiled = zebractl's (a tile of rows per program, FLA's arithmetic, one rounding per output; on
    an H100, 8 and 18 of 4.2 million bf16 outputs differ from FLA's by one rounding). ``rmsnorm_backward: fla`` runs FLA's function whole: tiled
    is refused with it. Opt-in: side by side on an H100 at micro-batch 32 (2026-12-07, e3be359) it
    measured 0.995x the step of kda_300M and 1.001x gdn_300M's (with qkv_conv per_tensor: 0.994x and
    1.009x), none beyond the run's spread on both (benchmarks/README.md)."""
    fused_gated_norm: bool = True
    """FLA FusedRMSNormGated for the KDA/GDN gated output norm."""
    fused_swiglu: bool = True
    """A Triton SwiGLU in the MLP (which one: swiglu_kernel)."""
    swiglu_kernel: Literal["fla", "packed"] = "packed"
    """The fused SwiGLU's kernel: fla = FLA's on the gate and up halves of the MLP's first
    projection (its backward returns two gradients, which autograd then concatenates: one more
    pass over the [tokens x 2 ffn] gradient); packed = zebractl's on the packed [gate | up]
    projection (FLA's arithmetic, bitwise equal to it on the GPU; the gradient written in one
    piece)."""
    fused_short_conv: bool = True
    """FLA Triton causal_conv1d for the short convolutions."""
    qkv_conv: Literal["fused", "per_tensor"] = "fused"
    """KDA's and GDN's short convolution over the q | k | v columns of in_proj: fused = one kernel
    over the three, its output split into q, k and v views whose rows are three blocks wide (FLA's
    recurrent kernels copy each to a contiguous tensor, and autograd concatenates their gradients
    for the convolution's backward); per_tensor = one kernel per tensor, each reading its columns
    in place and writing a contiguous output from in_proj split once (no copies, one
    concatenation of in_proj's gradient instead of two; three launches each way). Each channel's
    convolution is the same either way. Other mixers: no effect. Opt-in: side by side on an H100
    at micro-batch 32 (2026-12-07, e3be359) per_tensor measured 0.994x the step of kda_300M and
    1.003x gdn_300M's, within the run's spread (benchmarks/README.md)."""
    fused_linear_cross_entropy: bool = True
    """Chunked LM head + loss that never materialises the [tokens x vocab] logits: bf16
    tensor-core products with the weight gradient accumulated in fp32 (zebractl's; FLA's Triton
    cross-entropy kernels on the fla backend). false: full logits in fp32 (memory-hungry)."""
    cross_entropy: Literal["fla", "one_pass"] = "fla"
    """The fused LM-head loss's softmax kernel on the fla backend: fla = FLA's two kernels (a
    forward reading each chunk of logits for the log-sum-exp, a backward reading them again and
    writing the gradient over them: 18.5 ms of kda_300M's 288 ms step at micro-batch 32 on an H100,
    benchmarks/README.md, 2026-12-06); one_pass = zebractl's, one kernel per chunk whose programs
    each sweep a row twice, the second meant to find it in the L2 cache (fp32 arithmetic, the
    log-sum-exp never rounded as one number, the gradient rounded once; 1.047x FLA's pair on one
    chunk on an H100, the second sweep mostly missing L2). In kda_300M's training step at
    micro-batch 32 it measured 0.997x the default (H100, 2026-12-06, edcc58e): opt-in. The torch
    backend: no effect."""
    fused_ce_chunks: int = Field(32, gt=0, le=4096)
    """Token chunks of the fused LM-head loss (more chunks: less memory, more GEMM launches)."""
    kda_gate_in_kernel: bool = True
    """Compute the KDA decay gate inside chunk_kda (recomputed in backward)."""
    gdn_gate_in_kernel: bool = True
    """Compute the GDN decay gate inside chunk_gated_delta_rule."""
    qk_l2norm_in_kernel: bool = True
    """L2-normalise q and k inside the delta-rule kernels."""
    fp8_mlp: Literal["off", "tensorwise", "rowwise"] = "off"
    """Opt-in FP8 GEMMs for the SwiGLU MLPs (torchao float8 training, dynamic scaling, the MLP
    compiled with torch.compile): tensorwise = one scale per tensor (fastest), rowwise = one per row
    (more accurate). Either engine, bf16, CUDA compute capability 8.9+ (Ada/Hopper) only. On
    zebra_mamba_1B_hybrid_1gpu at micro-batch 16 (H100, 2026-12-07, 2a7bc9e): tensorwise 1.105x
    bf16's tokens/s (MFU 52.7% vs 47.6%, 8.6 GiB less), rowwise 0.94x; over 200 iterations the
    loss ran 1.15% (tensorwise) and 0.98% (rowwise) below bf16's, two bf16 runs 0.55% apart
    (benchmarks/README.md): off by default."""
    ssd_precision: Literal["fp32", "mixed"] = "mixed"
    """Mamba2's SSD scan on FLA's chunked simple-GLA kernels: mixed = the operands in the compute
    dtype, FLA's forward as it is and its backward with the states' gradients in fp32 and one bf16
    copy of them for the q/k gradients (zebractl.model.ops.mixed_ssd, GPU-tested against fp64);
    fp32 = the operands cast to fp32 (FLA's chunk_simple_gla with fp32 backward states; every operand
    and gradient passes through a cast). Other mixers, the torch backend and fp32 runs: no effect.
    With compile auto, zebra_mamba_300M_hybrid trained 1.38x faster than with fp32 and none (H100,
    micro-batch 16, 200 iterations; the loss curves within the parity tolerance: last-half mean
    |Δ%| 0.32; benchmarks/README.md, 2026-12-06)."""
    compile: Literal["auto", "none", "glue"] = "auto"
    """glue: torch.compile (Inductor, fixed shapes, whole graph) of the pure-PyTorch code between the
    kernels, each region fused into a few generated kernels: in the Mamba2 mixer, the decay and
    input-gate preparation (softplus, group expansion, dt scaling) and the skip, gate and grouped
    RMSNorm after the scan. Compiled on the first step (counted in the cold start); training only
    (evaluation and generation run eagerly); a process that reaches Dynamo's recompile limit (many
    shapes) runs the further shapes eagerly. auto: glue with FLA's kernels (CUDA), none elsewhere
    (the CPU's pure-PyTorch path is not worth a compile). none: eager PyTorch."""
    cuda_graph: bool = False
    """Capture one micro-batch's forward and backward as a CUDA graph after two eager micro-steps
    and replay it (the optimizer step stays eager): removes the host's launch overhead, a sixth of
    a 300M step at micro-batch 16 on an H200. The autocast weight-cast cache is off in the graph;
    gradients become static buffers. A failed capture warns and trains on eagerly. CUDA, the
    torch_fused engine and one GPU only (refused otherwise)."""
    precompile: bool = True
    """Compile the recurrent mixers' and the loss's GPU kernels in a background thread while the
    run reads its data and builds its model (one forward + backward on throwaway weights, the
    run's random state untouched): a shorter first step on a cold kernel cache. Only on CUDA with
    FLA kernels; false: the first step compiles them."""
    precompile_tilelang: Literal["thread", "process"] = "thread"
    """With precompile on, where KDA's TileLang backward kernel (FLA's, tens of seconds of nvcc on
    a cold cache) is compiled: thread (beside the Triton kernels, once setup has imported FLA) or
    process (a Python process of its own started at launch, before the run imports torch,
    megatron-core and FLA: its imports and nvcc overlap the run's; TileLang's disk cache hands the
    kernel over). Nothing changes on a warm cache or in what is trained. process measured no
    better than thread on an H200 (426c5e6) nor with precompile_processes on an H100 (e87a0dd;
    benchmarks/README.md, cold start)."""
    precompile_processes: int = Field(0, ge=0, le=64)
    """With precompile on: N > 0 = N Python processes started at launch compile the step's Triton
    kernels (each every N-th kernel call of the background step, without launching;
    zebractl.train.compile_procs) while the run imports and sets up; the background compilation
    waits for them, then finds the kernels in the kernel cache. Each holds a CUDA context and the
    step's activations on the run's GPU until it exits, before the first step. Under torchrun N
    is the node's: each of its ranks starts its share (at least one). 0 = the run's background
    thread compiles them. Best with ``precompile_tilelang: process`` (TileLang's kernel is not
    theirs). Opt-in: on an H100 (2026-12-06, e87a0dd) 4 processes started at launch were done
    83.1 and 76.5 s after it, later than one thread started at setup (77.2 and 68.6 s in the runs
    beside them; each process imported torch, megatron-core and FLA first, beside the run's own
    imports; megatron-core no longer since), kda_300M's cold start 91.1 s against 79.2 s with
    FLA imported whole, 85.1 s against 70.9 s with the lean import."""
    precompile_tilelang_overlap: bool = False
    """With precompile on and KDA's TileLang backward built beside it (either place above): true =
    the background step runs KDA's backward at once, with stand-ins for that kernel's outputs
    (zebractl.train.tilelang_build.stand_in), so the backward's Triton kernels compile while nvcc
    builds the TileLang one; false = it waits for the TileLang kernel, then compiles them. The
    background step's outputs are thrown away either way: nothing trained changes. Opt-in: on an
    H200 (2026-12-06, 426c5e6) kda_300M's background compilation took 35.9 and 37.5 s with it
    against 30.0-31.9 s without (both compile on threads of one process: the Triton front end and
    TileLang's lowering contend for the interpreter), its cold start 51.0 and 58.1 s against 47.3
    and 50.1 s."""
    lazy_framework_compile: bool = False
    """megatron-core and FLA wrap functions in torch.compile as they are imported (megatron's
    jit_fuser, FLA's @torch.compile), which imports TorchDynamo and TorchInductor at each run's
    start-up, for functions zebractl mostly never calls. true: the training run imports them
    with those wrappers made on each function's first call instead (the same compiled function,
    made later; zebractl.runtime.lazy_compile; 4.1 s instead of 5.2 s for both imports on a 2-core
    CPU). false: made at import, as the libraries do. Opt-in: on an H200 (2026-12-06, 426c5e6) it
    cut the imports before setup by ~1 s (megatron-core 5.0/3.3 s against 8.2/7.2 s, FLA 10.7/6.9
    against 8.1/5.4 s) and setup's first line came ~3 s sooner, but TorchInductor's import and
    compiles then fell into the background compilation, which took ~5 s longer: no shorter cold
    start (57.1 s against 54.6 s, both with the overlap above)."""
    lean_fla_import: bool = True
    """true: a run on FLA's kernels (and its compile processes and TileLang build) imports the
    FLA modules its step uses without running the package files of ``fla``, ``fla.ops`` and
    ``fla.modules``, which import every FLA layer, model and operator and transformers
    (zebractl.runtime.fla_import; 2.2-2.6 s instead of 4.7-5.0 s on a 2-core CPU, 91 of FLA's
    modules instead of 476). A package is made whole the first time code asks it for a name it
    lacks. The kernels are the same. false: FLA imported as a whole. On an H100 (2026-12-06,
    e87a0dd) FLA's import before setup took 1.96 s against 12.65 s, kda_300M's setup began 5.5 and
    8.6 s sooner and its cold start was 70.9 and 79.8 s against 79.2 and 86.1 s
    (benchmarks/README.md); the GPU tests and the parity smoke passed with it."""
    shipped_compiled: bool = True
    """true: before the first kernel compiles, copy into the kernel cache the compiled kernels that
    ship with zebractl for this GPU architecture and these packages (``zebractl/runtime/
    kernel_configs/sm<NN>_torch-<v>_triton-<v>_fla-<v>.compiled.tar.xz``: Triton's binaries and
    launchers and TileLang's libraries of the shipped recipes' kernels), so a fresh machine loads
    them instead of compiling them. Triton and TileLang key every entry by their own version and
    installation, the GPU target, the kernel's source and its options, so an entry that does not
    fit this machine is never used: that kernel compiles as before. false: every kernel compiles
    on this machine (the tuned configurations are seeded either way)."""
    precompile_workers: int = Field(0, ge=0, le=256)
    """With precompile on: 0 = the background step launches its kernels, each compiling on its
    first launch, one after the other; N = it compiles them without launching, N Triton compiles
    at once in threads
    (zebractl.train.compile_only; autotuned kernels without a tuned configuration are left to the
    first step). Opt-in: on an H100 (2026-12-06, edcc58e) 16 workers did not shorten kda_300M's
    background compilation (26.8 s against 26.2 s; KDA's TileLang kernel, which it leaves alone,
    took 21 s to compile on that machine) and the first step then compiled what they had left out
    (cold start 44.4 s against 41.6 s). Falls back to 0 where the installed Triton lacks what it relies on (Triton
    3.6's internals)."""

    @model_validator(mode="after")
    def _forward_with_its_backward(self) -> KernelsConfig:
        if self.rmsnorm_forward == "tiled" and self.rmsnorm_backward != "tiled":
            raise ValueError(
                "rmsnorm_forward: tiled needs rmsnorm_backward: tiled (with fla, FLA's RMSNorm "
                "runs whole)"
            )
        return self
