"""The nccl-tests table: header lines, one row per size, and the footer people grep for.

Column layout and number formats follow nccl-tests' ``src/common.cu`` so existing parsers and eyes
keep working; peers (``--compare``) add ``<peer> busbw`` and ``ratio`` columns to the right.

>>> print("\\n".join(header_lines()))
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
"""

from __future__ import annotations

# nccl-tests prints its own datatype names in the type column.
TYPE_NAMES = {"float32": "float", "float16": "half", "float64": "double", "bfloat16": "bfloat16",
              "int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32",
              "int64": "int64", "uint64": "uint64"}


def header_lines(peers: tuple[str, ...] = ()) -> list[str]:
    """The three header lines (variant titles, column names, units), nccl-tests' spacing."""
    extra_names = "".join(f"  {p[:6] + ' busbw':>12}  {'ratio':>5}" for p in peers)
    extra_units = "".join(f"  {'(GB/s)':>12}  {'':>5}" for _ in peers)
    lines = [
        "#" + " " * 62 + "out-of-place" + " " * 23 + "in-place",
        f"#{'size':>11}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}"
        + f"  {'time':>7}  {'algbw':>6}  {'busbw':>6} {'#wrong':>6}" * 2 + extra_names,
        f"#{'(B)':>11}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}"
        + f"  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>5}" * 2 + extra_units,
    ]
    return [line.rstrip() for line in lines]


def format_time(usec: float) -> str:
    """A time in microseconds, 7 wide, as nccl-tests prints it."""
    # nccl-tests drops decimals as times grow so the column stays 7 wide.
    if usec >= 10000.0:
        return f"{usec:7.0f}"
    return f"{usec:7.1f}" if usec >= 100.0 else f"{usec:7.2f}"


def _variant(cell: dict | None) -> str:
    if cell is None:
        return f"  {'N/A':>7}  {'N/A':>6}  {'N/A':>6}  {'N/A':>5}"
    wrong = "N/A" if cell.get("wrong") is None else str(cell["wrong"])
    return (f"  {format_time(cell['time_us'])}  {cell['algbw']:6.2f}  {cell['busbw']:6.2f}"
            f"  {wrong:>5}")


def headline_busbw(row: dict) -> float | None:
    """The busbw a row is plotted by: in place where it has that variant, else out of place."""
    cell = row.get("ip") or row.get("oop")
    return None if cell is None else cell["busbw"]


def matched_busbw(ours: dict, theirs: dict) -> tuple[float | None, float | None]:
    """Busbw of both rows in the same variant (in place preferred), for a fair ratio."""
    for variant in ("ip", "oop"):
        if ours.get(variant) and theirs.get(variant):
            return ours[variant]["busbw"], theirs[variant]["busbw"]
    return headline_busbw(ours), headline_busbw(theirs)


def format_row(row: dict, peer_rows: tuple[dict | None, ...] = ()) -> str:
    """One data row; ``peer_rows`` are the same size's rows from each peer (None: missing)."""
    text = (f"{row['size']:12d}  {row['count']:12d}  {TYPE_NAMES.get(row['type'], row['type']):>8}"
            f"  {row['redop']:>6}  {row['root']:6d}" + _variant(row.get("oop"))
            + _variant(row.get("ip")))
    for peer in peer_rows:
        mine, theirs = (None, None) if peer is None else matched_busbw(row, peer)
        if theirs is None:
            text += f"  {'N/A':>12}  {'N/A':>5}"
            continue
        ratio = f"{mine / theirs:5.2f}" if mine is not None and theirs > 0 else "  N/A"
        text += f"  {theirs:12.2f}  {ratio}"
    return text


def footer_lines(rows: list[dict]) -> list[str]:
    """``# Out of bounds values`` (summed #wrong) and ``# Avg bus bandwidth`` (mean of cells)."""
    cells = [row[v] for row in rows for v in ("oop", "ip") if row.get(v) is not None]
    wrong = sum(c["wrong"] or 0 for c in cells)
    avg = sum(c["busbw"] for c in cells) / len(cells) if cells else 0.0
    return [f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}",
            f"# Avg bus bandwidth    : {avg:g} ", "#"]


def total_wrong(rows: list[dict]) -> int:
    """Wrong elements over every row and variant (0 when checking was off)."""
    return sum((row[v] or {}).get("wrong") or 0 for row in rows for v in ("oop", "ip"))


def format_table(rows: list[dict], peers: dict[str, list[dict]] | None = None,
                 preamble: list[str] = ()) -> str:
    """The whole report: preamble, then per collective a header and its rows, then the footer."""
    peers = peers or {}
    names = tuple(peers)
    index = {name: {(r["collective"], r["size"]): r for r in peer_rows}
             for name, peer_rows in peers.items()}
    lines = list(preamble)
    for collective in dict.fromkeys(r["collective"] for r in rows):
        lines += ["#", f"# Collective: {collective}"] + header_lines(names)
        for row in (r for r in rows if r["collective"] == collective):
            key = (collective, row["size"])
            lines.append(format_row(row, tuple(index[n].get(key) for n in names)))
    return "\n".join(lines + footer_lines(rows)) + "\n"
