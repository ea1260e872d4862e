"""A real model on the kernels: Llama-3-8B's layers, random weights, its Linears on a version's GEMM, against cuBLAS.

    python model_llama.py [--version v9] [--layers 2] [--seconds 0.5]    (needs: pip install -e ".[model]")
    python model_llama.py --version v11 [--quant] [--quantizer fused | o_proj=fused] [--gated]

It builds Hugging Face transformers' Llama from a ``LlamaConfig`` with Llama-3-8B's layer
dimensions (hidden 4096, MLP 14336, 32 heads, 8 KV heads) and a few layers, random bf16
weights (nothing is downloaded), and a copy with every eligible ``nn.Linear`` swapped for
``support.torch_op.Linear`` on the version's kernels. Then, in one process:

1. the logits of both on one prompt (relative Frobenius error, and how often the two pick
   the same next token);
2. prefill (batch 1 x 2048 tokens, batch 8 x 512), eager and under ``torch.compile(fullgraph=True,
   options=fp8_torch.compile_options(cudagraphs=True))`` (reduce-overhead's CUDA graphs; fp8
   Linears that read one x quantize it once), and one decode
   step with a static KV cache holding 512 tokens (batch 1 and 16), eager and replayed from
   a CUDA graph captured by hand: reduce-overhead records no graph there, because
   transformers' StaticCache adds to a length counter of its own on every step (a mutated
   input); the cuBLAS and the swapped model take turns in a fresh random order each round,
   as the benchmark's back-to-back regime does: tokens per second, the median of the
   rounds, and the spread;
3. the share of the GPU's time spent in GEMMs, from one profiled eager pass of each.

With an fp8 version (``--version v11``: block-wise scales; ``v10``: row-wise) the copy's
Linears are ``fp8_torch.Fp8Linear``s (the LM head stays bf16), and a third model runs the same
Fp8Linears through ``torch._scaled_mm`` (the peer); the logits of each are compared with the
bf16 model's. ``--quant`` times the activation quantizer instead, at prefill shapes, alone,
back to back (replayed from CUDA graphs, as the compiled model runs it), and in the compiled
model's prefill (kernel times from torch.profiler); ``--quant --quantizer fused`` times what the
fused quantizer adds to the ops it joins there. ``--gated`` runs each MLP as an ``Fp8GatedMLP`` in
both fp8 models: gate and up one GEMM, and SiLU(gate) x up computed by the down projection's
quantizer as it quantizes it. ``--quantizer o_proj=fused`` fuses at the Linears it names and
runs the kernel elsewhere; ``--quant`` with it, or with ``--gated``, times what quantizing adds to
the compiled model as it runs, against the bf16 model's prefill.

Rows are merged into results/<gpu>_model.csv (a row per run, backend, scenario and mode) and
results/<gpu>_quant.csv; ``python plot.py`` writes docs/torch.md's tables from them.
Walkthrough: docs/torch.md.
"""

import argparse
import copy
import csv
import datetime
import importlib
import os
import random
import statistics
import sys
import time

import torch

from support import bench, cli, fp8_torch, gpu, measure, provenance, scaled, torch_op

CONFIG = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
              vocab_size=32768, max_position_embeddings=4096, rope_theta=500000.0)
PREFILL = {"prefill 1x2048": (1, 2048), "prefill 8x512": (8, 512)}
DECODE = {"decode b1": 1, "decode b16": 16}
CONTEXT, CACHE_LEN = 512, 1024  # tokens in the KV cache before the timed decode step, and its size
ROUNDS = 3
GEMM_KERNELS = ("gemm", "nvjet", "tilus", "xmma", "cutlass")  # kernel names of cuBLAS's and the versions' GEMMs
# run: the --version that measured the row, with --scaling where not the version's own (rows from before the column
# existed are v9's)
FIELDS = ["gpu", "model", "run", "backend", "scenario", "mode", "ms", "tokens_per_s", "pct_of_cublas", "pct_spread",
          "gemm_share", "logits_rel_err", "top1_agree", "graph_breaks", "torch", "transformers", "date"]
# the activation quantizer at prefill: 2048 tokens into the layers' GEMMs (M x N x K): q/o, gate/up, down
QUANT_SIZES = [(2048, 4096, 4096), (2048, 14336, 4096), (2048, 4096, 14336)]
QUANT_FIELDS = ["gpu", "version", "scaling", "granularity", "m", "n", "k", "linears", "regime", "quant_ms",
                "quant_spread_pct", "quant_spread_us", "host_us", "quant_tb_s", "pct_of_bandwidth", "copy_ms",
                "gemm_ms", "pct_of_gemm", "x8_mismatch", "scale_max_rel_diff", "torch", "date"]
