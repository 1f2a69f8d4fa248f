"""Agent-wise (Dr. MAS) vs global (GRPO) advantage normalisation on the same seed and config.

Runs the colocated trainer once per mode and reports, per agent, the mean of A^2 over the run (about 1
per agent under `agent`; mis-scaled under `global` when agents' rewards differ), and per model the
gradient-norm median, max and number of steps above 3x the running median.

    python bench/normalization.py --config configs/quickstart.yaml [key=value ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from drmas.colocated import ColocatedRun
from drmas.config import load_config


def run_mode(config: str, mode: str, overrides: list[str], out_root: Path) -> dict:
    cfg = load_config(config, [*overrides, f"algorithm.normalization={mode}",
                               f"trainer.output_dir={out_root / mode}", "logging.progress_bar=false",
                               "trainer.overwrite=true"])
    return ColocatedRun(cfg, log=lambda *_: None).run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/quickstart.yaml")
    parser.add_argument("--out", default="runs/normalization")
    parser.add_argument("--modes", default="agent,global")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    results = {m: run_mode(args.config, m, args.overrides, Path(args.out)) for m in args.modes.split(",")}
    print(json.dumps(results, indent=1))
    print(f"\n{'mode':<12}{'metric':<40}{'value':>24}")
    for mode, summary in results.items():
        for key, value in sorted(summary.items()):
            if key.startswith("advantage/"):
                print(f"{mode:<12}{key:<40}{value:>24.3f}")
            elif key.startswith("grad_norm/"):
                text = f"{value['median']:.3f} / {value['max']:.3f} / {int(value['spikes'])}"
                print(f"{mode:<12}{key + ' med/max/spikes':<40}{text:>24}")
        acc = summary.get("accuracy", {})
        print(f"{mode:<12}{'accuracy before -> after':<40}{acc.get('before', float('nan')):>14.3f} -> {acc.get('after', float('nan')):.3f}")


if __name__ == "__main__":
    main()
