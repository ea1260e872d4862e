"""The versions on disk: the lesson's top-level ``matmul_vN.py`` (Hopper), ``blackwell/matmul_vN.py``, and which
take fp8 operands with scales (``support.scaled``) rather than fp16 or bf16 ones.

Names are module names (``matmul_v5``, ``blackwell.matmul_v5``), in the order of their numbers.
"""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def number(name: str) -> int:
    """5 for 'matmul_v5', 'blackwell.matmul_v5', 'v5' or a path ending in matmul_v5.py."""
    return int(re.search(r"v(\d+)(?:\.py)?$", str(name)).group(1))


def _modules(folder: Path, prefix: str = "") -> list[str]:
    return [prefix + path.stem for path in sorted(folder.glob("matmul_v*.py"), key=number)]


def is_fp8(module: str) -> bool:
    """A version whose matmul takes fp8 A and B with their scales."""
    return "from support import scaled" in (REPO / (module.replace(".", "/") + ".py")).read_text()


def lesson() -> list[str]:
    """Every top-level version: the Hopper lesson, v1 first."""
    return _modules(REPO)


def sixteen_bit() -> list[str]:
    """The top-level versions of fp16 and bf16 (``matmul(a, b, out)``)."""
    return [module for module in lesson() if not is_fp8(module)]


def fp8() -> list[str]:
    """The top-level versions of fp8 with scales (``matmul(a, b, scale_a, scale_b, out)``)."""
    return [module for module in lesson() if is_fp8(module)]


def blackwell() -> list[str]:
    """Every Blackwell version, ``blackwell.matmul_vN``: numbered by the Hopper version of the same idea."""
    return _modules(REPO / "blackwell", "blackwell.")