QUANT_KEY = ("version", "scaling", "m", "n", "k", "regime")
GRAPH_PASSES = 4  # passes over the rotated inputs in each CUDA graph the quantizer's back-to-back regime replays
# the quantizer in the model: a layer's Fp8Linears in call order (q, k, v, o, gate, up, down), one quantizer and one
# GEMM each; the one timed at each QUANT_SIZES shape: o (its x, attention's output), gate (the second norm's), down
PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")
IN_MODEL = dict(zip(QUANT_SIZES, ("o", "gate", "down")))
IN_MODEL_LAYERS = 4
# quantizer='fused' joins the op that writes x; each such x feeds these Linears: the first norm's q, k and v,
# attention's output o, the second norm's gate and up, SiLU(gate) x up's down
FEEDS = (("q", "k", "v"), ("o",), ("gate", "up"), ("down",))
GATED = ("q", "k", "v", "o", "gate_up", "down")  # a layer's Fp8Linears in call order with --gated


def build(layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_hidden_layers=layers, **CONFIG)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    return config, model


def inputs(config, batch: int, tokens: int, seed: int) -> torch.Tensor:
    return torch.randint(0, config.vocab_size, (batch, tokens), device="cuda",
                         generator=torch.Generator(device="cuda").manual_seed(seed))


def step(model, config, scenario: str):
    """A call that runs one prefill or one decode step of ``model``, and the tokens it produces."""
    from transformers import StaticCache

    if scenario in PREFILL:
        batch, tokens = PREFILL[scenario]
        ids = inputs(config, batch, tokens, 1)
        return (lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1).logits), batch * tokens
    batch = DECODE[scenario]
    cache = StaticCache(config=config, max_cache_len=CACHE_LEN)
    with torch.no_grad():  # fill the cache with CONTEXT tokens, then time the next one at a fixed position
        model(input_ids=inputs(config, batch, CONTEXT, 2), past_key_values=cache, use_cache=True,
              cache_position=torch.arange(CONTEXT, device="cuda"), logits_to_keep=1)
    token, position = inputs(config, batch, 1, 3), torch.tensor([CONTEXT], device="cuda")

    def decode():
        for layer in cache.layers:  # StaticCache writes at its own counter: back to CONTEXT, so every step is the same
            layer.cumulative_length.fill_(CONTEXT)
        return model(input_ids=token, past_key_values=cache, use_cache=True, cache_position=position,
                     logits_to_keep=1).logits

    return decode, batch


