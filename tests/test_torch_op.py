"""The versions as torch custom ops: registration, shapes under fake tensors, the Linear swap, whole-graph tracing;
on a GPU also results, gradients, torch.compile, CUDA graphs and the refusal to tune inside a capture."""

import pytest
import torch
from conftest import VERSIONS
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

import support  # noqa: F401  (the tilus 0.2.0 workarounds, before any version is imported)
from support import torch_op
from support.measure import REL_ERR_TOL, relative_error

NAMES = [version.removeprefix("matmul_") for version in VERSIONS]


@pytest.mark.parametrize("version", NAMES)
def test_every_version_is_a_custom_op_with_a_fake_implementation(version):
    gemm = torch_op.op(version)
    assert gemm is getattr(torch.ops.tilus_gemm, version)
    with FakeTensorMode():
        for dtype in torch_op.DTYPES:
            a, b = torch.empty(37, 64, dtype=dtype), torch.empty(24, 64, dtype=dtype)
            c = gemm(a, b)
            assert (tuple(c.shape), c.dtype) == ((37, 24), dtype)
        with pytest.raises(Exception, match="K differs"):
            gemm(torch.empty(4, 64, dtype=torch.float16), torch.empty(8, 72, dtype=torch.float16))


def test_gradients_have_the_operands_shapes_where_m_is_no_multiple_of_8():
    # dB = dC^T @ A runs over M: the op pads M to a multiple of 8, the result keeps B's shape
    with FakeTensorMode():
        a = torch.empty(37, 64, dtype=torch.bfloat16, requires_grad=True)
        b = torch.empty(24, 64, dtype=torch.bfloat16, requires_grad=True)
        torch_op.op("v9")(a, b).sum().backward()
        assert (tuple(a.grad.shape), tuple(b.grad.shape)) == ((37, 64), (24, 64))


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(64, 128, dtype=torch.bfloat16)
        self.odd = nn.Linear(60, 64, dtype=torch.bfloat16)
        self.fp32 = nn.Linear(64, 64)
        self.block = nn.Sequential(nn.Linear(128, 64, bias=False, dtype=torch.float16), nn.GELU())


def test_swap_touches_exactly_the_eligible_linears_and_shares_their_parameters():
    model = Mixed()
    up_weight = model.up.weight
    swapped, kept = torch_op.swap_linears(model, "v9")
    assert swapped == ["up", "block.0"]
    assert kept == {"odd": "in_features 60 is not a multiple of 8 (TMA needs 16-byte rows)",
                    "fp32": "dtype torch.float32 (the kernels take fp16 and bf16)"}
    assert isinstance(model.up, torch_op.Linear) and model.up.weight is up_weight
    assert type(model.odd) is nn.Linear and type(model.fp32) is nn.Linear
    assert model.block[0].bias is None


def test_linear_refuses_what_the_kernels_cannot_take():
    with pytest.raises(ValueError, match="out_features 100 is not a multiple of 8"):
        torch_op.Linear(64, 100)
    with pytest.raises(ValueError, match="dtype torch.float32"):
        torch_op.Linear(64, 64, dtype=torch.float32)


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                         num_hidden_layers=2, vocab_size=256, max_position_embeddings=128)
    torch.manual_seed(0)
    return config, LlamaForCausalLM(config).to(torch.bfloat16).eval()


def test_a_tiny_llama_traces_whole_with_every_linear_on_the_op():
    # torch.export in strict mode traces through dynamo with fake tensors: one graph, no break
    config, model = tiny_llama()
    swapped, kept = torch_op.swap_linears(model, "v9")
    assert len(swapped) == 2 * 7 + 1 and kept == {}  # q, k, v, o, gate, up, down per layer, and the LM head
    ids = torch.randint(0, config.vocab_size, (2, 16))
    program = torch.export.export(model, (ids,), kwargs={"use_cache": False}, strict=True)
    assert sum("tilus_gemm.v9" in str(node.target) for node in program.graph.nodes) == len(swapped)


# --- on a GPU -----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", torch_op.DTYPES)
def test_op_matches_torch_and_its_gradients_match_torchs(dtype):
    torch.manual_seed(0)
    for m, n, k in [(1, 64, 128), (37, 24, 64), (256, 512, 1024)]:
        a = torch.randn(m, k, device="cuda", dtype=dtype, requires_grad=True)
        b = torch.randn(n, k, device="cuda", dtype=dtype, requires_grad=True)
        grad = torch.randn(m, n, device="cuda", dtype=dtype)
        c = torch_op.op("v9")(a, b)
        c.backward(grad)
        assert relative_error(c, a.detach().float() @ b.detach().float().T) <= REL_ERR_TOL[dtype]
        assert relative_error(a.grad, grad.float() @ b.detach().float()) <= REL_ERR_TOL[dtype]
        assert relative_error(b.grad, grad.float().T @ a.detach().float()) <= REL_ERR_TOL[dtype]


@pytest.mark.gpu
def test_compiled_whole_and_replayed_from_a_cuda_graph():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256)).to("cuda", torch.bfloat16)
    swapped, _ = torch_op.swap_linears(mlp, "v9")
    assert len(swapped) == 2
    torch._dynamo.reset()
    compiled = torch.compile(mlp, fullgraph=True, mode="reduce-overhead")
    with torch.no_grad():
        for step in range(4):  # warm-up (tunes eagerly), recording, then replays with fresh inputs
            x = torch.randn(3, 5, 256, device="cuda", dtype=torch.bfloat16)
            reference = (torch.nn.functional.gelu(x.float() @ mlp[0].weight.float().T + mlp[0].bias.float())
                         .to(torch.bfloat16).float() @ mlp[2].weight.float().T + mlp[2].bias.float())
            assert relative_error(compiled(x).clone(), reference) <= 2 * REL_ERR_TOL[torch.bfloat16], step


@pytest.mark.gpu
def test_a_first_call_inside_a_capture_is_refused_with_the_remedy():
    gemm = torch_op.op("v5")
    a = torch.randn(72, 4104, device="cuda", dtype=torch.float16)  # a size bucket nothing else here tunes
    b = torch.randn(40, 4104, device="cuda", dtype=torch.float16)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="before the capture"):
        with torch.cuda.graph(graph):
            gemm(a, b)
    torch_op.prepare("v5", [(72, 40, 4104)], torch.float16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = gemm(a, b)
    graph.replay()
    assert relative_error(c, a.float() @ b.float().T) <= REL_ERR_TOL[torch.float16]


@pytest.mark.gpu
def test_a_tiny_llama_on_the_op_gives_the_cublas_logits():
    config, model = tiny_llama()
    model = model.cuda()
    ids = torch.randint(0, config.vocab_size, (2, 16), device="cuda")
    with torch.no_grad():
        reference = model(input_ids=ids, use_cache=False).logits.float()
        torch_op.swap_linears(model, "v9")
        logits = model(input_ids=ids, use_cache=False).logits.float()
    # measured on the H100: 0.0 for three prompts (the GEMMs return cuBLAS's bits); 1e-3 leaves room for a tuner
    # that picks another reduction order on another GPU, and none for a wrong layer, which errs by far more
    assert relative_error(logits, reference) <= 1e-3
