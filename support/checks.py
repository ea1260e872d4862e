"""What ``matmul(a, b, out)`` accepts: each rule a TypeError or ValueError that names it.

``check_inputs`` runs on every call, so it asks the cheap questions first: when one
conjunction of them holds, the input is valid and nothing else is asked. Only input that
fails it goes through the rules one by one (``check_each_rule``), which name the first
rule broken.
"""

import torch

# the element types the kernels take: A, B and C all of one of them, fp32 accumulation
DTYPES = (torch.float16, torch.bfloat16)


def _check_tensor(name: str, t, shape=None, dtype=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is None and t.dtype not in DTYPES:
        raise TypeError(f"{name} must be torch.float16 or torch.bfloat16, got {t.dtype}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype} like a and b (C has the dtype of the inputs), got {t.dtype}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D, got {t.dim()}-D with shape {tuple(t.shape)}")
    if shape is not None and tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} (M x N), got {tuple(t.shape)}")


def _check_layout(name: str, t: torch.Tensor) -> None:
    rows, cols = t.shape
    if t.stride(1) != 1 or (rows > 1 and t.stride(0) != cols):
        raise ValueError(
            f"{name} must be contiguous (row-major, strides ({cols}, 1)), got strides {t.stride()}; "
            "call .contiguous() first"
        )
    if cols % 8:
        raise ValueError(
            f"{name} has {cols} columns: TMA needs 16-byte row strides, so the row length must be a "
            "multiple of 8 for fp16 and bf16 (K for A and B, N for the output); pad it"
        )
    if t.data_ptr() % 16:
        raise ValueError(f"{name} must start at a 16-byte aligned address for TMA (a sliced view may not)")


def _overlaps(x: torch.Tensor, y: torch.Tensor) -> bool:
    x0, y0 = x.data_ptr(), y.data_ptr()
    return (x.get_device() == y.get_device() and x0 < y0 + y.numel() * y.element_size()
            and y0 < x0 + x.numel() * x.element_size())


def check_inputs(a, b, out=None) -> tuple[int, int, int, int]:
    """Validate ``matmul(a, b, out)`` input; return (M, N, K, GPU index). Raises TypeError/ValueError naming the rule.

    Each question below is a call into torch that costs the host a fraction of a
    microsecond, so each is asked once: the shapes and the dtype are read once, and the
    device index is returned, for the launcher's lookup and out's check, rather than asked
    again.
    """
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        a_shape, b_shape = a.shape, b.shape
        if len(a_shape) == 2 and len(b_shape) == 2:
            (m, k), (n, kb) = a_shape, b_shape
            dtype, index = a.dtype, a.get_device()
            if (k == kb and m and n and k and not (k % 8 or n % 8) and max(m * k, n * k, m * n) < 2**31
                    and dtype in DTYPES and b.dtype is dtype and a.is_cuda and b.get_device() == index
                    and a.is_contiguous() and b.is_contiguous() and not (a.data_ptr() % 16 or b.data_ptr() % 16)
                    and (out is None or _fits_out(out, a, b, m, n, index))):
                return m, n, k, index
    return check_each_rule(a, b, out)


def _fits_out(out, a: torch.Tensor, b: torch.Tensor, m: int, n: int, index: int) -> bool:
    return (isinstance(out, torch.Tensor) and out.dtype is a.dtype and out.shape == (m, n)
            and out.get_device() == index and out.is_contiguous() and not out.data_ptr() % 16
            and not _overlaps(out, a) and not _overlaps(out, b))


def check_sizes(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int, int]:
    """(M, N, K) of 2-D a (M x K) and b (N x K), or a ValueError naming the rule (the fp8 versions' rules too)."""
    (m, k), (n, kb) = a.shape, b.shape
    if k != kb:
        raise ValueError(f"K mismatch: a is {m}x{k} and b is {n}x{kb}; C = A @ B.T needs a.shape[1] == b.shape[1]")
    if 0 in (m, n, k):
        raise ValueError(f"empty dimension: M={m}, N={n}, K={k}; all must be at least 1")
    if max(m * k, n * k, m * n) >= 2**31:
        raise ValueError(f"{m}x{n}x{k} is too large: the kernels index each matrix with 32-bit integers")
    return m, n, k


def check_each_rule(a, b, out=None) -> tuple[int, int, int, int]:
    """The rules one by one, each raising a TypeError/ValueError that names it; (M, N, K, GPU index) if all hold."""
    _check_tensor("a", a)
    _check_tensor("b", b)
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have one dtype (both torch.float16 or both torch.bfloat16), got {a.dtype} and "
                        f"{b.dtype}")
    m, n, k = check_sizes(a, b)
    _check_layout("a", a)
    _check_layout("b", b)
    if out is not None:
        _check_tensor("out", out, shape=(m, n), dtype=a.dtype)
    if n % 8:
        raise ValueError(f"N={n}: the output's rows are stored by TMA, so N must be a multiple of 8 for fp16 and bf16; "
                         "pad b")
    if out is not None:
        _check_layout("out", out)
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t is not None and t.device.type != "cuda":
            raise ValueError(f"{name} is on the {t.device.type.upper()}; move it to the GPU (.cuda())")
    if b.device != a.device or (out is not None and out.device != a.device):
        raise ValueError(f"a, b and out must be on one GPU, got {a.device}, {b.device}, {getattr(out, 'device', '-')}")
    if out is not None and (_overlaps(out, a) or _overlaps(out, b)):
        raise ValueError("out must not share memory with a or b")
    return m, n, k, a.get_device()
