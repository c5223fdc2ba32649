"""The demo's outputs: summary table, report.json and PNG plots (matplotlib, Agg)."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path


def _pct(x: float) -> str:
    return "   n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:6.2f}%"


def _ms(x: float) -> str:
    return "   n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:7.2f}"


def build_report(summary: dict, meta: dict, energy: dict | None = None) -> dict:
    """`energy`: sim.scoring.energy_table over the run's decisions (CPU ms and joules per decision)."""
    qc, grasp = summary.get("qc", {}), summary.get("grasp", {})
    return {
        **meta,
        "machine": machine(),
        "parts": summary["parts"],
        "qc_accuracy": summary["qc_accuracy"],
        "qc_accuracy_all_parts": summary["qc_accuracy_all"],
        "correct_accepts": qc.get("correct_accept", 0), "correct_rejects": qc.get("correct_reject", 0),
        "false_rejects": qc.get("false_reject", 0), "missed_defects": qc.get("missed_defect", 0),
        "manual_inspection": qc.get("manual", 0), "no_verdict": qc.get("no_verdict", 0),
        "unverified_passes": summary.get("unverified_passes", 0), "outage_diverted": summary.get("outage_diverted", 0),
        "late_verdicts": summary.get("late_verdicts", 0), "decisions_lost": summary.get("decisions_lost", 0),
        "grasp_outage_holds": summary.get("grasp_outage_holds", 0), "liveliness": summary.get("liveliness", {}),
        "respawns": summary.get("respawns", {}), "node_rss_mb": summary.get("node_rss", {}),
        "window_p99_ms": summary.get("window_p99_ms", {}), "p99_drift_ms": summary.get("p99_drift_ms", {}),
        "grasp_success": summary["grasp_success"],
        "grasp_attempts": grasp.get("success", 0) + grasp.get("failure", 0),
        "grasp_successes": grasp.get("success", 0), "grasp_holds": grasp.get("held", 0),
        "grasp_no_decision": grasp.get("no_decision", 0),
        "decisions": summary["decisions"],
        "deadline_hit_rate": summary["deadline_hit_rate"],
        "unlabelled_misses": summary["unlabelled_misses"],
        "fallback_rate": summary["fallback_rate"],
        "fast_decision_share": fast_decision_share(summary["latency_by_source"]),
        "p50_ms": summary["p50_ms"], "p99_ms": summary["p99_ms"],
        "e2e_p50_ms": summary["e2e_p50_ms"], "e2e_p99_ms": summary["e2e_p99_ms"],
        "measured_p50_ms": summary["measured_p50_ms"], "measured_p99_ms": summary["measured_p99_ms"],
        "sources": summary["sources"], "latency_by_source": summary["latency_by_source"],
        "stage_p50_ms": summary.get("stage_p50_ms", {}),
        "decision_timeouts": summary["decision_timeouts"], "ignored_decisions": summary["ignored_decisions"],
        "unmatched_verdicts": summary["unmatched_verdicts"], "realtime_lag_s": summary["realtime_lag_s"],
        "sim_time_s": summary["sim_time_s"],
        "policy": summary.get("policy", {}),
        "energy": energy or {},
        **({"chaos": summary["chaos"]} if "chaos" in summary else {}),
        **({"swap": summary["swap"]} if "swap" in summary else {}),
    }


def fast_decision_share(latency_by_source: dict) -> dict[str, float]:
    """{task: share of its decisions the fast path made} (not `deadline.fast_share`, a budget share)."""
    return {task: by.get("fast", {}).get("n", 0) / n
            for task, by in latency_by_source.items() if (n := sum(s["n"] for s in by.values()))}


