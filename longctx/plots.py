"""Pictures the lessons draw. Every function takes an optional matplotlib Axes, returns the Axes it drew
on, labels axes with units, and never calls ``plt.show()``.

matplotlib is imported inside the functions so that ``import longctx.plots`` stays cheap.

A timeline is a list of ``longctx.engine.step_records.StepRecord``: the engine's ``history``, lesson 01's
napkin model (``longctx.lessons.stall``) or a recorded run (``StepRecord.at``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from longctx.engine.step_records import StepRecord, step_kind

# One colour per kind of iteration, used by every timeline in the course.
KIND_COLOURS = {"decode": "#1f77b4", "prefill": "#ff7f0e", "mixed": "#9467bd", "idle": "#cccccc"}


def _axes(ax):
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(8, 3))
    return ax


def plot_roofline(
    peak_flops_per_s: float, bandwidth_bytes_per_s: float, points: Sequence[tuple[str, float]] = (), ax=None,
    title: str | None = None,
):
    """Log-log roofline: attainable FLOP/s = min(peak, intensity × bandwidth).

    ``points`` are (label, arithmetic intensity in FLOPs/byte); each is placed on the roof.
    """
    import numpy as np

    if peak_flops_per_s <= 0 or bandwidth_bytes_per_s <= 0:
        raise ValueError("peak_flops_per_s and bandwidth_bytes_per_s must be positive")
    ax = _axes(ax)
    ridge = peak_flops_per_s / bandwidth_bytes_per_s
    intensities = [p[1] for p in points] + [ridge]
    lo, hi = min(intensities) / 4, max(intensities) * 4
    x = np.logspace(np.log10(lo), np.log10(hi), 200)
    roof = np.minimum(peak_flops_per_s, x * bandwidth_bytes_per_s)
    ax.loglog(x, roof / 1e12, color="black", lw=2)
    ax.axvline(ridge, color="grey", ls=":", lw=1)
    ax.annotate(f"ridge {ridge:.0f} FLOP/B", (ridge, peak_flops_per_s / 1e12), textcoords="offset points",
                xytext=(5, -15), fontsize=8, color="grey")
    for label, intensity in points:
        attained = min(peak_flops_per_s, intensity * bandwidth_bytes_per_s) / 1e12
        bound = "compute-bound" if intensity >= ridge else "memory-bound"
        ax.plot([intensity], [attained], "o", ms=8)
        ax.annotate(f"{label}\n({bound})", (intensity, attained), textcoords="offset points", xytext=(6, -28),
                    fontsize=8)
    ax.set_xlabel("arithmetic intensity (FLOPs per byte moved)")
    ax.set_ylabel("attainable TFLOP/s")
    if title:
        ax.set_title(title)
    return ax


def plot_iteration_timeline(iterations: Iterable[StepRecord], ax=None, title: str | None = None,
                            time_unit: str = "ms", origin_s: float = 0.0):
    """Each iteration as a bar along time, coloured by what it ran (decode, prefill, or both mixed).

    ``iterations``: anything with ``start_s``, ``duration_s``, ``num_prefill_tokens`` and
    ``num_decode_tokens`` (``StepRecord``s: ``engine.history``, a napkin timeline, ``StepRecord.at``);
    times are drawn relative to ``origin_s``.
    """
    scale = {"s": 1.0, "ms": 1e3}[time_unit]
    ax = _axes(ax)
    seen = set()
    for it in iterations:
        kind = step_kind(it)
        label = kind if kind not in seen else None
        seen.add(kind)
        ax.broken_barh([((it.start_s - origin_s) * scale, it.duration_s * scale)], (0, 1),
                       facecolors=KIND_COLOURS[kind], edgecolor="white", linewidth=0.5, label=label)
    ax.set_yticks([])
    ax.set_xlabel(f"time ({time_unit})")
    ax.legend(loc="upper right", fontsize=8, ncol=3)
    ax.set_ylim(0, 1.6)
    if title:
        ax.set_title(title)
    return ax


def plot_token_gaps(token_times_s: Sequence[float], ax=None, label: str | None = None, time_unit: str = "ms"):
    """Inter-token latency of one stream against the time each token arrived (a stall shows as a spike)."""
    import numpy as np

    scale = {"s": 1.0, "ms": 1e3}[time_unit]
    ax = _axes(ax)
    times = np.asarray(token_times_s, dtype=float)
    if times.size >= 2:
        gaps = np.diff(times)
        # A gap is drawn as a level over the interval it lasted, from the previous token to this one.
        ax.plot(times * scale, np.concatenate([gaps[:1], gaps]) * scale, marker=".", markevery=slice(1, None),
                drawstyle="steps-pre", label=label)
    ax.set_xlabel(f"time ({time_unit})")
    ax.set_ylabel(f"inter-token latency ({time_unit})")
    return ax


def plot_heatmap(values, row_labels: Sequence[str], col_labels: Sequence[str], ax=None, fmt: str = "{:.3g}",
                 colorbar_label: str = "", title: str | None = None, log: bool = True,
                 vmin: float | None = None, vmax: float | None = None, cell_text=None):
    """A table of numbers as a heatmap with each cell's value written in it (log colour scale by default).

    ``values[i][j]`` belongs to ``row_labels[i]`` and ``col_labels[j]``; ``fmt`` formats the cell text (or
    ``cell_text[i][j]``, when given, is written instead, e.g. ``"7/10"``) and ``colorbar_label`` names the
    quantity and its unit. ``vmin``/``vmax`` clip the linear colour scale (the
    cell text keeps the true value), e.g. so that one outlier does not wash out the rest.
    """
    import matplotlib.colors as mcolors
    import numpy as np

    data = np.asarray(values, dtype=float)
    if data.shape != (len(row_labels), len(col_labels)):
        raise ValueError(f"values has shape {data.shape}, labels say {(len(row_labels), len(col_labels))}")
    if cell_text is not None and np.shape(np.asarray(cell_text, dtype=object)) != data.shape:
        raise ValueError(
            f"cell_text has shape {np.shape(np.asarray(cell_text, dtype=object))}, values {data.shape}"
        )
    ax = _axes(ax)
    lo, hi = np.nanmin(data), np.nanmax(data)  # NaN cells (not measured) stay blank in the colour map
    norm = mcolors.LogNorm(vmin=lo, vmax=hi) if log and lo > 0 else None
    if norm is None and (vmin is not None or vmax is not None):
        norm = mcolors.Normalize(vmin=lo if vmin is None else vmin, vmax=hi if vmax is None else vmax)
    image = ax.imshow(data, cmap="viridis", norm=norm, aspect="auto")
    ax.set_xticks(range(len(col_labels)), labels=list(col_labels))
    ax.set_yticks(range(len(row_labels)), labels=list(row_labels))
    mid = np.sqrt(lo * hi) if isinstance(norm, mcolors.LogNorm) else (
        (norm.vmin + norm.vmax) / 2 if norm is not None else (lo + hi) / 2)
    for i in range(data.shape[0]):
        for j in range(data.shape[1]):
            text = fmt.format(data[i, j]) if cell_text is None else str(cell_text[i][j])
            ax.text(j, i, text, ha="center", va="center", fontsize=9,
                    color="white" if data[i, j] < mid else "black")
    ax.figure.colorbar(image, ax=ax, label=colorbar_label)
    if title:
        ax.set_title(title)
    return ax


def plot_stacked_bars(labels: Sequence[str], parts: dict[str, Sequence[float]], ax=None, ylabel: str = "",
                      title: str | None = None, colours: dict[str, str] | None = None, percent: bool = True):
    """One vertical bar per label, split into ``parts`` (name -> one value per label), bottom to top.

    With ``percent`` the values are fractions and each segment of at least 3 % is labelled with its share.
    """
    ax = _axes(ax)
    bottoms = [0.0] * len(labels)
    for name, values in parts.items():
        values = [float(v) for v in values]
        colour = (colours or {}).get(name)
        ax.bar(
            list(labels), [v * (100 if percent else 1) for v in values],
            bottom=[b * (100 if percent else 1) for b in bottoms], label=name, color=colour,
            edgecolor="white", width=0.6,
        )
        if percent:
            for i, v in enumerate(values):
                if v >= 0.03:
                    ax.text(i, (bottoms[i] + v / 2) * 100, f"{v:.0%}", ha="center", va="center", fontsize=9)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    ax.set_ylabel(ylabel)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=9)
    if title:
        ax.set_title(title)
    return ax


def plot_attention_share(tokens: Sequence[int], series: dict[str, Sequence[float]], ax=None,
                         title: str | None = None, styles: dict[str, str] | None = None):
    """Attention's share (fractions, drawn in %) against sequence length (log2 axis), one line per series."""
    ax = _axes(ax)
    for name, shares in series.items():
        ax.plot(list(tokens), [100 * float(s) for s in shares], (styles or {}).get(name, "o-"), label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(tokens), labels=[f"{t:,}" for t in tokens])
    ax.set_xlabel("sequence length T (tokens)")
    ax.set_ylabel("attention share of the forward pass (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    if title:
        ax.set_title(title)
    return ax
