"""Energy per decision: CPU time -> joules, measured with RAPL where it can be read, else estimated.

    joules = cpu_ms / 1000 x watts per busy core

    measured   RAPL: the package zones' energy counters (/sys/class/powercap/intel-rapl:N with a
               `name` of package-N: energy_uj, wrapping at max_energy_range_uj; AMD exposes the same
               zones) over a window, divided by the machine's busy CPU-seconds over that window
               (/proc/stat: user + nice + system + irq + softirq). Idle power is charged to the
               work done, so a quiet machine reads high; the rate is that of the whole package.
    estimated  no readable RAPL (this machine has no /sys/class/powercap; most kernels make
               energy_uj root-only): `watts_per_busy_core` (default DEFAULT_WATTS_PER_BUSY_CORE,
               see DEFAULT_ASSUMPTION), and every figure is labelled `estimated` with that assumption.

`cpu_ms` of a decision (`Decision.cpu_ms`) is the CPU time of the thread that decided: perception,
both planners and ONNX Runtime's kernels at `decoding.threads` 1 (with more intra-op threads their
pool's time is not in it). Not counted: the ROS executor's share (message conversion, DDS) and the
shadow audit's background recomputation. One module for the node, the demo, `bench node` and the
decode benchmark (`energy_row`).
"""
from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

POWERCAP = Path("/sys/class/powercap")
PROC_STAT = Path("/proc/stat")
# A current many-core server CPU's TDP per core, AMD EPYC 9655 (Zen 5, 96 cores): 400 W default TDP
# (AMD's product page) / 96 cores; TDP is the package at full load. The hosts we ran on (an AMD EPYC
# of family 26, an Intel Xeon with AMX) are cloud VMs of that class that report no model number.
DEFAULT_WATTS_PER_BUSY_CORE = 4.2
DEFAULT_ASSUMPTION = ("no readable RAPL: {w:g} W per busy core assumed (a many-core server CPU's TDP per core, e.g. "
                      "AMD EPYC 9655: 400 W / 96 cores; package at TDP shared evenly; idle, memory and the rest "
                      "of the host not counted; this host: {cpu})")
