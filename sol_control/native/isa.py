"""Which kernel variant of the native pass this CPU runs: the names, the CPU flags each needs, the probe.

The C library holds every variant of its architecture (kernels_*.c, each with the walk through the
model, walk.h, compiled in); it probes the CPU itself when it loads and fills its kernel table with the best variant
the CPU runs. This module says the same in Python, for messages, reports and `sol-control doctor`:
the variants in order of preference, the /proc/cpuinfo flags each needs, and which of them
`SOL_CONTROL_ISA` may force (a variant the CPU lacks is refused, naming the missing flags).
Standard library only (build.py imports it before the package is installed).
"""
from __future__ import annotations

import os
import platform
from pathlib import Path

ENV = "SOL_CONTROL_ISA"

# variant -> the CPU flags it needs (as /proc/cpuinfo spells them), best first per architecture.
# avxvnni_evex is AVX-VNNI's kernels in the EVEX encoding (AVX-512 VNNI + VL, 256-bit): never chosen
# by the probe (avx512vnni is faster where it runs), it exists to test those kernels on such a host.
X86_VARIANTS = {
    "avx512vnni": ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"),
    "avxvnni": ("avx2", "fma", "avx_vnni"),
    "avxvnni_evex": ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"),
    "avx2": ("avx2", "fma"),
    "generic": (),
}
ARM_VARIANTS = {
    "neon": ("asimd", "asimddp"),
    "generic": (),
}
PROBE_SKIPS = ("avxvnni_evex",)  # forced only
FORCEABLE = ("generic", "avx2", "avxvnni", "avxvnni_evex", "avx512vnni", "neon")


def arch() -> str:
    """"x86_64", "aarch64" or what the machine reports."""
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def variants(machine: str | None = None) -> dict[str, tuple[str, ...]]:
    """This architecture's variants (best first) and the flags each needs."""
    machine = machine or arch()
    if machine == "x86_64":
        return X86_VARIANTS
    if machine == "aarch64":
        return ARM_VARIANTS
    return {"generic": ()}


def cpu_flags() -> set[str]:
    """The CPU's flags from /proc/cpuinfo ("flags" on x86, "Features" on ARM); empty if unreadable."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def cpu_model() -> str:
    """The CPU's model name ("model name" on x86; on ARM the implementer and part), or the machine."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return arch()
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    if fields.get("model name"):
        return fields["model name"]
    parts = [fields.get(k, "") for k in ("CPU implementer", "CPU part")]
    return f"{arch()} {' '.join(p for p in parts if p)}".strip()


def missing_flags(variant: str, flags: set[str] | None = None) -> list[str]:
    """The flags `variant` needs that this CPU lacks ([] when it runs); ValueError for a variant
    unknown on this architecture."""
    table = variants()
    if variant not in table:
        raise ValueError(f"{ENV}={variant!r}: not a variant on {arch()}; one of {sorted(table)}")
    flags = cpu_flags() if flags is None else flags
    return [f for f in table[variant] if f not in flags]


def runnable(flags: set[str] | None = None) -> list[str]:
    """The variants this CPU runs, best first."""
    flags = cpu_flags() if flags is None else flags
    return [v for v in variants() if not missing_flags(v, flags)]


def probed(flags: set[str] | None = None) -> str:
    """The variant the probe picks: the best one this CPU runs (never a forced-only one)."""
    return next(v for v in runnable(flags) if v not in PROBE_SKIPS)


def requested() -> str | None:
    """The variant SOL_CONTROL_ISA forces, checked (ValueError naming the missing flags), or None."""
    name = os.environ.get(ENV, "").strip().lower()
    if not name or name == "auto":
        return None
    if name not in FORCEABLE:
        raise ValueError(f"{ENV} must be auto or one of {FORCEABLE}, got {name!r}")
    return check(name, f"{ENV}={name}")


def check(variant: str, what: str) -> str:
    """`variant`, or ValueError naming `what` and the flags this CPU lacks for it."""
    lacking = missing_flags(variant)
    if lacking:
        raise ValueError(f"{what}: this CPU ({cpu_model()}) lacks {', '.join(lacking)}; "
                         f"it runs {', '.join(runnable())}")
    return variant


def describe() -> dict:
    """The CPU and its variants, for reports: model, arch, the flags that matter, runnable, chosen."""
    flags = cpu_flags()
    wanted = sorted({f for need in variants().values() for f in need})
    try:
        forced, error = requested(), None
    except ValueError as e:
        forced, error = None, str(e)
    out = {"cpu": cpu_model(), "arch": arch(), "flags": [f for f in wanted if f in flags],
           "runnable": runnable(flags), "variant": forced or probed(flags), "forced": forced is not None}
    if error:
        out["error"] = error
    return out
