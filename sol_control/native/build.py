"""Compile the native pass: `python sol_control/native/build.py [OUT]` (default: libsolfused.so beside it).

One library serves every CPU of its architecture: fused_pass.c (the entry points), dispatch.c (the
CPU probe) and kernels_generic.c build for the baseline; each kernels_*.c builds with its own
instruction-set flags, the walk through the model (walk.h) compiled into it, and the probe picks the
best table the CPU runs when the library loads (`sol_control.native.isa` says the same in Python). Every file builds with
-ffp-contract=off: no float operation is fused unless the code says so, so every variant computes
generic C's numbers.

Used by `make native` (in the source tree) and by setup.py's build step (installed packages: colcon,
pip). Without a C compiler, or when the compile fails, nothing is built and ONNX Runtime runs every
graph: the build says so and exits 0, as it never stops an install. Standard library only (it runs
before the package is installed). `objects()` also serves the cross-compiled NEON check
(tests/test_native_isa.py).
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
LIBRARY_NAME = "libsolfused.so"
COMMON = ["-O3", "-std=gnu11", "-ffp-contract=off", "-fPIC", "-Wall", "-Werror", "-Wno-psabi"]
AVX512 = ["-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"]
# (source, extra flags) per object, per architecture; the baseline ones first
UNITS = {
    "x86_64": [("fused_pass.c", []), ("dispatch.c", []), ("kernels_generic.c", []),
               ("kernels_avx2.c", ["-mavx2", "-mfma"]),
               ("kernels_avxvnni.c", ["-mavx2", "-mfma", "-mavxvnni"]),
               ("kernels_avxvnni.c", ["-DSOL_EVEX", *AVX512]),
               ("kernels_avx512vnni.c", AVX512)],
    "aarch64": [("fused_pass.c", []), ("dispatch.c", []), ("kernels_generic.c", []),
                ("kernels_neon.c", ["-march=armv8.2-a+dotprod"])],
}


def compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def machine() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def objects(cc: str, arch: str, workdir: Path, extra: list[str] | None = None) -> list[Path]:
    """Compile the architecture's units (in parallel) into `workdir`; CalledProcessError on failure."""
    jobs = []
    for i, (source, flags) in enumerate(UNITS.get(arch, UNITS["x86_64"][:3])):
        out = workdir / f"{i}_{Path(source).stem}.o"
        cmd = [cc, *COMMON, *(extra or []), *flags, "-c", str(HERE / source), "-o", str(out)]
        jobs.append((cmd, out, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    for cmd, _, proc in jobs:
        _, err = proc.communicate()
        if proc.returncode:
            raise subprocess.CalledProcessError(proc.returncode, cmd, stderr=err)
    return [out for _, out, _ in jobs]


def build(out: str | Path | None = None) -> Path | None:
    """Compile every variant of this architecture into `out`; the path, or None when it could not be
    built (reason printed)."""
    out = Path(out) if out else HERE / LIBRARY_NAME
    cc = compiler()
    if cc is None:
        print("native pass not built (no C compiler): ONNX Runtime runs every graph")
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            objs = objects(cc, machine(), Path(tmp), ["-fopenmp"])
            partial = Path(tmp) / LIBRARY_NAME
            subprocess.run([cc, "-shared", "-fopenmp", "-o", str(partial), *map(str, objs), "-lm"],
                           check=True, capture_output=True, text=True)
        except subprocess.CalledProcessError as e:
            print(f"native pass not built ({' '.join(e.cmd)} failed):\n{e.stderr}ONNX Runtime runs every graph")
            return None
        shutil.move(str(partial), out)  # a library in use is replaced, never rewritten in place
    names = [Path(s).stem.removeprefix("kernels_") + ("_evex" if "-DSOL_EVEX" in f else "")
             for s, f in UNITS.get(machine(), [])[2:]]
    print(f"built {out} (kernels: {', '.join(names) or 'generic'})")
    return out


if __name__ == "__main__":
    build(sys.argv[1] if len(sys.argv) > 1 else None)