CPUINFO = Path("/proc/cpuinfo")


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """The first 'model name' of /proc/cpuinfo ('unknown CPU' where there is none)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"
MEASURED = "measured"
ESTIMATED = "estimated"


@dataclass(frozen=True)
class RaplZone:
    path: Path
    max_range_uj: int


def rapl_zones(root: Path = POWERCAP) -> tuple[list[RaplZone], str]:
    """The readable RAPL package zones under `root`, and why there are none ("" when there are)."""
    if not root.is_dir():
        return [], f"{root} does not exist"
    zones, why = [], ""
    for d in sorted(root.glob("intel-rapl:*")):
        if d.name.count(":") != 1:
            continue  # a subzone (core, uncore, dram): its energy is already in its package
        try:
            if not (d / "name").read_text().strip().startswith("package"):
                continue  # psys and other top-level zones are not the CPU package
            (d / "energy_uj").read_text()
            zones.append(RaplZone(d, int((d / "max_energy_range_uj").read_text())))
        except (OSError, ValueError) as e:
            why = f"{d / 'energy_uj'}: {type(e).__name__}: {e}"
    return zones, ("" if zones else why or f"no RAPL package zone under {root}")


def read_energy_uj(zones: list[RaplZone]) -> list[int]:
    return [int((z.path / "energy_uj").read_text()) for z in zones]


def busy_cpu_s(proc_stat: Path = PROC_STAT) -> float:
    """CPU-seconds the whole machine has been busy since boot (all cores; steal and idle excluded)."""
    for line in proc_stat.read_text().splitlines():
        if line.startswith("cpu "):
            user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in line.split()[1:8])
            return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")
    raise ValueError(f"{proc_stat}: no aggregate cpu line")


class EnergyMeter:
    """cpu_ms -> joules. Call `update()` now and then (the node: every /diagnostics tick): with RAPL,
    each window holding at least `min_busy_s` busy CPU-seconds gives the measured watts per busy
    core; without RAPL the assumed figure stays and `basis` says `estimated`."""

    def __init__(self, watts_per_busy_core: float = DEFAULT_WATTS_PER_BUSY_CORE, powercap: Path = POWERCAP,
                 proc_stat: Path = PROC_STAT, min_busy_s: float = 0.5):
        if not (watts_per_busy_core > 0 and math.isfinite(watts_per_busy_core)):
            raise ValueError(f"watts_per_busy_core must be a positive number, got {watts_per_busy_core}")
        self.assumed_w = watts_per_busy_core
        self.proc_stat = proc_stat
        self.min_busy_s = min_busy_s
        self.zones, self.why_estimated = rapl_zones(powercap)
        self.measured_w: float | None = None
        self._last: tuple[list[int], float] | None = None
        self.update()

    @property
    def basis(self) -> str:
        return MEASURED if self.measured_w is not None else ESTIMATED

    @property
    def watts_per_busy_core(self) -> float:
        return self.measured_w if self.measured_w is not None else self.assumed_w

    @property
    def assumption(self) -> str:
        if self.measured_w is not None:
            return (f"RAPL package energy / busy CPU-seconds of the machine over the last window: "
                    f"{self.measured_w:.2f} W per busy core (idle power charged to the work)")
        return DEFAULT_ASSUMPTION.format(w=self.assumed_w, cpu=cpu_model()) + f" [{self.why_estimated}]"

    def update(self) -> None:
        if not self.zones:
            return
        try:
            now = (read_energy_uj(self.zones), busy_cpu_s(self.proc_stat))
        except (OSError, ValueError) as e:
            self.zones, self.why_estimated = [], f"RAPL read failed: {type(e).__name__}: {e}"
            return
        if self._last is None:
            self._last = now
            return
        busy_s = now[1] - self._last[1]
        if busy_s < self.min_busy_s:
            return  # too little work in the window to divide by: keep the last rate
        joules = sum(_delta_uj(a, b, z.max_range_uj) for a, b, z in zip(self._last[0], now[0], self.zones)) / 1e6
        self.measured_w = joules / busy_s
        self._last = now

    def joules(self, cpu_ms: float) -> float:
        return cpu_ms / 1000.0 * self.watts_per_busy_core


def _delta_uj(before: int, after: int, max_range_uj: int) -> int:
    return after - before if after >= before else after + max_range_uj - before  # the counter wrapped


def per_source(rows: Iterable[tuple[str, float]], meter: EnergyMeter) -> dict[str, dict[str, float]]:
    """(source, cpu_ms) per decision -> {source: {decisions, cpu_ms_per_decision, joules_per_decision}}
    (means: total CPU time and energy over decisions). Rows without a CPU time (NaN: the watchdog
    answered for a decision still running) are left out of the means but counted in `decisions`."""
    acc: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    for source, cpu_ms in rows:
        counts[source] = counts.get(source, 0) + 1
        if math.isfinite(cpu_ms):
            acc.setdefault(source, []).append(cpu_ms)
    out = {}
    for source in sorted(counts):
        vals = acc.get(source, [])
        mean = sum(vals) / len(vals) if vals else math.nan
        out[source] = {"decisions": counts[source], "cpu_ms_per_decision": mean,
                       "joules_per_decision": meter.joules(mean)}
    return out


def labels(meter: EnergyMeter) -> dict[str, str]:
    """The sibling keys that say how `joules_per_decision` was obtained."""
    return {"joules_per_decision_basis": meter.basis, "energy_assumption": meter.assumption}


def energy_row(cpu_s: float, decisions: int, meter: EnergyMeter, tokens: int = 0) -> dict[str, float | str]:
    """For a benchmark row (e.g. `bench decode`, per precision): the CPU-seconds its decoding thread
    used (time.thread_time around the runs, 1 intra-op thread) over `decisions` runs of `tokens`
    tokens in all -> CPU ms and joules per decision (and per token when `tokens`), with the basis."""
    cpu_ms = 1000.0 * cpu_s / decisions if decisions else math.nan
    row: dict[str, float | str] = {"cpu_ms_per_decision": cpu_ms, "joules_per_decision": meter.joules(cpu_ms)}
    if tokens:
        row["joules_per_token"] = meter.joules(1000.0 * cpu_s / tokens)
    row.update(labels(meter))
    return row