def graphed(call):
    """``call`` captured in a CUDA graph after three warm-up calls on a side stream; returns its replay, which returns
    the captured output.

    The graph reads and writes the memory of what ``call`` holds (a decode step's StaticCache,
    its token and position), at the addresses the capture saw. Freed, that memory goes back to
    torch's caching allocator, which hands it to another tensor (a replay then reads and writes
    that tensor) or returns it to the driver (a replay of a decode graph then ended in a CUDA
    error on the H100). The replay keeps ``call`` alive, so neither happens.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = call()

    def replay():
        """Run the graph; its output tensor, rewritten by every replay."""
        graph.replay()
        return output

    replay.captured = call  # what the graph reads, alive as long as the replay
    return replay


def ms_per_call(call, seconds: float) -> float:
    """GPU ms per call over about ``seconds`` of calls queued back to back (CUDA events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    t0, calls = time.perf_counter(), 0
    start.record()
    while calls < 3 or time.perf_counter() - t0 < seconds:
        call()
        calls += 1
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def profiled(call):
    """torch.profiler's record of the GPU's kernels over one call."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return prof


def gemm_share(call) -> float:
    """The share of the GPU's kernel time spent in GEMM kernels over one call (torch.profiler)."""
    events = [e for e in profiled(call).key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.self_device_time_total for e in events)
    gemm = sum(e.self_device_time_total for e in events if is_gemm_kernel(e.key))
    return gemm / total if total else float("nan")


def is_gemm_kernel(name: str) -> bool:
    """A GEMM of cuBLAS's or a version's, by its kernel's name; not quantize.py's kernel, whose name is tilus' too."""
    return any(k in name.lower() for k in GEMM_KERNELS) and not is_quantizer(name)


def compare_logits(reference, swapped, config) -> tuple[float, float, float]:
    """The swapped model's logits against the reference's on one 2048-token prompt: relative Frobenius error, the
    share of positions where both pick the same next token, and the worst 64 x 64 tile's relative error
    (``measure.relative_error``, the repository's check)."""
    ids = inputs(config, 1, 2048, 4)
    with torch.no_grad():
        a = reference(input_ids=ids, use_cache=False).logits.float()[0]
        b = swapped(input_ids=ids, use_cache=False).logits.float()[0]
    return ((torch.linalg.norm(b - a) / torch.linalg.norm(a)).item(),
            (a.argmax(-1) == b.argmax(-1)).float().mean().item(), measure.relative_error(b, a))


def build_models(reference, version: str, scaling: str | None, quantizer: str = "kernel", gated: bool = False) -> dict:
    """name -> model: the bf16 model on cuBLAS ('cublas') and copies with their Linears swapped: on a 16-bit
    version's op; or, for an fp8 version, on its op ('v11 fp8 block') and on torch._scaled_mm ('scaled_mm fp8
    block'), the same Fp8Linears with the same quantized weights, the same ``quantizer`` and, with ``gated``,
    the same Fp8GatedMLPs."""
    models = {"cublas": reference}
    if not fp8_torch.is_fp8(version):
        backends = {version: {}}
    else:
        scaling = scaling or fp8_torch.scalings(version)[0]
        backends = {f"{version} fp8 {scaling}": dict(scaling=scaling, quantizer=quantizer, gated=gated),
                    f"scaled_mm fp8 {scaling}": dict(scaling=scaling, backend="scaled_mm", quantizer=quantizer,
                                                     gated=gated)}
    for name, options in backends.items():
        models[name] = copy.deepcopy(reference)
        names, kept = torch_op.swap_linears(models[name], version, **options)
        print(f"{name}: {len(names)} Linears swapped" + "".join(f"; kept {k}: {why}" for k, why in kept.items()),
              flush=True)
    return models


def time_quantizer(version: str, scaling: str | None, repeat: int) -> list[dict]:
    """The activation quantizer at the prefill GEMMs' shapes, in three regimes: alone (burst: L2 flushed, launches
    queued ahead), in a loop (back to back, replayed from CUDA graphs: ``loop_quantizer``) and in the compiled
    model's prefill (``quantizer_in_model``: no copy of x there). Its bytes (bf16 read, e4m3 and scales written)
    against a device-to-device copy's bandwidth, and its time against the GEMM it feeds and a copy of its input,
    timed the same way; the host µs of an eager call; and how far its output is from ``scaled.quantize``'s."""
    scaling = scaling or fp8_torch.scalings(version)[0]
    granularity = fp8_torch.ACTIVATION[scaling]
    in_model = quantizer_in_model(prefill_kernels(version, scaling, "kernel"), version)
    matmul = importlib.import_module(f"matmul_{version}").matmul
    copy_bytes_per_s = bench.copy_bandwidth()
    print(f"device-to-device copy: {copy_bytes_per_s / 1e12:.2f} TB/s (bytes read + written)", flush=True)
    rows = []
    for m, n, k in QUANT_SIZES:
        gen = torch.Generator(device="cuda").manual_seed(m + n + k)
        x = torch.randn(m, k, generator=gen, device="cuda").to(torch.bfloat16)
        b8, scale_b = scaled.quantize(torch.randn(n, k, generator=gen, device="cuda"), fp8_torch.WEIGHT[scaling])
        a8, scale_a = fp8_torch.quantize_activations(x, granularity)
        mismatch, scale_diff = unlike_reference(x, granularity, a8, scale_a)
        out, copied = torch.empty(m, n, dtype=torch.bfloat16, device="cuda"), torch.empty_like(x)
        burst = measure.time_burst({"quantize": lambda: fp8_torch.quantize_activations(x, granularity),
                                    "copy": lambda: copied.copy_(x),
                                    "gemm": lambda: matmul(a8, b8, scale_a, scale_b, out)}, repeat)
        moved = x.numel() * (2 + 1) + scale_a.numel() * 4  # bf16 read; e4m3 and float32 scales written
        looped, looped_spread, host_us = loop_quantizer(matmul, granularity, x, b8, scale_b)
        quant_us, gemm_us = in_model[m, n, k]
        in_the_model = {"quantize": statistics.median(quant_us) / 1e3, "gemm": statistics.median(gemm_us) / 1e3}
        model_spread = 100 * (max(quant_us) - min(quant_us)) / statistics.median(quant_us)
        for regime, ms, spread in [("burst", burst, None), ("back-to-back", looped, looped_spread),
                                   ("in the model", in_the_model, model_spread)]:
            rows.append({"gpu": torch.cuda.get_device_name(), "version": version, "scaling": scaling,
                         "granularity": granularity, "m": m, "n": n, "k": k, "regime": regime,
                         "quant_ms": f"{ms['quantize']:.5f}", "host_us": f"{host_us:.1f}",
                         "quant_spread_pct": "" if spread is None else f"{spread:.1f}",
                         "quant_tb_s": f"{moved / (ms['quantize'] * 1e-3) / 1e12:.3f}",
                         "pct_of_bandwidth": f"{100 * moved / (ms['quantize'] * 1e-3) / copy_bytes_per_s:.1f}",
                         "copy_ms": f"{ms['copy']:.5f}" if "copy" in ms else "", "gemm_ms": f"{ms['gemm']:.5f}",
                         "pct_of_gemm": f"{100 * ms['quantize'] / ms['gemm']:.1f}", "x8_mismatch": f"{mismatch:.2e}",
                         "scale_max_rel_diff": f"{scale_diff:.2e}", "torch": torch.__version__,
                         "date": datetime.date.today().isoformat()})
            print(f"{m}x{n}x{k} {granularity} {regime}: quantize {ms['quantize'] * 1e3:.1f} us "
                  f"({rows[-1]['pct_of_bandwidth']}% of the copy bandwidth, {rows[-1]['pct_of_gemm']}% of the "
                  f"{version} GEMM's {ms['gemm'] * 1e3:.1f} us); e4m3 values unlike scaled.quantize's: {mismatch:.2e}",
                  flush=True)
    return rows


def unlike_reference(x: torch.Tensor, granularity: str, x8: torch.Tensor, scale: torch.Tensor) -> tuple[float, float]:
    """How far a quantizer's (x8, scale) of x are from ``scaled.quantize``'s: the share of e4m3 values unlike its,
    and the largest relative difference of a scale."""
    r8, r_scale = scaled.quantize(x, granularity)
    return ((x8.view(torch.uint8) != r8.view(torch.uint8)).float().mean().item(),
            ((scale - r_scale).abs() / r_scale).max().item())


def time_fused_quantizer(version: str, scaling: str | None) -> list[dict]:
    """quantizer='fused' in the compiled model's prefill: a row for each op it joins (``added_cost`` against the
    kernel quantizer's prefill without quantize.py's kernels), against the GEMMs that op's x feeds."""
    scaling = scaling or fp8_torch.scalings(version)[0]
    kernel_run = [(name, us) for name, us in prefill_kernels(version, scaling, "kernel") if not is_quantizer(name)]
    cost = added_cost(prefill_kernels(version, scaling, "fused"), kernel_run, version, baseline_version=version)
    return cost_rows(cost, version, scaling, "fused", "in the model, fused", "fused quantizer")


def time_quantizer_as_run(version: str, scaling: str | None, quantizer, gated: bool) -> list[dict]:
    """What quantizing the activations adds to the compiled fp8 model's prefill as ``model_llama.py`` runs it
    (``quantizer`` per Linear, ``gated``, shared quantizers: ``compile_options``): for each group of GEMMs that read
    one x, the kernels launched before them less those before the same GEMMs in the bf16 model (``added_cost``).
    Against the bf16 model, a gated down projection's quantizer costs what it adds to SiLU(gate) x up."""
    scaling = scaling or fp8_torch.scalings(version)[0]
    run = prefill_kernels(version, scaling, quantizer, gated=gated, share=True)
    cost = added_cost(run, prefill_kernels(None, scaling, "kernel"), version, gated=gated)
    choices = [quantizer] if isinstance(quantizer, str) else [f"{c} at {name}" for name, c in sorted(quantizer.items())]
    regime = ", ".join(["in the model as run", *(["gated"] if gated else []), *(c for c in choices if c != "kernel")])
    return cost_rows(cost, version, scaling, quantizer, regime, "quantization")


def cost_rows(cost: dict, version: str, scaling: str, quantizer, regime: str, what: str) -> list[dict]:
    """Rows of results/<gpu>_quant.csv from ``added_cost``'s {group: (µs a layer, GEMM µs a layer)}; the e4m3 values
    of the quantizer the group's Linears took against ``scaled.quantize``'s: quantize.py's kernel, or quantize_rows
    compiled alone (the fused quantizer's arithmetic)."""
    granularity = fp8_torch.ACTIVATION[scaling]
    compiled = torch.compile(fp8_torch.quantize_rows, fullgraph=True, dynamic=False)
    rows = []
    for group, (added, gemm) in cost.items():
        shapes = [projection_shape(p) for p in group]
        m, k, n = shapes[0][0], shapes[0][2], sum(shape[1] for shape in shapes)
        x = torch.randn(m, k, generator=torch.Generator(device="cuda").manual_seed(k), device="cuda").bfloat16()
        fused = fp8_torch.quantizer_of(quantizer, f"{group[0]}_proj") == "fused"
        x8, scale = compiled(x, granularity) if fused else fp8_torch.quantize_activations(x, granularity)
        mismatch, scale_diff = unlike_reference(x, granularity, x8, scale)
        us, gemm_us = statistics.median(added), statistics.median(gemm)
        rows.append({"gpu": torch.cuda.get_device_name(), "version": version, "scaling": scaling,
                     "granularity": granularity, "m": m, "n": n, "k": k, "linears": " ".join(group),
                     "regime": regime, "quant_ms": f"{us / 1e3:.5f}",
                     "quant_spread_us": f"{max(added) - min(added):.1f}", "gemm_ms": f"{gemm_us / 1e3:.5f}",
                     "pct_of_gemm": f"{100 * us / gemm_us:.1f}",
                     "x8_mismatch": f"{mismatch:.2e}", "scale_max_rel_diff": f"{scale_diff:.2e}",
                     "torch": torch.__version__, "date": datetime.date.today().isoformat()})
        print(f"{m}x{n}x{k} ({' '.join(group)}) {what} in the model: adds {us:.1f} us (layers "
              f"{', '.join(f'{a:.1f}' for a in added)}), {rows[-1]['pct_of_gemm']}% of the GEMMs' {gemm_us:.1f} us",
              flush=True)
    layers = [sum(added[layer] for added, _ in cost.values()) for layer in range(IN_MODEL_LAYERS)]
    print(f"{what}, a whole layer: adds {', '.join(f'{a:.1f}' for a in layers)} us", flush=True)
    return rows


def prefill_kernels(version: str | None, scaling: str, quantizer, gated: bool = False,
                    share: bool = False) -> list[tuple[str, float]]:
    """The GPU's kernels (name, µs) in launch order over one prefill of 1 x 2048 tokens of the compiled fp8 Llama
    (IN_MODEL_LAYERS layers, ``quantizer``, ``gated``; the bf16 model where ``version`` is None), after three warm-up
    calls (torch.profiler). ``share``: compiled with ``compile_options``, as the model runs; without, each projection
    keeps its own quantizer, which quantizer_in_model pairs with its GEMM."""
    config, model = build(IN_MODEL_LAYERS)
    if version:
        torch_op.swap_linears(model, version, scaling=scaling, quantizer=quantizer, gated=gated)
    options = fp8_torch.compile_options() if share else None
    call, _ = step(torch.compile(model, fullgraph=True, dynamic=False, options=options), config, "prefill 1x2048")
    with torch.no_grad():
        for _ in range(3):
            call()
        prof = profiled(call)
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    return [(e.name, e.time_range.elapsed_us()) for e in kernels]


def is_gemm(name: str, version: str) -> bool:
    """A kernel of the version's GEMM, by its name."""
    return f"matmul_{version}" in name.lower()


def is_quantizer(name: str) -> bool:
    """quantize.py's kernel, by its name (tilus' own: Inductor's kernels that feed a quantizer have 'quantize' in
    their names too)."""
    return name.startswith("tilus_quantize")


def quantizer_in_model(kernels: list[tuple[str, float]], version: str) -> dict[tuple, tuple[list, list]]:
    """quantize.py's kernel and the GEMM it feeds as the compiled fp8 model's prefill runs them (``kernels``, from
    prefill_kernels), x written by the op just before (partly still in L2): {QUANT_SIZES shape: (quantizer µs, GEMM
    µs) in each of IN_MODEL_LAYERS layers} (``IN_MODEL``: which projection at which shape)."""
    quantizers = [us for name, us in kernels if is_quantizer(name)]
    gemms = [us for name, us in kernels if is_gemm(name, version)]
    return layer_pairs(quantizers, gemms, IN_MODEL_LAYERS)


def before_gemms(kernels: list[tuple[str, float]], counts_as_gemm) -> list[tuple[float, float]]:
    """Kernels (name, µs) in launch order -> for each GEMM (a name ``counts_as_gemm`` takes): (its µs, the µs of the
    kernels launched since the GEMM before it)."""
    out, other = [], 0.0
    for name, us in kernels:
        if counts_as_gemm(name):
            out.append((us, other))
            other = 0.0
        else:
            other += us
    return out


def added_cost(run: list[tuple[str, float]], baseline: list[tuple[str, float]], version: str, gated: bool = False,
               baseline_version: str | None = None,
               layers: int = IN_MODEL_LAYERS) -> dict[tuple[str, ...], tuple[list[float], list[float]]]:
    """What quantizing adds before each group of GEMMs that read one x, from two profiled prefills in launch order:
    ``run``, the fp8 model's (``gated``: GATED's Linears), and ``baseline``, whose GEMMs are ``baseline_version``'s
    (the same model otherwise) or cuBLAS's (the bf16 model's PROJECTIONS: GEMM kernels that ``run`` does not launch
    too, as it does the rotary embedding's fp32 product and the LM head's). {FEEDS group (gate and up one where
    gated): (µs a layer, GEMM µs a layer)}. Added: the kernels before the group's GEMMs in ``run``, less those before
    the same GEMMs in ``baseline``; the rest of the model cancels. GEMM: the group's GEMMs in ``run``."""
    projections = GATED if gated else PROJECTIONS
    fp8 = before_gemms(run, lambda name: is_gemm(name, version))
    in_run = {name for name, _ in run}
    base = before_gemms(baseline, (lambda name: is_gemm(name, baseline_version)) if baseline_version
                        else (lambda name: is_gemm_kernel(name) and name not in in_run))
    if len(fp8) != layers * len(projections) or len(base) != layers * len(PROJECTIONS):
        raise RuntimeError(f"the profiled prefills ran {len(fp8)} fp8 GEMMs and {len(base)} in the baseline, not "
                           f"{layers * len(projections)} and {layers * len(PROJECTIONS)} ({len(projections)} and "
                           f"{len(PROJECTIONS)} Linears in each of {layers} layers)")
    cost = {}
    for group in FEEDS:
        names = ("gate_up",) if gated and group == ("gate", "up") else group
        places = [[layer * len(projections) + projections.index(p) for p in names] for layer in range(layers)]
        base_places = [[layer * len(PROJECTIONS) + PROJECTIONS.index(p) for p in group] for layer in range(layers)]
        added = [sum(fp8[i][1] for i in at) - sum(base[i][1] for i in base_at) for at, base_at in zip(places, base_places)]
        cost[names] = added, [sum(fp8[i][0] for i in at) for at in places]
    return cost


def projection_shape(name: str, tokens: int = 2048) -> tuple[int, int, int]:
    """M x N x K of a projection's GEMM at prefill."""
    hidden, mlp = CONFIG["hidden_size"], CONFIG["intermediate_size"]
    kv = hidden * CONFIG["num_key_value_heads"] // CONFIG["num_attention_heads"]
    n = {"q": hidden, "k": kv, "v": kv, "o": hidden, "gate": mlp, "up": mlp, "gate_up": 2 * mlp, "down": hidden}[name]
    return tokens, n, mlp if name == "down" else hidden


def layer_pairs(quantizers: list[float], gemms: list[float], layers: int) -> dict[tuple, tuple[list, list]]:
    """Kernel times in launch order, a layer's PROJECTIONS after another's -> {QUANT_SIZES shape: (its projection's
    quantizer times, its GEMM times), a time a layer}."""
    expected = layers * len(PROJECTIONS)
    if len(quantizers) != expected or len(gemms) != expected:
        raise RuntimeError(f"the profiled prefill ran {len(quantizers)} quantizers and {len(gemms)} fp8 GEMMs, not "
                           f"{expected} of each ({len(PROJECTIONS)} Linears in each of {layers} layers)")
    at = {size: PROJECTIONS.index(name) for size, name in IN_MODEL.items()}
    return {size: (quantizers[i::len(PROJECTIONS)], gemms[i::len(PROJECTIONS)]) for size, i in at.items()}


def loop_quantizer(matmul, granularity: str, x: torch.Tensor, b8: torch.Tensor,
                   scale_b: torch.Tensor) -> tuple[dict[str, float], float, float]:
    """Back to back as a compiled model runs them: the quantizer, a copy of x and the GEMM, each captured in a CUDA
    graph of calls over inputs (and weights) rotated past L2, each call writing outputs of its own, the graphs
    replayed in bench's windows, in a fresh random order each round. Median ms per call of each, the quantizer's
    spread (% of its median, max - min over the rounds), and the host µs an eager call of the quantizer's entry
    point costs (bench.host_us)."""
    # enough sets that a pass of the quantizer alone reads L2_ROTATION_BYTES of x; the GEMM's sets (x's e4m3 copy
    # and the weights, each set its own) are larger still
    xs = [x.clone().normal_() for _ in range(max(2, -(-bench.L2_ROTATION_BYTES // (2 * x.numel()))))]
    sets = [((a, *fp8_torch.quantize_activations(a, granularity)), (b8.clone(), scale_b.clone())) for a in xs]
    steps = {"quantize": lambda a, b, _out: fp8_torch.quantize_activations(a[0], granularity),
             "copy": lambda a, b, _out: a[0].clone(),
             "gemm": lambda a, b, _out: matmul(a[1], b[0], a[2], b[1])}
    calls = len(sets) * GRAPH_PASSES
    # a graph of every call's outputs kept (graphed keeps them alive): each call gets its own, so outputs rotate
    # past L2 as inputs do
    replays = {name: graphed(lambda step=step: [step(a, b, None) for a, b in sets * GRAPH_PASSES])
               for name, step in steps.items()}
    contenders = [bench.Contender(name, lambda _a, _b, _out, replay=replay: replay())
                  for name, replay in replays.items()]
    rounds = bench.time_back_to_back(contenders, [(None, None)], {c.name: bench.Telemetry(None) for c in contenders})
    ms = {name: bench.median_ms(r) / calls for name, r in rounds.items()}
    times = [window for (window,) in rounds["quantize"]]
    host = bench.host_us([bench.Contender("quantize", steps["quantize"])], sets, {"quantize": ms["quantize"]})
    return ms, 100 * (max(times) - min(times)) / statistics.median(times), host["quantize"]


def save(rows: list[dict], path, fields=FIELDS, key_fields=("run", "backend", "scenario", "mode")) -> None:
    """Merge the rows into the CSV at ``path``, replacing earlier rows with the same ``key_fields``."""
    key = lambda row: tuple(str(row[field]) for field in key_fields)  # noqa: E731
    new = {key(row) for row in rows}
    kept = []
    if os.path.exists(path):
        with open(path) as f:
            # rows from before a column existed: the model's are v9's, the quantizer's were timed in a burst
            kept = [({"run": "v9"} if fields is FIELDS else {"regime": "burst"}) | row for row in csv.DictReader(f)]
        kept = [row for row in kept if key(row) not in new]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(kept + rows)
    print(f"wrote {path}", flush=True)


def run_name(args) -> str:
    """The run column: the version, the scaling where it is not the version's own ('v11-row'), the quantizer where
    not the kernel ('v11-fused', 'v11-o_proj=fused'), and 'gated' where the MLPs are Fp8GatedMLPs ('v11-gated')."""
    name = args.version
    if fp8_torch.is_fp8(args.version) and args.scaling and args.scaling != fp8_torch.scalings(args.version)[0]:
        name += f"-{args.scaling}"
    quantizer = args.quantizer if isinstance(args.quantizer, str) else ",".join(
        f"{linear}={choice}" for linear, choice in args.quantizer.items())
    return name + ("" if quantizer == "kernel" else f"-{quantizer}") + ("-gated" if getattr(args, "gated", False) else "")


def quantizer_choice(text: str) -> str | dict[str, str]:
    """--quantizer: one of fp8_torch.QUANTIZERS for every Linear, or 'NAME=QUANTIZER[,NAME=QUANTIZER]' for some
    (the rest take the kernel)."""
    if "=" not in text:
        if text not in fp8_torch.QUANTIZERS:
            raise argparse.ArgumentTypeError(f"{text!r}: one of {', '.join(fp8_torch.QUANTIZERS)}, or NAME=QUANTIZER")
        return text
    choices = dict(item.partition("=")[::2] for item in text.split(","))
    if bad := [f"{name}={choice}" for name, choice in choices.items() if not name or choice not in fp8_torch.QUANTIZERS]:
        raise argparse.ArgumentTypeError(f"{', '.join(bad)}: each entry is a Linear's attribute name, '=', and one of "
                                         f"{', '.join(fp8_torch.QUANTIZERS)} (e.g. o_proj=fused)")
    return choices


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default="v9", help="the version whose kernels the Linears use (default v9; "
                        "v10, v11: fp8)")
    parser.add_argument("--scaling", choices=sorted(fp8_torch.ACTIVATION),
                        help="fp8: row-wise or block-wise scales (default: v10 row, v11 block)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (Llama-3-8B has 32; default 2)")
    parser.add_argument("--seconds", type=float, default=0.5, help="length of each timed window")
    parser.add_argument("--scenarios", nargs="+", default=[*PREFILL, *DECODE], choices=[*PREFILL, *DECODE])
    parser.add_argument("--modes", nargs="+", default=["eager", "compiled", "CUDA graph"],
                        choices=["eager", "compiled", "CUDA graph"],
                        help="compiled applies to prefill, CUDA graph to decode (default: all)")
    parser.add_argument("--quantizer", type=quantizer_choice, default="kernel",
                        help="fp8: how compiled graphs quantize the activations: quantize.py's kernel (default), or "
                        "'fused', the same arithmetic in torch, which Inductor fuses into the op that writes them; "
                        "or per Linear, e.g. o_proj=fused (the rest: the kernel)")
    parser.add_argument("--quant", action="store_true",
                        help="fp8: time the activation quantizer at prefill shapes instead (results/<gpu>_quant.csv); "
                        "with --quantizer fused, what it adds to the ops it joins in the compiled model; with a "
                        "quantizer per Linear or --gated, what quantizing adds to the model as it runs, against bf16")
    parser.add_argument("--gated", action="store_true",
                        help="fp8: each MLP as an Fp8GatedMLP (gate and up one GEMM, SiLU x up computed as it is "
                        "quantized), in both fp8 models")
    parser.add_argument("--repeat", type=int, default=100, help="--quant: timed launches of each")
    parser.add_argument("--out", help="CSV to write (default results/<gpu>_model.csv, or _quant.csv)")
    args = parser.parse_args(argv)
    if args.quantizer != "kernel" and not fp8_torch.is_fp8(args.version):
        parser.error("--quantizer chooses how an fp8 model's compiled graphs quantize; a 16-bit --version quantizes "
                     "nothing")
    if args.gated and not fp8_torch.is_fp8(args.version):
        parser.error("--gated runs an fp8 model's MLPs as Fp8GatedMLPs: pass an fp8 --version")
    try:
        gpu.gpu_arch()
    except gpu.UnsupportedGPUError as reason:
        print(f"No Hopper or Blackwell GPU here ({reason}): the model needs one.")
        return 1
    if args.quant:
        if not fp8_torch.is_fp8(args.version):
            parser.error(f"--quant times the fp8 activation quantizer: pass an fp8 --version, not {args.version}")
        path = args.out or cli.RESULTS_DIR / f"{gpu.gpu_label()}_quant.csv"
        if not isinstance(args.quantizer, str) or args.gated:
            rows = time_quantizer_as_run(args.version, args.scaling, args.quantizer, args.gated)
        elif args.quantizer == "kernel":
            rows = time_quantizer(args.version, args.scaling, args.repeat)
        else:
            rows = time_fused_quantizer(args.version, args.scaling)
        save(rows, path, QUANT_FIELDS, QUANT_KEY)
        provenance.record_measured(args.version, path)
        return 0
    import transformers

    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False  # cuBLAS accumulates in fp32 too
    config, reference = build(args.layers)
    print(f"Llama, {args.layers} layers of Llama-3-8B's dimensions, random bf16 weights", flush=True)
    models = build_models(reference, args.version, args.scaling, args.quantizer, args.gated)
    errors = {}
    for name, model in models.items():
        if name != "cublas":
            errors[name] = compare_logits(reference, model, config)
            print(f"{name}: logits against the cuBLAS model: relative Frobenius error {errors[name][0]:.2e}, worst "
                  f"64 x 64 tile {errors[name][2]:.2e}, same next token at {100 * errors[name][1]:.1f}% of positions",
                  flush=True)
    common = {"gpu": torch.cuda.get_device_name(), "model": f"Llama-3-8B layers x {args.layers}", "run": run_name(args),
              "torch": torch.__version__, "transformers": transformers.__version__,
              "date": datetime.date.today().isoformat()}
    rows = []
    rng = random.Random(0)
    path = args.out or cli.RESULTS_DIR / f"{gpu.gpu_label()}_model.csv"
    torch._dynamo.config.recompile_limit = 64  # each model at each scenario's shapes is a graph of its own
    for mode in ("eager", "compiled", "CUDA graph"):
        # reduce-overhead's CUDA graphs, and fp8 Linears that read one x quantize it once (a no-op for a 16-bit model)
        compiled = {name: torch.compile(model, fullgraph=True, dynamic=False,
                                        options=fp8_torch.compile_options(cudagraphs=True))
                    for name, model in models.items()} if mode == "compiled" else {}
        for scenario in args.scenarios:
            if mode not in args.modes or mode == ("CUDA graph" if scenario in PREFILL else "compiled"):
                continue
            calls, breaks = {}, 0
            for name, model in models.items():
                torch._dynamo.utils.counters.clear()
                call, tokens = step(compiled.get(name, model), config, scenario)
                with torch.no_grad():
                    if mode == "CUDA graph":
                        call = graphed(call)
                    for _ in range(3):  # compiles, warms up and records the CUDA graph
                        call()
                breaks += sum(torch._dynamo.utils.counters["graph_break"].values())
                calls[name] = call
            samples = {name: [] for name in calls}
            order = list(calls)
            with torch.no_grad():
                for _ in range(ROUNDS):
                    rng.shuffle(order)
                    for name in order:
                        samples[name].append(ms_per_call(calls[name], args.seconds))
            for name in calls:
                ms = statistics.median(samples[name])
                ratios = [100 * c / m for c, m in zip(samples["cublas"], samples[name])]
                share = ""
                if mode == "eager":
                    with torch.no_grad():
                        share = f"{gemm_share(calls[name]):.3f}"
                error, agree, _ = errors.get(name, (None, None, None))
                rows.append(common | {
                    "backend": name, "scenario": scenario, "mode": mode, "ms": f"{ms:.4f}",
                    "tokens_per_s": f"{tokens / (ms * 1e-3):.1f}", "pct_of_cublas": f"{100 * statistics.median(samples['cublas']) / ms:.1f}",
                    "pct_spread": f"{max(ratios) - min(ratios):.1f}", "gemm_share": share,
                    "logits_rel_err": "" if error is None else f"{error:.2e}",
                    "top1_agree": "" if agree is None else f"{agree:.4f}", "graph_breaks": str(breaks)})
                print(f"{scenario:15s} {mode:10s} {name:20s} {ms:8.3f} ms  {tokens / (ms * 1e-3):10.1f} tokens/s  "
                      f"{rows[-1]['pct_of_cublas']}% of cuBLAS  GEMM share {share or '-'}", flush=True)
            del calls
            save(rows, path)  # after every scenario, so a run cut short keeps what it measured
    # the programs these rows were measured with (support/provenance.py)
    provenance.record_measured(args.version, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
