"""Pictures of a simulated schedule: a text timeline and a PNG timeline through
matplotlib (an optional dependency). The rank x step grid that errors carry lives
beside the IR (ir.step_grid), so every layer can raise a located error without
importing this one.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Tuple

from paddle_ext.pipeline.schedule.ir import Comm, GradSync, computes
from paddle_ext.pipeline.schedule.simulate import SimResult, Span

__all__ = ["text_timeline", "plot_timeline"]

def text_timeline(result: SimResult, width: Optional[int] = None) -> str:
    """Ranks as rows, simulated time as columns.

    Each compute action is drawn from its start to its end with its label at the left
    (`F0.3  B0.1      `; zero bubble's halves read `I0.1` and `W0.1`), `.` is idle time (waiting included) and `~` a transfer that
    costs time. By default one time unit is as wide as the longest F/B label plus one,
    so every label fits; `width` fits the whole timeline into that many columns instead,
    cutting labels short where needed.
    """
    spans = [s for row in result.spans for s in row]
    compute = [s for s in spans if computes(s.action)]
    makespan = float(result.makespan)
    if width is None:
        label = max((len(str(p)) for s in compute for p in computes(s.action)), default=4) + 1
        shortest = min((float(s.end - s.start) for s in compute if s.end > s.start), default=1.0)
        scale = label / shortest
    else:
        scale = max(1, width) / makespan
    ncols = max(1, int(round(makespan * scale)))
    rows = []
    for row in result.spans:
        line = ["."] * ncols
        for s in row:
            lo, hi = int(round(float(s.start) * scale)), int(round(float(s.end) * scale))
            if isinstance(s.action, Comm):
                transfer = float(result.costs.comm) * scale
                for c in range(max(lo, int(round(hi - transfer))), min(hi, ncols)):
                    line[c] = "~"
                continue
            if isinstance(s.action, GradSync) or hi <= lo:
                continue
            text = str(s.action).ljust(hi - lo)[: hi - lo]
            if hi - lo > 1 and len(str(s.action)) >= hi - lo:
                text = text[: hi - lo - 1] + " "  # keep neighbouring labels apart
            line[lo:hi] = list(text)
        rows.append("".join(line).rstrip())
    names = [f"rank {r}" for r in range(len(rows))]
    pad = max(len("time"), *(len(n) for n in names))
    tick = _nice_tick(8 / scale)  # a label every 8 or more columns
    ruler = [" "] * (ncols + 12)
    t = 0.0
    while t * scale <= ncols:
        col = int(round(t * scale))
        ruler[col: col + len(f"{t:g}")] = f"{t:g}"
        t += tick
    lines = ["time".ljust(pad) + " |" + "".join(ruler).rstrip()]
    lines += [n.ljust(pad) + " |" + row for n, row in zip(names, rows)]
    return "\n".join(lines)


def _nice_tick(at_least: float) -> float:
    step = 1.0
    while step < at_least:
        for mult in (2, 2.5, 2):
            step *= mult
            if step >= at_least:
                break
    return step


# F plain, B hatched; zero bubble's halves of B: I hatched the other way, W dotted.
_HATCH = {"F": None, "B": "///", "I": "\\\\\\", "W": "..."}


def _shade(rgb: Sequence[float], chunk: int, vpp: int) -> Tuple[float, float, float]:
    # Later chunks are mixed with white, so a chunk reads as a lighter band of the same
    # micro-batch colours.
    mix = 0.55 * chunk / max(1, vpp - 1) if vpp > 1 else 0.0
    return tuple(c + (1.0 - c) * mix for c in rgb[:3])  # type: ignore[return-value]


def plot_timeline(result: SimResult, path: str, title: Optional[str] = None) -> str:
    """Writes a PNG (or any format matplotlib infers from `path`) of the timeline.

    F, B, I and W are coloured by micro-batch (B hatched, I hatched the other way, W
    dotted and drawn lower), later chunks lighter; transfers that cost time are thin
    grey bars. Returns `path`.
    """
    plt, patch = _pyplot()
    sched = result.schedule
    fig_w = min(40.0, max(8.0, 2.0 + float(result.makespan) * 0.25))
    fig, ax = plt.subplots(figsize=(fig_w, 1.4 + 0.55 * sched.pp))
    colour = _microbatch_colours(plt, sched.microbatches)
    for r, row in enumerate(result.spans):
        for s in row:
            _draw_span(ax, result, s, sched.pp - 1 - r, colour, fig_w)
    _decorate(ax, result, title, patch)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _pyplot() -> Tuple[Any, Any]:
    """matplotlib.pyplot (on the Agg backend unless one is chosen) and its Patch class."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as err:  # optional dependency
        raise ImportError(
            "plotting a schedule needs matplotlib, which is not installed: "
            "pip install matplotlib (or pip install 'paddle-ext[plot]')") from err
    return plt, Patch


def _microbatch_colours(plt: Any, microbatches: int) -> Callable[[int], Sequence[float]]:
    # tab10 keeps ten micro-batches clearly apart; beyond that a smooth map is all we can do.
    many = microbatches > 10
    cmap = plt.get_cmap("turbo" if many else "tab10")

    def colour(mb: int) -> Sequence[float]:
        return cmap(0.05 + 0.9 * mb / (microbatches - 1)) if many else cmap(mb)
    return colour


def _draw_span(ax: Any, result: SimResult, s: Span, y: int, colour: Callable[[int], Sequence[float]],
               fig_w: float) -> None:
    """One span at height y: a transfer's thin bar, or a compute's bar per part
    (an FB splits its bar in two halves) with a label per part where it fits."""
    sched, makespan = result.schedule, float(result.makespan)
    start, dur = float(s.start), float(s.end - s.start)
    if isinstance(s.action, Comm):
        comm = float(result.costs.comm)
        if comm > 0:
            ax.broken_barh([(float(s.end) - comm, comm)], (y - 0.45, 0.12), facecolors="0.6")
        return
    parts = computes(s.action)
    if not parts or dur <= 0:
        return
    n = len(parts)
    for k, p in enumerate(parts):  # an FB splits its bar in two halves
        h = 0.8 / n
        kind = type(p).__name__
        # W bars are lower: they hold a rank without being on the critical path.
        top = h * (0.55 if kind == "W" else 1.0)
        ax.broken_barh([(start, dur)], (y - 0.4 + k * h, top),
                       facecolors=[_shade(colour(p.mb), p.chunk, sched.vpp)],
                       edgecolor="black", linewidth=0.4, hatch=_HATCH[kind])
    width_pt = dur * 72 * 0.85 * fig_w / makespan
    for k, p in enumerate(parts):  # an F&B gets one label per half
        if width_pt > 3.2 * len(str(p)):  # fits
            h = 0.8 / n * (0.55 if type(p).__name__ == "W" else 1.0)
            ax.text(start + dur / 2, y - 0.4 + k * 0.8 / n + h / 2, str(p),
                    ha="center", va="center", fontsize=5 if n == 1 else 4.5,
                    bbox={"facecolor": "white", "alpha": 0.6, "pad": 0.3,
                          "linewidth": 0} if type(p).__name__ in "IW" else None)


def _decorate(ax: Any, result: SimResult, title: Optional[str], patch: Any) -> None:
    """Rank labels, the time axis, the title (kind, shape, makespan, bubble) and the legend."""
    sched, makespan = result.schedule, float(result.makespan)
    ax.set_yticks(range(sched.pp))
    ax.set_yticklabels([f"rank {sched.pp - 1 - y}" for y in range(sched.pp)])
    ax.set_xlim(0, makespan)
    ax.set_xlabel("seconds (measured)" if result.mode == "measured" else "simulated time")
    bubble = float(result.bubble_overall)
    place = "" if sched.placement == "interleaved" else f" placement={sched.placement}"
    ax.set_title(title or f"{sched.kind}: pp={sched.pp} vpp={sched.vpp}{place} "
                 f"microbatches={sched.microbatches}, makespan {makespan:g}, "
                 f"bubble {bubble:.1%}")
    kinds = {type(p).__name__ for acts in sched.ranks for a in acts for p in computes(a)}
    names = {"F": "F", "B": "B", "I": "I: input grad", "W": "W: weight grads (low bar)"}
    handles = [patch(facecolor="0.5", hatch=_HATCH[k], label=names[k])
               for k in ("F", "B", "I", "W") if k in kinds or k == "F"]
    handles.append(patch(facecolor="0.85", label="lighter = later chunk" + (
        " (chunk 1: the V's way back)" if sched.placement == "v" else "")))
    if any(len(computes(a)) == 2 for acts in sched.ranks for a in acts):
        handles.append(patch(facecolor="white", edgecolor="black",
                             label="F&B: one overlapped step (F lower half, B upper)"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.3), fontsize=7,
              ncol=len(handles), frameon=False)
