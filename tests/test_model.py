"""model_llama.py on a GPU (marked `gpu`): graphs captured by hand beside torch.compile's, in one process.

A CUDA graph replays its kernels on the addresses its capture saw. A decode step's graph
reads and writes the StaticCache, the token and the position that the step's closure owns;
model_llama.graphed keeps that closure alive as long as the replay. Without that, dropping
the closure freed the cache, later allocations took its memory, and a replay segfaulted.
"""

import copy
import gc

import pytest
import torch

import model_llama
from support import measure, torch_op

pytestmark = pytest.mark.gpu


def test_hand_made_decode_graphs_replay_beside_compiled_ones():
    config, reference = model_llama.build(layers=1)
    model = copy.deepcopy(reference)
    torch_op.swap_linears(model, "v9")
    expected, replays = {}, {}
    with torch.no_grad():
        for scenario in model_llama.DECODE:  # batch 1 and 16, each step with its own cache
            call, _ = model_llama.step(model, config, scenario)
            expected[scenario] = call().clone()
            replays[scenario] = model_llama.graphed(call)
            del call  # the helper's locals: only the replay holds the step now
        # torch.compile's CUDA graphs (reduce-overhead) in the same process, after the hand-made ones
        compiled = torch.compile(model, fullgraph=True, mode="reduce-overhead", dynamic=False)
        prefill, _ = model_llama.step(compiled, config, "prefill 8x512")
        for _ in range(3):  # compiles, warms up and records
            prefill()
        # its fusions round differently from the eager model: its replays must give its own first result
        expected["prefill"] = prefill().clone()
        gc.collect()
        torch.cuda.empty_cache()
        churn = [torch.randn(64, 2**20, device="cuda") for _ in range(4)]  # memory a freed cache would give away
        replays["prefill"] = lambda: prefill().clone()
        for name, replay in replays.items():
            for _ in range(100):
                out = replay()
            torch.cuda.synchronize()
            err = measure.relative_error(out, expected[name])
            assert err < 1e-3, f"{name}: relative error {err:.3g} after 100 replays"
    del churn
