"""``collectx-perf --simulate``: the sweep's table predicted for a machine you do not have.

Every number comes from :func:`collectx.planner.plan` (the function behind ``collectx plan``),
called per size with the same topology, GPUs and algorithm, so the two always agree. Beside each
prediction stand the allocation's cut bound (for allreduce: its reference, see the design notes)
and the ring baseline (``algo="ring"``) predicted on the same GPUs.
"""

from __future__ import annotations

from ..errors import CollectXError
from . import buffers
from .collectives import BENCHES, REDUCING, ROOTED
from .table import TYPE_NAMES, format_time


def load_allocation(source: str, gpus):
    """(topology, GPU ids) for ``--simulate SOURCE --gpus LIST`` (default: every GPU)."""
    from .. import topology
    topo = topology.load(source)
    return topo, tuple(topology.gpus(topo) if gpus is None else topology.resolve_gpus(topo, gpus))


def _cell(p) -> dict | None:
    pred = getattr(p, "predicted", None)
    if pred is None:
        return None
    return {"time_us": pred.time_us, "algbw": pred.algbw_GBps, "busbw": pred.busbw_GBps}


def simulate_rows(topo, gpu_ids, spec: dict, plan_fn=None, progress=None) -> list[dict]:
    """Predicted rows, one per collective and size (see the module docstring).

    ``plan_fn`` defaults to :func:`collectx.planner.plan` (tests pass a stand-in);
    ``progress(done, total, label)`` is called before each size.
    """
    if plan_fn is None:
        from ..planner import plan as plan_fn
    nranks, rows, total = len(gpu_ids), [], len(spec["collectives"]) * len(spec["sizes"])
    for c_index, collective in enumerate(spec["collectives"]):
        seen = set()
        for s_index, size in enumerate(spec["sizes"]):
            if progress is not None:
                progress(c_index * len(spec["sizes"]) + s_index, total, f"{collective} {size} B")
            lay = BENCHES[collective].layout(size, buffers.itemsize(spec["dtype"]), nranks)
            if lay.nbytes in seen:
                continue
            seen.add(lay.nbytes)
            rows.append(_predict(plan_fn, topo, gpu_ids, spec, collective, lay))
    if progress is not None:
        progress(total, total, "done")
    return rows


def _predict(plan_fn, topo, gpu_ids, spec, collective, lay) -> dict:
    root = spec["root"] if collective in ROOTED else -1
    kwargs = {"gpus": list(gpu_ids), "root": max(root, 0)}
    row = {"collective": collective, "size": lay.nbytes, "count": lay.count,
           "type": spec["dtype"], "redop": spec["op"] if collective in REDUCING else "none",
           "root": root, "nranks": len(gpu_ids), "algorithm": None, "predicted": None,
           "bound_busbw": None, "ceiling_busbw": None, "ring_busbw": None, "note": None}
    try:
        p = plan_fn(topo, collective, lay.nbytes, algo=spec.get("algo"), **kwargs)
    except CollectXError as exc:
        row["note"] = f"{type(exc).__name__}: {exc}"
        return row
    bound = getattr(p, "bound", None)
    row.update(algorithm=p.algorithm, predicted=_cell(p), efficiency=p.efficiency,
               bound_busbw=getattr(bound, "bound_busbw", None),
               ceiling_busbw=getattr(bound, "ceiling_busbw", None))
    idle = getattr(p, "no_communication", None)
    if idle:   # no bus to measure: busbw and the ring baseline would say nothing
        row["note"] = idle
        if row["predicted"]:
            row["predicted"]["busbw"] = None
        return row
    try:
        ring = _cell(plan_fn(topo, collective, lay.nbytes, algo="ring", **kwargs))
        row["ring_busbw"] = None if ring is None else ring["busbw"]
    except CollectXError as exc:  # no ring for this allocation or collective: shown as N/A
        row["note"] = f"ring: {exc}"
    return row


def _num(value, width: int) -> str:
    return f"{'N/A':>{width}}" if value is None else f"{value:{width}.2f}"


def format_simulated(rows: list[dict], source: str, gpu_ids) -> str:
    """The simulated table: nccl-tests' first columns, prediction, bound, ring baseline."""
    count = "1 GPU" if len(gpu_ids) == 1 else f"{len(gpu_ids)} GPUs"
    lines = [f"# collectx-perf --simulate {source}: {count} ({', '.join(gpu_ids)}),"
             " predicted by the link-model simulator via collectx.planner.plan",
             "# bound: the allocation's cut bound (allreduce: reference = best of reduce-scatter+"
             "allgather at the cut bound and tree packing); ratio = predicted / ring"]
    for collective in dict.fromkeys(r["collective"] for r in rows):
        lines += ["#", f"# Collective: {collective}",
                  "#" + " " * 62 + "predicted" + " " * 23 + "bound    ring",
                  f"#{'size':>11}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}  "
                  f"{'time':>7}  {'algbw':>6}  {'busbw':>6}  {'algorithm':>12}  {'busbw':>7}  "
                  f"{'busbw':>6}  {'ratio':>5}",
                  f"#{'(B)':>11}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}  {'(us)':>7}  "
                  f"{'(GB/s)':>6}  {'(GB/s)':>6}  {'':>12}  {'(GB/s)':>7}  {'(GB/s)':>6}"]
        lines += [_sim_row(r) for r in rows if r["collective"] == collective]
    cells = [r["predicted"]["busbw"] for r in rows
             if r["predicted"] and r["predicted"]["busbw"] is not None]
    avg = f"{sum(cells) / len(cells):g} (predicted)" if cells else "N/A (no size moves data)"
    lines += [f"# Avg bus bandwidth    : {avg}", "#"]
    notes = sorted({r["note"] for r in rows if r.get("note")})
    lines += [f"# note: {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _sim_row(r: dict) -> str:
    pred = r["predicted"] or {}
    time_us = pred.get("time_us")
    t_text = f"{'N/A':>7}" if time_us is None else format_time(time_us)
    ratio = None
    if pred and r["ring_busbw"]:
        ratio = pred["busbw"] / r["ring_busbw"]
    return (f"{r['size']:12d}  {r['count']:12d}  {TYPE_NAMES.get(r['type'], r['type']):>8}  "
            f"{r['redop']:>6}  {r['root']:6d}  {t_text}  {_num(pred.get('algbw'), 6)}"
            f"  {_num(pred.get('busbw'), 6)}  {(r['algorithm'] or 'N/A')[:12]:>12}  "
            f"{_num(r['bound_busbw'], 7)}  {_num(r['ring_busbw'], 6)}  {_num(ratio, 5)}")
