"""Draw docs/dataflow.svg, the README's picture of how data moves through an asynchronous drmas run.

Plain SVG text (no plotting library needed): run `python docs/dataflow.py` after changing the picture.
"""

from __future__ import annotations

from pathlib import Path

WIDTH, HEIGHT = 900, 415
FONT = "font-family='DejaVu Sans, Helvetica, Arial, sans-serif'"
COLOURS = {"rollout": "#e8f1fb", "buffer": "#fdf3e1", "learner": "#e9f6ec", "edge": "#334155"}


def box(x: int, y: int, w: int, h: int, fill: str, title: str, lines: list[str]) -> str:
    out = [f"<rect x='{x}' y='{y}' width='{w}' height='{h}' rx='10' fill='{fill}' stroke='#64748b'/>",
           f"<text x='{x + w / 2}' y='{y + 24}' text-anchor='middle' font-size='16' font-weight='bold' {FONT}>"
           f"{title}</text>"]
    for i, line in enumerate(lines):
        out.append(f"<text x='{x + w / 2}' y='{y + 46 + 17 * i}' text-anchor='middle' font-size='12.5' "
                   f"fill='#1f2937' {FONT}>{line}</text>")
    return "\n".join(out)


def arrow(x1: float, y1: float, x2: float, y2: float, label: str, dy: int = -8, dashed: bool = False,
          anchor: str = "middle") -> str:
    dash = " stroke-dasharray='6 4'" if dashed else ""
    lx, ly = (x1 + x2) / 2, (y1 + y2) / 2 + dy
    return (f"<line x1='{x1}' y1='{y1}' x2='{x2}' y2='{y2}' stroke='{COLOURS['edge']}' stroke-width='2'"
            f" marker-end='url(#head)'{dash}/>\n"
            f"<text x='{lx}' y='{ly}' text-anchor='{anchor}' font-size='12' fill='{COLOURS['edge']}' {FONT}>"
            f"{label}</text>")


def svg() -> str:
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{HEIGHT}' viewBox='0 0 {WIDTH} {HEIGHT}'>",
        "<defs><marker id='head' markerWidth='10' markerHeight='8' refX='9' refY='4' orient='auto'>"
        f"<path d='M0,0 L10,4 L0,8 z' fill='{COLOURS['edge']}'/></marker></defs>",
        f"<rect width='{WIDTH}' height='{HEIGHT}' fill='white'/>",
        f"<text x='{WIDTH / 2}' y='28' text-anchor='middle' font-size='17' font-weight='bold' {FONT}>"
        "drmas run (pipeline.mode=async): processes started by the local or the Ray launcher</text>",
        box(20, 70, 250, 170, COLOURS["rollout"], "drmas-rollout x N",
            ["task problems -> orchestra", "(solver, verifier, ... in turns)", "LLM engines: embedded or vLLM",
             "every agent call = one sample", "stamped with its weight version"]),
        box(335, 70, 230, 170, COLOURS["buffer"], "drmas-buffer",
            ["per-agent queues of whole", "GRPO groups", "admission under the", "staleness bound",
             "drops counted by reason"]),
        box(630, 70, 250, 170, COLOURS["learner"], "drmas-learner x models",
            ["one per trained model", "(optionally N FSDP2 ranks)", "Dr. MAS advantages per", "group AND agent",
             "decoupled PPO, AdamW"]),
        arrow(270, 120, 335, 120, "episodes", dy=-8),
        arrow(335, 165, 270, 165, "grants", dy=16),
        arrow(565, 120, 630, 120, "groups", dy=-8),
        arrow(630, 165, 565, 165, "versions", dy=16),
        "<path d='M755,240 C755,330 145,330 145,240' fill='none' stroke='#334155' stroke-width='2' "
        "marker-end='url(#head)'/>",
        f"<text x='450' y='333' text-anchor='middle' font-size='12.5' fill='{COLOURS['edge']}' {FONT}>"
        "new weights after every update (torch.distributed: gloo on CPU, NCCL on GPU; a relay chain of rollouts)"
        "</text>",
        f"<text x='450' y='372' text-anchor='middle' font-size='12.5' fill='#475569' {FONT}>"
        "samples: ZeroMQ (CURVE off loopback) | metrics: TensorBoard + metrics.jsonl per process | "
        "checkpoints: per learner</text>",
        f"<text x='450' y='394' text-anchor='middle' font-size='12.5' fill='#475569' {FONT}>"
        "pipeline.mode=colocated runs the same components in one process: rollout, update, weights into the "
        "engine, repeat</text>",
        "</svg>",
    ]
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    target = Path(__file__).resolve().parent / "dataflow.svg"
    target.write_text(svg())
    print(f"wrote {target}")
