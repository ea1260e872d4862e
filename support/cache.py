"""tilus' on-disk cache, kept per GPU model and per version of a kernel's source.

tilus 0.2.0 keys neither its tuning cache by GPU model nor its record of failed builds
by the kernel's source: a failure recorded before an edit comes back after it. Every
cache directory here is named after the GPU (or build target) and a hash of every file
the kernel's code comes from.
"""

import hashlib
import inspect
import os
import sys
from pathlib import Path

import tilus

from support import compat

REPO = Path(__file__).resolve().parent.parent
CACHE_ROOT = Path(os.environ.get("MATMUL_TUTORIAL_CACHE", REPO / ".cache" / "tilus"))


def kernel_sources(script_cls) -> list[Path]:
    """The files a kernel's code comes from: its module, its base classes and tilus.Class helpers, compat."""
    module = sys.modules[script_cls.__module__]
    helpers = [value for value in vars(module).values() if isinstance(value, type) and issubclass(value, tilus.Class)]
    classes = [*script_cls.__mro__, *helpers]
    files = {Path(inspect.getsourcefile(cls)) for cls in classes if not cls.__module__.startswith(("tilus", "builtins"))}
    return [*sorted(files), Path(compat.__file__)]


def source_key(script_cls) -> str:
    digest = hashlib.sha256(tilus.__version__.encode())
    for path in kernel_sources(script_cls):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:10]


def cache_dir_for(script_cls, label: str) -> Path:
    return CACHE_ROOT / label / f"{Path(inspect.getsourcefile(script_cls)).stem}-{source_key(script_cls)}"


def use_cache(script_cls, label: str) -> None:
    """Point tilus at this kernel's cache directory for `label` (a GPU slug or a build target)."""
    tilus.option.cache_dir(cache_dir_for(script_cls, label))
