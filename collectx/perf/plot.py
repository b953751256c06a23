"""Bus bandwidth against message size, one line per peer (or per plan when simulated).

One panel per collective, log-scaled size axis; in simulated mode the cut bound is a dashed line.
Uses matplotlib's Agg backend, so it works without a display.
"""

from __future__ import annotations

from .table import headline_busbw


def size_label(nbytes: float, _pos=None) -> str:
    """Bytes as the axis shows them: 8, 1K, 64M, 1G.

    >>> size_label(8), size_label(1024), size_label(64 << 20)
    ('8', '1K', '64M')
    """
    for shift, suffix in ((30, "G"), (20, "M"), (10, "K")):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):g}{suffix}"
    return f"{nbytes:g}"


def _series(rows: list[dict], collective: str, value) -> tuple[list, list]:
    points = [(r["size"], value(r)) for r in rows if r["collective"] == collective]
    points = [(s, v) for s, v in points if v is not None]
    return [s for s, _ in points], [v for _, v in points]


def _measured_lines(result: dict, collective: str):
    for peer, rows in result["peers"].items():
        yield peer, _series(rows, collective, headline_busbw), "-"


def _simulated_lines(result: dict, collective: str):
    rows = result["peers"]["collectx"]
    yield "collectx (predicted)", _series(
        rows, collective, lambda r: r["predicted"] and r["predicted"]["busbw"]), "-"
    yield "ring baseline (predicted)", _series(rows, collective, lambda r: r["ring_busbw"]), "-"
    label = "reference bound" if collective == "allreduce" else "cut bound"
    yield label, _series(rows, collective, lambda r: r["bound_busbw"]), "--"


def plot_result(result: dict, path: str) -> None:
    """Write the busbw-vs-size figure of ``result`` to ``path`` (.png or .svg)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    collectives = list(dict.fromkeys(r["collective"] for r in result["peers"]["collectx"]))
    ncols = 1 if len(collectives) == 1 else 2
    nrows = (len(collectives) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(7 * ncols, 4 * nrows), squeeze=False)
    lines = _simulated_lines if result.get("mode") == "simulated" else _measured_lines
    for ax, collective in zip(axes.flat, collectives):
        for label, (xs, ys), style in lines(result, collective):
            if xs:
                ax.plot(xs, ys, style, marker="o" if style == "-" else None, markersize=3,
                        label=label)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(size_label))
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"{collective} ({result['options'].get('dtype', '')}, "
                     f"{result.get('nranks', '?')} ranks)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(collectives):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
