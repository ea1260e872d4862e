"""A real model on the kernels: Llama-3-8B's layers, random weights, its Linears on a version's GEMM, against cuBLAS.

    python model_llama.py [--version v9] [--layers 2] [--seconds 0.5]    (needs: pip install -e ".[model]")

It builds Hugging Face transformers' Llama from a ``LlamaConfig`` with Llama-3-8B's layer
dimensions (hidden 4096, MLP 14336, 32 heads, 8 KV heads) and a few layers, random bf16
weights (nothing is downloaded), and a copy with every eligible ``nn.Linear`` swapped for
``support.torch_op.Linear`` on the version's kernels. Then, in one process:

1. the logits of both on one prompt (relative Frobenius error, and how often the two pick
   the same next token);
2. prefill (batch 1 x 2048 tokens, batch 8 x 512), eager and under
   ``torch.compile(fullgraph=True, mode="reduce-overhead")`` (CUDA graphs), and one decode
   step with a static KV cache holding 512 tokens (batch 1 and 16), eager and replayed from
   a CUDA graph captured by hand: reduce-overhead records no graph there, because
   transformers' StaticCache adds to a length counter of its own on every step (a mutated
   input); the cuBLAS and the swapped model take turns in a fresh random order each round,
   as the benchmark's back-to-back regime does: tokens per second, the median of the
   rounds, and the spread;
3. the share of the GPU's time spent in GEMMs, from one profiled eager pass of each.

Rows are merged into results/<gpu>_model.csv (a row per backend, scenario and mode);
``python plot.py`` writes the table of docs/torch.md from them. Walkthrough: docs/torch.md.
"""

import argparse
import copy
import csv
import datetime
import os
import random
import statistics
import sys
import time

import torch

from support import cli, gpu, torch_op

CONFIG = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
              vocab_size=32768, max_position_embeddings=4096, rope_theta=500000.0)
PREFILL = {"prefill 1x2048": (1, 2048), "prefill 8x512": (8, 512)}
DECODE = {"decode b1": 1, "decode b16": 16}
CONTEXT, CACHE_LEN = 512, 1024  # tokens in the KV cache before the timed decode step, and its size
ROUNDS = 3
GEMM_KERNELS = ("gemm", "nvjet", "tilus", "xmma", "cutlass")  # kernel names of cuBLAS's and the versions' GEMMs
FIELDS = ["gpu", "model", "backend", "scenario", "mode", "ms", "tokens_per_s", "pct_of_cublas", "pct_spread",
          "gemm_share", "logits_rel_err", "top1_agree", "graph_breaks", "torch", "transformers", "date"]


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


def gemm_share(call) -> float:
    """The share of the GPU's kernel time spent in GEMM kernels over one call (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.self_device_time_total for e in events)
    gemm = sum(e.self_device_time_total for e in events if any(k in e.key.lower() for k in GEMM_KERNELS))
    return gemm / total if total else float("nan")


def compare_logits(reference, swapped, config) -> tuple[float, float]:
    ids = inputs(config, 1, 2048, 4)
    with torch.no_grad():
        a, b = reference(input_ids=ids, use_cache=False).logits.float(), swapped(input_ids=ids, use_cache=False).logits.float()
    return (torch.linalg.norm(b - a) / torch.linalg.norm(a)).item(), (a.argmax(-1) == b.argmax(-1)).float().mean().item()


def save(rows: list[dict], path) -> None:
    """Merge the rows into the CSV at ``path``, replacing earlier rows of the same backend, scenario and mode."""
    key = lambda row: (row["backend"], row["scenario"], row["mode"])  # noqa: E731
    new = {key(row) for row in rows}
    kept = []
    if os.path.exists(path):
        with open(path) as f:
            kept = [row for row in csv.DictReader(f) if key(row) not in new]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(kept + rows)
    print(f"wrote {path}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default="v9", help="the version whose kernels the Linears use (default v9)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (Llama-3-8B has 32; default 2)")
    parser.add_argument("--seconds", type=float, default=0.5, help="length of each timed window")
    parser.add_argument("--scenarios", nargs="+", default=[*PREFILL, *DECODE], choices=[*PREFILL, *DECODE])
    parser.add_argument("--modes", nargs="+", default=["eager", "compiled", "CUDA graph"],
                        choices=["eager", "compiled", "CUDA graph"],
                        help="compiled applies to prefill, CUDA graph to decode (default: all)")
    parser.add_argument("--out", help="CSV to write (default results/<gpu>_model.csv)")
    args = parser.parse_args(argv)
    try:
        gpu.gpu_arch()
    except gpu.UnsupportedGPUError as reason:
        print(f"No Hopper or Blackwell GPU here ({reason}): the model needs one.")
        return 1
    import transformers

    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False  # cuBLAS accumulates in fp32 too
    config, reference = build(args.layers)
    swapped = copy.deepcopy(reference)
    names, kept = torch_op.swap_linears(swapped, args.version)
    print(f"Llama, {args.layers} layers of Llama-3-8B's dimensions: {len(names)} Linears on {args.version}"
          + "".join(f"; kept {name}: {why}" for name, why in kept.items()), flush=True)
    models = {"cublas": reference, args.version: swapped}
    error, agree = compare_logits(reference, swapped, config)
    print(f"logits against the cuBLAS model: relative error {error:.2e}, same next token at {100 * agree:.1f}% "
          "of positions", flush=True)
    common = {"gpu": torch.cuda.get_device_name(), "model": f"Llama-3-8B layers x {args.layers}",
              "torch": torch.__version__, "transformers": transformers.__version__,
              "date": datetime.date.today().isoformat()}
    rows = []
    rng = random.Random(0)
    path = args.out or cli.RESULTS_DIR / f"{gpu.gpu_label()}_model.csv"
    torch._dynamo.config.recompile_limit = 64  # each model at each scenario's shapes is a graph of its own
    for mode in ("eager", "compiled", "CUDA graph"):
        compiled = {name: torch.compile(model, fullgraph=True, mode="reduce-overhead", dynamic=False)
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
                rows.append(common | {
                    "backend": name, "scenario": scenario, "mode": mode, "ms": f"{ms:.4f}",
                    "tokens_per_s": f"{tokens / (ms * 1e-3):.1f}", "pct_of_cublas": f"{100 * statistics.median(samples['cublas']) / ms:.1f}",
                    "pct_spread": f"{max(ratios) - min(ratios):.1f}", "gemm_share": share,
                    "logits_rel_err": f"{error:.2e}", "top1_agree": f"{agree:.4f}", "graph_breaks": str(breaks)})
                print(f"{scenario:15s} {mode:8s} {name:7s} {ms:8.3f} ms  {tokens / (ms * 1e-3):10.1f} tokens/s  "
                      f"{rows[-1]['pct_of_cublas']}% of cuBLAS  GEMM share {share or '-'}", flush=True)
            del calls
            save(rows, path)  # after every scenario, so a run cut short keeps what it measured
    return 0


if __name__ == "__main__":
    sys.exit(main())
