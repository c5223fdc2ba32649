"""What `sol-control train` says about the bundle it wrote: the quantization check, the report (JSON
+ markdown) and the confusion matrices (PNG). Torch-free.

The check (anomalib's users' top complaint is an exported model that disagrees with the trained
one): a quantized graph is not written when its class accuracy on the validation images falls
below the fp32 graph's by >= 0.5 points AND >= 2 images; with fewer than 100 validation images the
difference is reported but not judged (2 images would be >= 2 points there).
"""
from __future__ import annotations

import json
from pathlib import Path

MAX_DROP_POINTS = 0.5
MAX_DROP_IMAGES = 2
MIN_JUDGED = 100  # validation images the check needs
REPORT_JSON, REPORT_MD, CONFUSION_PNG = "train_report.json", "train_report.md", "confusion.png"
COLUMNS = ("accuracy", "defect_recall", "false_reject_rate", "location_err_p50", "agreement_with_fp32",
           "acceptance", "decode_ms_p50")


def quantized_verdict(fp32: dict, quantized: dict, n: int) -> tuple[bool, str]:
    """(write the graph?, why) from the two validation rows (eval.score: accuracy over n images)."""
    images = round((fp32["accuracy"] - quantized["accuracy"]) * n)
    points = 100.0 * images / n
    where = f"{points:.1f} points ({images} of {n} images) below fp32" if images > 0 else "not below fp32"
    if n < MIN_JUDGED:
        return True, f"written, not judged: {where}; the check needs >= {MIN_JUDGED} validation images, this has {n}"
    if points >= MAX_DROP_POINTS and images >= MAX_DROP_IMAGES:
        return False, (f"refused: class accuracy {where} on your validation images (the limit: "
                       f"{MAX_DROP_POINTS} points and {MAX_DROP_IMAGES} images)")
    return True, f"written: {where}"


def fast_path_advice(written: dict[str, bool]) -> str | None:
    """What the node needs when a quantized graph was refused (None: nothing)."""
    if written.get("int8", True):
        return None
    if written.get("int4"):
        return "set decoding.fast_precision: int4 (this bundle has no int8 graph)"
    return ("this bundle has no quantized graph, so the node cannot build its fast path: see docs/TRAINING.md, "
            "'When the report says no'")


def confusion_png(rows: dict[str, dict], path: Path) -> Path:
    """One panel a plain precision: true classes (rows) x decided classes (columns, then "none")."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in rows if "+" not in n and "confusion" in rows[n]]
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 4.0), squeeze=False)
    for ax, name in zip(axes[0], names):
        conf = rows[name]["confusion"]
        ax.imshow(conf["counts"], cmap="Blues")
        ax.set_xticks(range(len(conf["cols"])), conf["cols"], rotation=60, ha="right", fontsize=7)
        ax.set_yticks(range(len(conf["rows"])), conf["rows"], fontsize=7)
        for i, row in enumerate(conf["counts"]):
            for j, count in enumerate(row):
                if count:
                    ax.text(j, i, str(count), ha="center", va="center", fontsize=7)
        ax.set_title(f"{name}{' (refused)' if rows[name].get('refused') else ''}", fontsize=9)
        ax.set_xlabel("decided", fontsize=8)
    axes[0][0].set_ylabel("true", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cell(v) -> str:
    return "–" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v)


def markdown(report: dict) -> str:
    d, t, e = report["data"], report["timing"], report["export"]
    lines = [f"# {report['name']}: training report", "",
             f"{report['mode']}; classes {', '.join(report['classes'])}.",
             f"Data: {d['images']} images from {d['folder']} ({d['with_position']} with a defect position); "
             f"{d['train']} to train, {d['validation']} to validate (stratified, seed {d['seed']}); "
             f"no part found in {d['no_part_found']}.",
             f"Time: {t['total_s']:.0f} s in all (training {t['train_s']:.0f} s, heads {t['heads_s']:.0f} s, "
             f"export and quantization {t['export_s']:.0f} s, validation and guesses {t['validate_s']:.0f} s).",
             f"Export: the fp32 graph gives the trained model's answer, token for token, on "
             f"{e['fp32_graph_vs_trained']['identical']} of {e['fp32_graph_vs_trained']['answers']} validation images "
             f"(largest logit difference {e['parity_max_abs_fused_fp32']:.1e}).", "",
             "## Validation", "", "| variant | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for name, row in report["validation"].items():
        lines.append(f"| {name} | " + " | ".join(_cell(row.get(c)) for c in COLUMNS) + " |")
    if report.get("before"):  # a fine-tune: where it started
        lines.append("| starting fp32 | " + " | ".join(_cell(report["before"].get(c)) for c in COLUMNS) + " |")
    lines += ["", f"![confusion matrices]({CONFUSION_PNG})", "", "## Quantized graphs", ""]
    lines += [f"- {p}: {v['reason']}" for p, v in report["quantized"].items()]
    if report.get("advice"):
        lines += ["", f"**The node:** {report['advice']}."]
    f = report["fast_path"]
    lines += ["", "## Decision time on this host", "",
              f"{f['path']} path ({f['precision']}, speculation {f['speculation']}, {f['backend']}): "
              f"median {f['decision_ms_p50']:.2f} ms, p99 {f['decision_ms_p99']:.2f} ms over {f['decisions']} "
              f"validation decisions, warm.", "",
              f"Draft heads: {report['heads']['how']}; acceptance on the validation images "
              f"{_cell(report['heads'].get('acceptance'))}.", ""]
    return "\n".join(lines)


def write_report(report: dict, out: Path) -> None:
    """train_report.json, train_report.md and confusion.png in the bundle folder `out`."""
    confusion_png(report["validation"], out / CONFUSION_PNG)
    (out / REPORT_JSON).write_text(json.dumps(report, indent=2) + "\n")
    (out / REPORT_MD).write_text(markdown(report))