def table(r: dict) -> str:
    rows = [
        ("parts inspected", f"{r['parts']:7d}"),
        ("QC accuracy (pass/reject verdicts)", _pct(r["qc_accuracy"])),
        ("QC accuracy (all parts)", _pct(r["qc_accuracy_all_parts"])),
        ("false rejects", f"{r['false_rejects']:7d}"),
        ("missed defects", f"{r['missed_defects']:7d}"),
        ("sent to manual inspection", f"{r['manual_inspection']:7d}"),
        ("diverted without a verdict (node alive)", f"{r['no_verdict']:7d}"),
        ("diverted during a node outage (not in accuracy)", f"{r['outage_diverted']:7d}"),
        ("passed without a pass verdict (must be 0)", f"{r['unverified_passes']:7d}"),
        ("grasp attempts", f"{r['grasp_attempts']:7d}"),
        ("grasp success", _pct(r["grasp_success"])),
        ("grasps held (safe default)", f"{r['grasp_holds']:7d}"),
        ("grasp decisions awaited during an outage", f"{r['grasp_outage_holds']:7d}"),
        ("decisions", f"{r['decisions']:7d}"),
        ("deadline hit rate", _pct(r["deadline_hit_rate"])),
        ("deadline misses not labelled", f"{r['unlabelled_misses']:7d}"),
        ("fallback rate (not fast)", _pct(r["fallback_rate"])),
        *((f"  {task} decisions from the fast path", _pct(x)) for task, x in sorted(r.get("fast_decision_share", {}).items())),
        ("latency p50 / p99 (ms, node)", f"{_ms(r['p50_ms'])} / {_ms(r['p99_ms'])}"),
        ("image→decision out p50 / p99 (ms, DDS)", f"{_ms(r['e2e_p50_ms'])} / {_ms(r['e2e_p99_ms'])}"),
        ("image→decision back p50 / p99 (ms)", f"{_ms(r['measured_p50_ms'])} / {_ms(r['measured_p99_ms'])}"),
    ]
    rows.append(("frames never answered (decisions lost)", f"{r['decisions_lost']:7d}"))
    rows += _process_rows(r)
    for task, by in sorted(r["latency_by_source"].items()):
        for src, s in sorted(by.items()):
            rows.append((f"  {task} {src} (n={s['n']}) p50 / p99 ms", f"{_ms(s['p50_ms'])} / {_ms(s['p99_ms'])}"))
    for task, st in sorted(r.get("stage_p50_ms", {}).items()):
        parts = [f"{k[:-3].replace('_', ' ')} {v:.1f}" for k, v in st.items()]
        rows.append((f"  {task} p50 ms by stage", ", ".join(parts)))
    rows += _swap_rows(r.get("swap", {}))
    rows += _policy_rows(r.get("policy", {})) + _energy_rows(r.get("energy", {}))
    rows += _machine_rows(r.get("machine", {}))
    w, vw = max(len(k) for k, _ in rows), max(19, *(len(v) for _, v in rows))
    line = "+" + "-" * (w + 2) + "+" + "-" * (vw + 2) + "+"
    body = [f"| {k:<{w}} | {v:>{vw}} |" for k, v in rows]
    return "\n".join([line, *body, line])


def machine() -> dict:
    """This host's CPU, cores, instruction-set flags and native kernel variant (native.isa.describe())."""
    from sol_control.native import isa

    return {**isa.describe(), "cores": os.cpu_count()}


def _machine_rows(m: dict) -> list[tuple[str, str]]:
    if not m:
        return []
    return [("CPU / native kernel variant", f"{m['cpu']}, {m['cores']} cores / {m['variant']}")]


WHY_CHARS = 60   # a refused swap's reason, in the table


def _swap_rows(s: dict) -> list[tuple[str, str]]:
    """`--swap-qc`: the swap's answer, then the QC figures of each bundle that made verdicts."""
    if not s:
        return []
    rows = [(f"QC bundle swap at {s['at_s']:g} s (sim)", "swapped" if s["successful"] else "refused")]
    if not s["successful"]:  # in full in report.json and on the line after the table
        why = s["reason"]
        rows.append(("  why", why if len(why) <= WHY_CHARS else why[:WHY_CHARS - 1] + "…"))
    if s["sent_t_s"] is not None:
        rows.append(("  asked at / answered at (sim s)", f"{s['sent_t_s']:.2f} / "
                     + (f"{s['done_t_s']:.2f}" if s["done_t_s"] is not None else "n/a")))
    for sha, b in s["by_bundle"].items():
        new = " (new)" if sha == s["to_sha256"] else ""
        rows.append((f"  bundle {sha[:12] or 'unnamed'}{new}: verdicts / right / wrong / manual / no outcome",
                     f"{b['verdicts']} / {b['right']} / {b['wrong']} / {b['manual']} / {b['no_outcome']}"))
        rows.append(("    QC accuracy / deadline hit rate", f"{_pct(b['accuracy']).strip()} / "
                                                            f"{_pct(b['deadline_hit_rate']).strip()}"))
    rows.append(("  QC decisions / parts / parts without a verdict", f"{s['qc_decisions']} / {s['parts']} / "
                                                                     f"{s['parts_without_verdict']}"))
    return rows


def _policy_rows(p: dict) -> list[tuple[str, str]]:
    if not p.get("routed"):
        return [("sent to full precision by policy", "      0")] if p else []
    rules = ", ".join(f"{k.removeprefix('policy_')} {v}" for k, v in sorted(p["by_rule"].items()))
    return [("sent to full precision by policy", f"{p['routed']} ({_pct(p['routed_share']).strip()})"),
            ("  by rule", rules),
            ("  of which safe defaults / fp32 overruled", f"{p['safe_defaults']} / {p['overruled']}"),
            ("  latency p50 / p99 (ms)", f"{_ms(p['latency_p50_ms'])} / {_ms(p['latency_p99_ms'])}")]


