"""What every version shares, split by concern; each ``matmul_vN.py`` keeps only its kernels.

A version file uses three names from here: :func:`kernels` (its KERNELS), :func:`launch`
(``matmul(a, b, out)``) and :func:`main` (its command line). The modules, in the order a call goes through them:

- ``checks``: the input rules of ``matmul(a, b, out)``, each a TypeError/ValueError naming it.
- ``gpu``: which GPU the tensors are on (Hopper or Blackwell), its name, and each version's kernel for it.
- ``dispatch``: pick the kernel for the GPU, tune once per size bucket, launch.
- ``cache``: tilus' cache directory, per GPU model and per version of the kernel source.
- ``measure``: random inputs, the error against an fp32 reference, the timer.
- ``build``: every schedule built for sm_90a or sm_100a without a GPU.
- ``cli``: check against cuBLAS, time against it, write results/<gpu>.csv.
- ``compat``: workarounds for tilus 0.2.0 defects, applied on import; they change how
  tilus emits code for every kernel, so a kernel copied out of this repository needs
  them too (or a tilus release that fixed them).
"""

from support import compat

compat.apply()

from support.cli import main  # noqa: E402  (after the workarounds are in place)
from support.dispatch import launch  # noqa: E402
from support.gpu import UnsupportedGPUError, kernels  # noqa: E402

__all__ = ["UnsupportedGPUError", "kernels", "launch", "main"]
