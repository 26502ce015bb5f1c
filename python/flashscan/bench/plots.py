"""PNG plots beside results.md (matplotlib, when importable): attention TFLOP/s per seqlen and
per-call times of the other suites."""

from __future__ import annotations

import os
from typing import Any

from .report import shape_groups
from .results import Ceilings, Row


def write_plots(
    rows: list[Row], out_dir: str, meta: dict[str, Any], ceil: Ceilings | None = None
) -> tuple[list[str], str]:
    """PNG plots beside results.md; ([] and why) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        return [], f"matplotlib not importable ({type(exc).__name__}): plots skipped"
    made: list[str] = []
    device = meta.get("device", "")

    att = [r for r in rows if r.suite == "attention" and r.gpu_s and r.status == "ok"]
    if att:
        hds = sorted({r.params["headdim"] for r in att})
        impls = list(dict.fromkeys(r.impl for r in att))
        fig, axes = plt.subplots(1, len(hds), figsize=(6 * len(hds), 4.5), squeeze=False)
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for ax, hd in zip(axes[0], hds):
            for i, impl in enumerate(impls):
                for causal, style in ((False, "-"), (True, "--")):
                    pts = sorted(
                        (r.params["seqlen"], r.flops / r.gpu_s / 1e12)
                        for r in att
                        if r.impl == impl
                        and r.params["headdim"] == hd
                        and r.params["causal"] == causal
                    )
                    if pts:
                        ax.plot(
                            [p[0] for p in pts],
                            [p[1] for p in pts],
                            style,
                            marker="o",
                            color=colors[i % len(colors)],
                            label=f"{impl}{' causal' if causal else ''}",
                        )
            if ceil is not None and ceil.matmul_rate:
                ax.axhline(
                    ceil.matmul_rate / 1e12,
                    color="gray",
                    linestyle=":",
                    label="bf16 matmul ceiling (measured)",
                )
            ax.set_xscale("log", base=2)
            ax.set_xlabel("seqlen (batch·seqlen = 16384)")
            ax.set_ylabel("TFLOP/s (forward)")
            ax.set_title(f"attention fwd, headdim {hd}, bf16")
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle(f"{device}: higher is better")
        fig.tight_layout()
        name = "attention_tflops.png"
        fig.savefig(os.path.join(out_dir, name), dpi=120)
        plt.close(fig)
        made.append(name)

    for suite, column, ylabel, title in (
        ("scan", "main", "time per call (µs, log)", "selective scan fwd (GPU time; CPU for numpy)"),
        ("state_update", "wall", "wall time per call from Python (µs, log)", "state update"),
        (
            "latency",
            "wall",
            "wall time per call from Python (µs, log)",
            "attention at seqlen 60 (real-time)",
        ),
    ):
        groups = shape_groups(rows, suite)
        if not groups:
            continue
        impls = list(
            dict.fromkeys(
                r.impl
                for _, g in groups
                for r in g
                if r.status in ("ok", "anchor")
                and (r.main_s if column == "main" else (r.wall_s or r.cpu_s))
            )
        )
        width = 0.8 / max(1, len(impls))
        fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(groups) + 2), 4.5))
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        any_bar = False
        for i, impl in enumerate(impls):
            xs, ys = [], []
            for j, (_, g) in enumerate(groups):
                r = next((x for x in g if x.impl == impl), None)
                if r is None or r.status not in ("ok", "anchor"):
                    continue
                t = r.main_s if column == "main" else (r.wall_s or r.cpu_s)
                if t:
                    xs.append(j + (i - (len(impls) - 1) / 2) * width)
                    ys.append(t * 1e6)
            if xs:
                any_bar = True
                ax.bar(
                    xs,
                    ys,
                    width,
                    label=impl,
                    color=colors[i % len(colors)],
                    hatch="//" if "anchor" in impl else None,
                )
        if not any_bar:
            plt.close(fig)
            continue
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([s for s, _ in groups], rotation=20, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{device}: {title} (lower is better)")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        name = f"{suite}_time.png"
        fig.savefig(os.path.join(out_dir, name), dpi=120)
        plt.close(fig)
        made.append(name)
    return made, ""
