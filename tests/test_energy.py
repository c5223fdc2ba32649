"""Energy per decision (sol_control/energy.py): RAPL where it can be read, else a labelled estimate;
and the /diagnostics keys it feeds (CPU ms and joules by source, the policy's routes, the line).

RAPL cannot be read on this machine (no /sys/class/powercap), so the measured path reads a
powercap tree and a /proc/stat written here in the kernel's formats."""
import math
import os
from pathlib import Path

import pytest

from sol_control.energy import (DEFAULT_WATTS_PER_BUSY_CORE, ESTIMATED, MEASURED, EnergyMeter, busy_cpu_s,
                                energy_row, per_source, rapl_zones)

TCK = os.sysconf("SC_CLK_TCK")


def write_stat(path: Path, busy_ticks: int, idle_ticks: int = 1000) -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice; busy = user+nice+system+irq+softirq
    path.write_text(f"cpu  {busy_ticks - 30} 10 10 {idle_ticks} 5 5 5 99 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")


def zone(root: Path, name: str, label: str, energy_uj: int, max_uj: int = 2**32) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "name").write_text(label + "\n")
    (d / "energy_uj").write_text(f"{energy_uj}\n")
    (d / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return d


def test_without_rapl_the_joules_are_an_estimate_that_says_so(tmp_path):
    m = EnergyMeter(powercap=tmp_path / "no_powercap")
    assert m.basis == ESTIMATED and m.watts_per_busy_core == DEFAULT_WATTS_PER_BUSY_CORE
    assert "4.2 W per busy core assumed" in m.assumption and "does not exist" in m.assumption
    assert m.joules(250.0) == pytest.approx(0.25 * DEFAULT_WATTS_PER_BUSY_CORE)
    m.update()  # nothing to read: still the estimate
    assert m.basis == ESTIMATED
    assert EnergyMeter(10.0, powercap=tmp_path / "none").joules(100.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="watts_per_busy_core.*-1"):
        EnergyMeter(-1.0)


def test_this_machine_reads_busy_cpu_time_from_proc_stat():
    a = busy_cpu_s()
    sum(i * i for i in range(200_000))  # some work of this process
    assert busy_cpu_s() >= a > 0


def test_rapl_package_zones_give_measured_watts_per_busy_core(tmp_path):
    root, stat = tmp_path / "powercap", tmp_path / "stat"
    p0 = zone(root, "intel-rapl:0", "package-0", 1_000_000)
    zone(root / "intel-rapl:0", "intel-rapl:0:0", "core", 999)          # a subzone: inside package-0
    zone(root, "intel-rapl:1", "psys", 5_000_000)                        # platform, not the package
    p1 = zone(root, "intel-rapl:2", "package-1", 2_000_000, max_uj=2_500_000)
    zones, why = rapl_zones(root)
    assert [z.path.name for z in zones] == ["intel-rapl:0", "intel-rapl:2"] and why == ""
    write_stat(stat, busy_ticks=10 * TCK)
    m = EnergyMeter(powercap=root, proc_stat=stat)
    assert m.basis == ESTIMATED  # one sample is not a window yet
    assert busy_cpu_s(stat) == pytest.approx(10.0)
    # 4 busy CPU-seconds later: package-0 used 30 J, package-1 wrapped (2.0 -> 2.5 -> 0.5 J): 1 J
    (p0 / "energy_uj").write_text("31000000\n")
    (p1 / "energy_uj").write_text("500000\n")
    write_stat(stat, busy_ticks=14 * TCK)
    m.update()
    assert m.basis == MEASURED and m.watts_per_busy_core == pytest.approx(31.0 / 4.0)
    assert m.joules(1000.0) == pytest.approx(7.75) and "RAPL" in m.assumption
    # a window with too little work keeps the last rate
    write_stat(stat, busy_ticks=14 * TCK + 1)
    (p0 / "energy_uj").write_text("91000000\n")
    m.update()
    assert m.watts_per_busy_core == pytest.approx(7.75)


def test_unreadable_rapl_falls_back_to_the_estimate_with_the_reason(tmp_path):
    root = tmp_path / "powercap"
    d = zone(root, "intel-rapl:0", "package-0", 1)
    (d / "energy_uj").unlink()  # as when the counter is not there (or root-only for this user)
    m = EnergyMeter(powercap=root, proc_stat=tmp_path / "stat")
    assert m.basis == ESTIMATED and "energy_uj" in m.assumption


def test_per_source_means_and_the_benchmark_row(tmp_path):
    m = EnergyMeter(5.0, powercap=tmp_path / "none")
    rows = [("fast", 2.0), ("fast", 4.0), ("full_precision", 10.0), ("safe_default", math.nan)]
    out = per_source(rows, m)
    assert out["fast"] == {"decisions": 2, "cpu_ms_per_decision": 3.0, "joules_per_decision": pytest.approx(0.015)}
    assert out["full_precision"]["joules_per_decision"] == pytest.approx(0.05)
    assert out["safe_default"]["decisions"] == 1 and math.isnan(out["safe_default"]["cpu_ms_per_decision"])
    row = energy_row(cpu_s=0.5, decisions=100, meter=m, tokens=1500)
    assert row["cpu_ms_per_decision"] == 5.0 and row["joules_per_decision"] == pytest.approx(0.025)
    assert row["joules_per_token"] == pytest.approx(0.5 * 5.0 / 1500)
    assert row["joules_per_decision_basis"] == ESTIMATED and "assumed" in row["energy_assumption"]


def test_diagnostics_carry_cpu_joules_policy_and_the_line(tmp_path):
    import rclpy  # noqa: F401  (a runtime pin: missing is a failure, not a skip)
    from rclpy.time import Time

    from sol_control.actions import QCVerdict, safe_default
    from sol_control.decision import Decision, Failure
    from sol_control.ros.diagnostics import NodeStats

    st = NodeStats()
    v = QCVerdict("crack", "reject", 0.5, 0.5, 0.8, 0.9)
    for _ in range(6):
        st.record(Decision("qc", v, "fast", 4.0, 20.0, True, 1, cpu_ms=3.0))
    st.record(Decision("qc", v, "full_precision", 9.0, 20.0, True, 1, cpu_ms=9.0,
                       fast_failure=Failure("policy_qc_class", "crack"), policy_overruled=True))
    st.record(Decision("qc", v, "full_precision", 9.0, 20.0, True, 1, cpu_ms=11.0,
                       fast_failure=Failure("policy_qc_class", "crack")))
    st.record(Decision("qc", safe_default("qc"), "safe_default", 5.0, 20.0, True, 1, cpu_ms=4.0,
                       fast_failure=Failure("policy_qc_severity", "0.80"),
                       full_failure=Failure("full_precision_would_miss")))
    st.record(Decision("qc", safe_default("qc"), "safe_default", 20.0, 20.0, False, 1,
                       fast_failure=Failure("watchdog")))  # no CPU time: the watchdog answered
    meter = EnergyMeter(4.0, powercap=tmp_path / "none")
    msg = st.to_msg(Time().to_msg(), "active", "", {}, 0, meter, line="plant/line2")
    by = {s.name: s for s in msg.status}
    assert set(by) == {"plant/line2/sol_control: node", "plant/line2/sol_control: qc"}
    assert {s.hardware_id for s in msg.status} == {"plant/line2"}
    qc = {kv.key: kv.value for kv in by["plant/line2/sol_control: qc"].values}
    assert qc["policy_routed"] == "3" and float(qc["policy_routed_share"]) == pytest.approx(0.3)
    assert qc["policy_safe_defaults"] == "1" and qc["policy_overruled"] == "1"
    assert qc["fallback.policy_qc_class"] == "2" and qc["fallback.policy_qc_severity"] == "1"
    assert float(qc["cpu_ms_per_decision.fast"]) == 3.0 and float(qc["cpu_ms_per_decision.full_precision"]) == 10.0
    assert float(qc["cpu_ms_per_decision.safe_default"]) == 4.0  # the watchdog's answer has no CPU time
    assert float(qc["joules_per_decision.full_precision"]) == pytest.approx(0.04)
    assert qc["joules_per_decision_basis"] == "estimated"
    node = {kv.key: kv.value for kv in by["plant/line2/sol_control: node"].values}
    assert node["joules_per_decision_basis"] == "estimated" and "assumed" in node["energy_assumption"]
    root = st.to_msg(Time().to_msg(), "active", "", {}, 0, meter)  # root namespace: the old names
    assert [s.name for s in root.status] == ["sol_control: node", "sol_control: qc"]


def test_the_estimate_names_the_host_cpu(tmp_path):
    from sol_control.energy import cpu_model

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t: avx\n")
    assert cpu_model(info) == "Intel(R) Xeon(R) Processor"
    assert cpu_model(tmp_path / "missing") == "unknown CPU"
