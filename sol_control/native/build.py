"""Compile the native pass: `python sol_control/native/build.py [OUT]` (default: libsolfused.so beside it).

One place for the compiler flags, used by `make native` (in the source tree) and by setup.py's
build step (installed packages: colcon, pip). AVX-512 VNNI code where the building CPU has it
(`sol_control.decoding.native` refuses such a library on a CPU without it), plain C elsewhere.
Without a C compiler, or when the compile fails, nothing is built and ONNX Runtime runs every graph:
the build says so and exits 0, as it never stops an install. Standard library only (it runs before
the package is installed).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().with_name("fused_pass.c")
LIBRARY_NAME = "libsolfused.so"
VNNI_FLAGS = ["-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"]
VNNI_CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")


def cpu_has_vnni() -> bool:
    """Does this CPU run the VNNI build (Linux /proc/cpuinfo flags)?"""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False
    return all(flag in flags for flag in VNNI_CPU_FLAGS)


def compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def build(out: str | Path | None = None, vnni: bool | None = None) -> Path | None:
    """Compile SOURCE into `out`; the path, or None when it could not be built (reason printed).
    `vnni` None: AVX-512 VNNI code where this CPU has it; False: plain C (tests compare the two)."""
    out = Path(out) if out else SOURCE.with_name(LIBRARY_NAME)
    cc = compiler()
    if cc is None:
        print("native pass not built (no C compiler): ONNX Runtime runs every graph")
        return None
    vnni = cpu_has_vnni() if vnni is None else vnni
    out.parent.mkdir(parents=True, exist_ok=True)
    # -Wno-psabi: in the plain build GCC notes that 64-byte vectors passed between the inline helpers
    # would change an ABI; none crosses the library's interface
    cmd = [cc, "-O3", *(VNNI_FLAGS if vnni else []), "-fopenmp", "-fPIC", "-shared", "-Wall", "-Werror", "-Wno-psabi", "-o", str(out),
           str(SOURCE), "-lm"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        print(f"native pass not built ({' '.join(cmd)} failed):\n{done.stderr}ONNX Runtime runs every graph")
        return None
    print(f"built {out} ({'AVX-512 VNNI' if vnni else 'plain C'})")
    return out


if __name__ == "__main__":
    build(sys.argv[1] if len(sys.argv) > 1 else None)
