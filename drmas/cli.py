"""The `drmas` command line: `drmas run`, `drmas eval`, `drmas retriever serve`, `drmas config show|keys`,
`drmas keys`, `drmas rollouts add|remove`, `drmas new-system`."""

from __future__ import annotations

import argparse
import sys

from drmas.config import ConfigError, iter_help, to_yaml
from drmas.runtime.process import quiet_progress_bars


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help="YAML config file (defaults are the schema's)")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. trainer.steps=5")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="drmas", description="Dr. MAS: stable RL for multi-agent LLM systems")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run", help="train: in this process (pipeline.mode=colocated) or as buffer, learner and rollout "
        "processes (pipeline.mode=async)")
    _add_config_args(run)
    cfg = sub.add_parser("config", help="inspect configs")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True)
    show = cfg_sub.add_parser("show", help="print the resolved config")
    _add_config_args(show)
    keys = cfg_sub.add_parser("keys", help="list every config key with its default and help text: with --config or "
                              "overrides, the settings of the system and task they choose (plugins' included); "
                              "without, or with --all, those of every registered system and task")
    _add_config_args(keys)
    keys.add_argument("--all", action="store_true", help="the settings of every registered system and task")
    from drmas.evaluation.command import add_parser as add_eval_parser
    from drmas.launch.elastic import add_parser as add_rollouts_parser
    from drmas.retrieval.cli import add_parser as add_retriever_parser
    from drmas.runtime.keys import add_parser as add_keys_parser
    from drmas.scaffold import add_parser as add_new_system_parser

    add_eval_parser(sub)
    add_new_system_parser(sub)
    add_retriever_parser(sub)
    add_keys_parser(sub)
    add_rollouts_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # output to a file or a pipe: no bars (each update would be a line); before the parser, whose sub-commands
    # import tqdm, which reads its environment once, at import
    quiet_progress_bars()
    args = build_parser().parse_args(argv)
    if getattr(args, "func", None) is not None:  # sub-commands that own their arguments
        return args.func(args)
    try:
        if args.command == "config" and args.config_command == "keys":
            return _print_keys(args)
        from drmas.assembly import load_config

        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"drmas: config error: {exc}", file=sys.stderr)
        return 2
    if args.command == "config":
        print(to_yaml(cfg), end="")
        return 0
    return _run(cfg)


def _print_keys(args: argparse.Namespace) -> int:
    from drmas.assembly import load_plugins
    from drmas.config.load import chosen_names, read_layers

    load_plugins(args.config, args.overrides)  # their systems' and tasks' settings are listed too
    chosen = args.config or args.overrides
    only = chosen_names(read_layers(args.config, args.overrides)) if chosen and not args.all else None
    for key, default, text in iter_help(only=only):
        print(f"{key} = {default}\n    {text}")
    if only is not None:
        print(f"\n(system.* and task.* of system {only['system']!r} and task {only['task']!r}, as chosen; every "
              "registered one's: drmas config keys --all)")
    return 0


def _run(cfg) -> int:
    if cfg.pipeline.mode == "async":
        from drmas.launch import launch

        return launch(cfg)
    from drmas.colocated import ColocatedRun
    from drmas.episodes.failures import EpisodeFailures
    from drmas.runtime.report import print_summary

    try:
        run = ColocatedRun(cfg)
    except (FileNotFoundError, ValueError) as exc:
        print(f"drmas: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C while the models are built: nothing to save yet
        print("drmas: interrupted before training started", file=sys.stderr)
        return 130
    try:
        summary = run.run()  # a signal stops it cleanly (saved, exit 130); a second one lands here
    except KeyboardInterrupt:
        print(f"drmas: stopped at once by a second signal, at step {run.step}; the last complete checkpoint is "
              f"{'none' if run.saved_step is None else f'step {run.saved_step}'}", file=sys.stderr)
        return 130
    except EpisodeFailures as exc:  # a plugin fails every episode (one failing episode is only dropped)
        print(f"drmas: {exc}; the last complete checkpoint is "
              f"{'none' if run.saved_step is None else f'step {run.saved_step}'}", file=sys.stderr)
        return 1
    print_summary(summary, cfg)
    # a stopped run did not reach trainer.steps: like the async launcher, say so to a scheduler or a `&&` chain
    return 130 if "stopped" in summary else 0


if __name__ == "__main__":
    sys.exit(main())
