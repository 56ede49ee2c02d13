"""The figures of the benchmarks: speed against quality, throughput against batch size, passes against grid side
(`ssd-bench peers`), and the strategies' colours and log-axis ticks the other benchmarks' figures share."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ssd_pipelines.plots import pyplot


def _family(label: str) -> str:
    return "ssd" if label.startswith("ssd") else label


COLOURS = {
    "ar": "black",
    "exact": "tab:cyan",
    "sjd": "tab:red",
    "sjd-pac": "tab:orange",
    "gsd": "tab:purple",
    "zipar": "tab:green",
    "mtp1d": "tab:brown",
}


def _style(label: str) -> dict:
    """Colour, marker and line style of a strategy: ssd in blues darkening with r, k_v = 2 dashed and square."""
    if _family(label) != "ssd":
        return {"color": COLOURS[label], "marker": "o", "linestyle": "-"}
    rounds = int(label.split("r=")[1][0])
    two_rows = "k_v=2" in label
    return {
        "color": _blues(0.5 + 0.16 * rounds),
        "marker": "s" if two_rows else "o",
        "linestyle": "--" if two_rows else "-",
    }


def _blues(shade: float):
    from matplotlib import colormaps  # only once a figure is being drawn: matplotlib is optional

    return colormaps["Blues"](shade)


def _plain_log_ticks(axis, values) -> None:
    """Ticks at `values`, written plainly, and no minor tick labels (log axes write 2x10^1 otherwise)."""
    from matplotlib.ticker import NullFormatter

    axis.set_ticks(values, [str(v) for v in values])
    axis.set_minor_formatter(NullFormatter())


def _place_labels(ax, points: list[tuple[str, float, float]]) -> None:
    """Label each point beside it, trying a few offsets so that labels do not overlap (in display pixels)."""
    ax.figure.canvas.draw()
    placed: list[tuple[float, float, float, float]] = []
    for text, x, y in points:
        px, py = ax.transData.transform((x, y))
        width, height = 6.2 * len(text), 12
        for dx, dy in ((7, 3), (7, -13), (-width - 7, 3), (-width - 7, -13), (7, 15), (7, -25), (-width / 2, 12)):
            box = (px + dx, py + dy, px + dx + width, py + dy + height)
            if not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in placed):
                break
        placed.append(box)
        ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset pixels", fontsize=9)


def speed_quality(rows: list[dict], out: Path) -> None:
    """Scatter: seconds per image at batch 1 against the Fréchet distance; filled markers are lossless."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 7), dpi=110)
    for row in rows:
        style = _style(row["label"])
        face = style["color"] if row["lossless"] else "white"
        ax.scatter(
            row["seconds_1"],
            row["frechet"],
            s=70,
            color=style["color"],
            facecolors=face,
            marker=style["marker"],
            linewidths=1.8,
            zorder=3,
        )
    ax.axhline(rows[0]["floor"], color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("seconds per image, batch 1 (log)")
    ax.set_ylabel("Fréchet distance to real renders (log; lower is better)")
    ax.text(
        0.01,
        rows[0]["floor"] * 1.03,
        "real renders (floor)",
        transform=ax.get_yaxis_transform(),
        fontsize=8,
        color="grey",
    )
    ax.set_title("Speed against quality on the reference model (filled: lossless)")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    _place_labels(ax, [(row["label"], row["seconds_1"], row["frechet"]) for row in rows])
    fig.savefig(out)
    plt.close(fig)


def throughput(per_batch: dict[str, dict[int, float]], out: Path) -> None:
    """Seconds per image against batch size, one line per strategy (measured until it fell behind AR)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(11, 6.5), dpi=110)
    for label, curve in per_batch.items():
        sizes = sorted(curve)
        width = 2.5 if label == "ar" else 1.3
        ax.plot(sizes, [curve[b] for b in sizes], markersize=4, linewidth=width, label=label, **_style(label))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("images per call (batch size)")
    ax.set_ylabel("seconds per image (log)")
    ax.set_title("Throughput against batch size (a line ends two sizes after it fell behind AR)")
    ax.grid(True, which="both", alpha=0.3)
    _plain_log_ticks(ax.xaxis, sorted({b for curve in per_batch.values() for b in curve}))
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def scaling(counts: dict[str, dict[str, dict[int, float]]], out: Path) -> None:
    """Forward passes against grid side n, one panel per draft setting, with n^2 and n for reference."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(counts), figsize=(14, 5.5), dpi=110, sharey=True)
    for ax, (setting, per_label) in zip(np.atleast_1d(axes), counts.items()):
        for label, curve in per_label.items():
            sides = sorted(curve)
            width = 2.5 if label == "ar" else 1.2
            ax.plot(sides, [curve[n] for n in sides], markersize=4, linewidth=width, label=label, **_style(label))
        sides = np.array(sorted(next(iter(per_label.values()))))
        ax.plot(sides, sides**2, ":", color="grey", linewidth=1)
        ax.plot(sides, sides, ":", color="grey", linewidth=1)
        ax.annotate("n²", (sides[-1], sides[-1] ** 2), fontsize=9, color="grey")
        ax.annotate("n", (sides[-1], sides[-1]), fontsize=9, color="grey")
        ax.set_xscale("log")
        ax.set_yscale("log")
        _plain_log_ticks(ax.xaxis, [int(n) for n in sides])
        ax.set_xlabel("grid side n (n x n codes)")
        ax.set_title(setting)
        ax.grid(True, which="both", alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("forward passes per image (log)")
    handles, labels = np.atleast_1d(axes)[0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0, 0.88, 1))
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(0.885, 0.5), fontsize=8)
    fig.savefig(out)
    plt.close(fig)
