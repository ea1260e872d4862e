"""tilus' on-disk cache, kept per GPU model and per version of a kernel's source.

tilus 0.2.0 keys neither its tuning cache by GPU model nor its record of failed builds
by the kernel's source: a failure recorded before an edit comes back after it. Every
cache directory here is named after the GPU (or build target) and a hash of every file
the kernel's code comes from.

tilus also trusts every file it finds there: a program text cut short by a killed
process fails every later build ("The program text is different from the cached one"),
a truncated library fails to load and an unreadable dispatch table fails every call.
The first use of a cache directory in a process discards such entries, so that tilus
builds or tunes them again (``discard_corrupt_entries``).
"""

import contextlib
import functools
import hashlib
import inspect
import os
import pickle
import struct
import sys
import time
from pathlib import Path

import filelock
import tilus

from support import compat

REPO = Path(__file__).resolve().parent.parent
CACHE_ROOT = Path(os.environ.get("MATMUL_TUTORIAL_CACHE", REPO / ".cache" / "tilus"))

# tilus writes a program's program.txt and options.txt before it takes the program's lock:
# files younger than this may still be being written by another process, and are left alone
SETTLING_S = 10.0

CUBIN = "kernel.cubin"  # what a GPU-less build (support.build) leaves in a program's module directory

_checked: set[Path] = set()  # cache directories this process has checked


def kernel_sources(script_cls) -> list[Path]:
    """The files a kernel's code comes from: its module, its base classes and tilus.Class helpers, compat."""
    module = sys.modules[script_cls.__module__]
    helpers = [value for value in vars(module).values() if isinstance(value, type) and issubclass(value, tilus.Class)]
    classes = [*script_cls.__mro__, *helpers]
    files = {Path(inspect.getsourcefile(cls)) for cls in classes if not cls.__module__.startswith(("tilus", "builtins"))}
    return [*sorted(files), Path(compat.__file__)]


@functools.cache  # asked on every launch; the code a process runs is the code it imported
def source_key(script_cls) -> str:
    digest = hashlib.sha256(tilus.__version__.encode())
    for path in kernel_sources(script_cls):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:10]


def cache_dir_for(script_cls, label: str) -> Path:
    return CACHE_ROOT / label / f"{Path(inspect.getsourcefile(script_cls)).stem}-{source_key(script_cls)}"


def use_cache(script_cls, label: str) -> None:
    """Point tilus at this kernel's cache directory for `label` (a GPU slug or a build target)."""
    directory = cache_dir_for(script_cls, label)
    if directory not in _checked:
        for path, reason in discard_corrupt_entries(directory):
            print(f"cache: discarded {path} ({reason}); it is built or tuned again", file=sys.stderr, flush=True)
        _checked.add(directory)
    tilus.option.cache_dir(directory)


@contextlib.contextmanager
def _unless_busy(lock_path: Path):
    """Hold the lock tilus writes an entry under; yield False, holding nothing, while another process has it."""
    lock = filelock.FileLock(lock_path, timeout=0)
    try:
        lock.acquire()
    except (filelock.Timeout, OSError):
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


def program_text_problem(program_dir: Path) -> str | None:
    """Why tilus would refuse this program directory's program.txt and options.txt, if it would.

    tilus names the directory after sha256(options text + program text) and fails when the
    files no longer match the program that hashes there.
    """
    text, options = program_dir / "program.txt", program_dir / "options.txt"
    if not (text.is_file() and options.is_file()):
        return None  # tilus writes both again when either is missing
    if time.time() - max(text.stat().st_mtime, options.stat().st_mtime) < SETTLING_S:
        return None
    if hashlib.sha256(options.read_bytes() + text.read_bytes()).hexdigest()[:12] != program_dir.name:
        return "program.txt or options.txt does not hash to the directory's name"
    return None


def elf_problem(path: Path) -> str | None:
    """Why this built library or cubin cannot be whole, if it cannot: not ELF, or cut short."""
    size = path.stat().st_size
    with path.open("rb") as f:
        header = f.read(64)
    if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2:
        return f"not a 64-bit ELF file ({size} bytes)"
    order = "<" if header[5] == 1 else ">"
    (program_headers, section_headers) = struct.unpack_from(order + "QQ", header, 0x20)
    ph_size, ph_count, sh_size, sh_count = struct.unpack_from(order + "HHHH", header, 0x36)
    end = max(program_headers + ph_size * ph_count, section_headers + sh_size * sh_count)
    if size < end:
        return f"truncated: {size} bytes, its own headers reach byte {end}"
    return None


def dispatch_table_problem(path: Path) -> str | None:
    """Why tilus could not read this dispatch table (tuned picks), if it could not."""
    try:
        with path.open("rb") as f:
            table = pickle.load(f)
    except Exception as error:  # noqa: BLE001  (unpickling garbage can raise almost anything)
        return f"unreadable: {type(error).__name__}"
    if not isinstance(table, dict):
        return f"not a dict but a {type(table).__name__}"
    return None


def discard_corrupt_entries(directory: Path) -> list[tuple[Path, str]]:
    """Delete the entries of a kernel's cache directory that tilus would fail on; return (path, reason) of each.

    - a program whose program.txt or options.txt does not hash to its directory's name:
      its texts and built module go, tilus writes and builds them again;
    - a built library (lib.so) or cubin (kernel.cubin, GPU-less builds) that is not
      whole: it goes, tilus builds it again;
    - a dispatch table (the tuned picks) that does not unpickle: it goes, each size is
      tuned again.

    Each entry is checked under the lock tilus writes it under, and skipped while another
    process holds that lock.
    """
    discarded = []
    for program_dir in sorted(path for path in directory.glob("programs/*") if path.is_dir()):
        with _unless_busy(program_dir / ".lock") as free:
            if not free:
                continue
            reason = program_text_problem(program_dir)
            if reason:
                for name in ("program.txt", "options.txt"):
                    (program_dir / name).unlink(missing_ok=True)
                for built in (program_dir / "module").glob("*"):
                    if built.is_file():
                        built.unlink()
                discarded.append((program_dir, reason))
                continue
            for name in ("lib.so", CUBIN):
                built = program_dir / "module" / name
                reason = built.is_file() and elf_problem(built)
                if reason:
                    built.unlink()
                    discarded.append((built, reason))
    for table in sorted(directory.glob("scripts/*/*/dispatch_table.pickle")):
        with _unless_busy(table.parent / ".lock") as free:
            reason = free and dispatch_table_problem(table)
            if reason:
                table.unlink()
                table.with_suffix(".txt").unlink(missing_ok=True)
                discarded.append((table, reason))
    return discarded
