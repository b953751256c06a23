"""A single self-contained HTML report: machine, tables, plots and topology, no network needed.

Images are embedded (the plot as base64 PNG, the topology drawing as inline SVG or base64 PNG), and
the page carries its own CSS, so the file can be mailed or attached to a bug report as is.
"""

from __future__ import annotations

import base64
import html
import os
import tempfile

from .plot import plot_result
from .report import flatten

_CSS = """body{font-family:sans-serif;margin:2em;max-width:1200px}
table{border-collapse:collapse;font-size:13px;margin:1em 0}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#eee}
pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:12px}img,svg{max-width:100%}"""


def _table(records: list[dict]) -> str:
    if not records:
        return "<p>no rows</p>"
    columns = list(dict.fromkeys(key for rec in records for key in rec))
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(rec.get(c)))}</td>"
                                    for c in columns) + "</tr>" for rec in records)
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(value) -> str:
    if value is None:
        return "N/A"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _image(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".svg"):
        text = data.decode()
        return text[text.find("<svg"):]  # inline, without the XML prolog
    return f'<img alt="figure" src="data:image/png;base64,{base64.b64encode(data).decode()}">'


def _plot_html(result: dict, tmp: str) -> str:
    path = os.path.join(tmp, "busbw.png")
    plot_result(result, path)
    return _image(path)


def _topology_html(topo, tmp: str) -> str:
    if topo is None:
        return "<p>no topology</p>"
    try:
        from ..topology import draw
    except ImportError:
        return "<p>topology drawing unavailable (collectx.topology.draw is missing)</p>"
    path = os.path.join(tmp, "topology.svg")
    try:
        draw(topo, path)
    except Exception as exc:  # a report must not fail because a drawing did
        return f"<p>topology drawing failed: {html.escape(str(exc))}</p>"
    return _image(path)


def page(title: str, body: str, css: str = "") -> str:
    """A whole self-contained HTML page: ``title``, the shared style plus ``css``, ``body``.

    >>> page("t", "<p>x</p>").startswith("<!DOCTYPE html><html><head><meta charset='utf-8'>")
    True
    """
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>{_CSS}{css}</style></head><body>{body}</body></html>\n")


def write_html(path: str, result: dict, table_text: str, topo=None) -> None:
    """Write the report page for ``result`` (with the text table and ``topo`` drawn) to ``path``."""
    machine = _table([{**result["machine"], **result["versions"]}])
    skipped = "".join(f"<li><b>{html.escape(name)}</b>: {html.escape(info['reason'])}"
                      + (f" &mdash; install: <code>{html.escape(info['hint'])}</code>"
                         if info.get("hint") else "") + "</li>"
                      for name, info in result.get("skipped", {}).items())
    with tempfile.TemporaryDirectory(prefix="collectx-perf-html-") as tmp:
        plot = _plot_html(result, tmp)
        drawing = _topology_html(topo, tmp)
    peers = "".join(f"<h3>{html.escape(name)}</h3>" + _table([flatten(r) for r in rows])
                    for name, rows in result["peers"].items())
    title = f"collectx-perf ({result.get('mode', 'measured')})"
    body = (f"<h1>{title}</h1><h2>Machine</h2>{machine}"
            + (f"<h2>Skipped peers</h2><ul>{skipped}</ul>" if skipped else "")
            + f"<h2>Bus bandwidth</h2>{plot}<h2>Table</h2><pre>{html.escape(table_text)}</pre>"
            f"<h2>Topology</h2>{drawing}<h2>All rows</h2>{peers}")
    with open(path, "w") as f:
        f.write(page(title, body))