def _energy_rows(e: dict) -> list[tuple[str, str]]:
    if not e.get("by_task"):
        return []
    rows = [(f"CPU ms / joules per decision ({e['joules_per_decision_basis']})",
             f"{e['watts_per_busy_core']:.2f} W/core")]
    for task, by in sorted(e["by_task"].items()):
        for src, s in sorted(by.items()):
            if s["cpu_ms_per_decision"] == s["cpu_ms_per_decision"]:  # not NaN (oracle, watchdog)
                rows.append((f"  {task} {src} (n={s['decisions']})",
                             f"{s['cpu_ms_per_decision']:.2f} ms / {1000 * s['joules_per_decision']:.1f} mJ"))
    return rows


def _process_rows(r: dict) -> list[tuple[str, str]]:
    """Respawns, node memory, p99 drift and the chaos figures, where the run has them."""
    rows = []
    for task, exits in sorted(r.get("respawns", {}).items()):
        rows.append((f"  {task} node exits (respawned)", f"{len(exits):7d}"))
    for task, m in sorted(r.get("node_rss_mb", {}).items()):
        if m.get("samples"):
            rows.append((f"  {task} node RSS after warm-up -> end (MB)",
                         f"{m['after_warmup_mb']:.1f} -> {m['end_mb']:.1f} ({m['growth_mb']:+.2f})"))
    for task, d in sorted(r.get("p99_drift_ms", {}).items()):
        rows.append((f"  {task} p99 drift over 60 s windows (ms)", f"{d:+7.2f}"))
    for task, c in sorted(r.get("chaos", {}).items()):
        rows.append((f"chaos: {task} node SIGKILLed at (sim s)", f"{c['killed_t_s']}"))
        rows.append(("  after it: liveliness lost / back / first decision (s)",
                     f"{c['detected_s']:.2f} / {c['back_s']:.2f} / {c['recovery_s']:.2f}"))
    return rows


def write(out_dir: Path, report: dict, events: list[dict]) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(report, indent=1, default=float, allow_nan=True))
    with open(out_dir / "events.jsonl", "w") as f:
        for e in events:
            f.write(json.dumps(e, default=float) + "\n")
    return [out_dir / "report.json", out_dir / "events.jsonl", *plot(out_dir, events)]


def plot(out_dir: Path, events: list[dict]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    decisions = [e for e in events if e["type"] == "decision"]
    paths = []
    colours = {"fast": "tab:green", "full_precision": "tab:blue", "safe_default": "tab:red", "oracle": "tab:gray"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, task in zip(axes, ("qc", "grasp")):
        by = {}
        for d in decisions:
            if d["task"] == task:
                by.setdefault(d["source"], []).append(d["latency_ms"])
        for src, lat in sorted(by.items()):
            ax.hist(lat, bins=40, alpha=0.6, label=f"{src} (n={len(lat)})", color=colours.get(src))
        deadline = next((d["deadline_ms"] for d in decisions if d["task"] == task), None)
        if deadline and by:
            ax.axvline(deadline, color="k", ls="--", lw=1, label=f"deadline {deadline:g} ms")
        ax.set_title(f"{task} decision latency by source")
        ax.set_xlabel("latency from image stamp (ms)")
        ax.set_ylabel("decisions")
        if by:
            ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out_dir / "latency_histogram.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    for d in decisions:
        ax1.scatter(d["t_s"], d["latency_ms"], s=10, color=colours.get(d["source"], "k"),
                    marker="o" if d["task"] == "qc" else "^")
    for src, c in colours.items():
        ax1.scatter([], [], color=c, s=10, label=src)
    ax1.set_ylabel("latency (ms)")
    ax1.set_title("decisions over time (o QC, ^ grasp)")
    ax1.legend(fontsize=8, loc="upper right")
    good = {"correct_accept", "correct_reject", "success"}
    rows = {"qc_outcome": 1, "grasp_outcome": 0}
    for e in events:
        if e["type"] in rows:
            colour = ("tab:green" if e["outcome"] in good
                      else "tab:orange" if e["outcome"] in ("manual", "held")
                      else "tab:gray" if e["outcome"] in ("no_verdict", "no_decision", "outage_diverted")
                      else "tab:red")
            ax2.scatter(e["t_s"], rows[e["type"]], color=colour, s=14)
    ax2.set_yticks([0, 1], ["grasp", "QC part"])
    ax2.set_xlabel("sim time (s)")
    ax2.set_title("outcomes (green correct / success, orange manual / held, gray diverted undecided, red wrong / failed)")
    fig.tight_layout()
    paths.append(out_dir / "timeline.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
