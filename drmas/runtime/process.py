"""What every pipeline process entry point shares: its command line, logging, and a clean stop on signals.

A process of the pipeline runs until told to stop (SIGTERM from a launcher, Ctrl-C by hand). The first
signal only sets a flag that the process's loop checks between units of work, so sockets are closed,
threads joined and a learner's checkpoint written on the way out. A second signal interrupts at once, for
a process stuck where no flag is read.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Callable, Sequence

from drmas.config import ConfigError, read_config
from drmas.config.schema import DrmasConfig


class StopFlag:
    """Set by SIGTERM or SIGINT (or `set()`); loops poll it or `wait` on it instead of sleeping.

    The handlers are installed for the process (only the main thread can), and `restore()` puts back the ones
    they replaced, for a loop that runs inside a longer-lived program (the colocated run in a benchmark or a
    test)."""

    def __init__(self, install: bool = True) -> None:
        self._event = threading.Event()
        self.signal_name = ""
        self._replaced: dict = {}
        if install and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._replaced[sig] = signal.signal(sig, self._on_signal)

    def reclaim(self) -> None:
        """Install the handlers again, over any that a library installed since at the C level (Ray's core
        worker, started by `ray.init`, puts a handler on SIGTERM that aborts the process)."""
        for sig in self._replaced:
            signal.signal(sig, self._on_signal)

    def restore(self) -> None:
        """Put back the signal handlers this flag replaced."""
        for sig, handler in self._replaced.items():
            signal.signal(sig, handler)
        self._replaced = {}

    def _on_signal(self, signum: int, frame: object) -> None:
        if self._event.is_set():
            raise KeyboardInterrupt  # asked twice: give up on a clean stop
        self.signal_name = signal.Signals(signum).name
        self._event.set()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        """Sleep up to `timeout` seconds, waking at once when stopped; returns whether stopped."""
        return self._event.wait(timeout)

    @property
    def event(self) -> threading.Event:
        return self._event


_PR_SET_PDEATHSIG = 1  # prctl option (Linux): a signal this process gets when its parent dies


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send this process `sig` when its parent dies; False where prctl is not available.

    Used between fork and exec by the Ray host for the process it starts, and by a learner rank for its
    torchrun: torchrun starts every rank in a session of its own, so a SIGKILL of torchrun (or of the
    process group it leads) reaches none of them, and the ranks would live on holding their devices and
    ports, blocked in collectives with no peer. Note the kernel ties this to the parent *thread*: the
    parent must start the child from a thread that lives as long as it does."""
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig)) == 0
    except (OSError, AttributeError):  # not Linux (no libc.so.6 or no prctl)
        return False


def die_with_torchrun() -> None:
    """In a process started by torchrun (TORCHELASTIC_RUN_ID set): end when torchrun ends (see
    `die_with_parent`), also when torchrun died before this call. Elsewhere: nothing."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    parent = os.getppid()
    if die_with_parent() and parent == 1:  # re-parented already: torchrun is gone
        os.kill(os.getpid(), signal.SIGKILL)


def config_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", "-c", help="YAML config file (defaults are the schema's)")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. pipeline.max_staleness=2")
    return parser


def load_or_exit(prog: str, path: str | None, overrides: Sequence[str],
                 loader: Callable[[str | None, Sequence[str]], DrmasConfig] = read_config) -> DrmasConfig:
    """The config `loader` reads (the settings alone by default, `read_config`; `drmas.assembly.load_or_exit`
    loads the run's config, plugins imported and registered names checked), or exit 2 with the config error,
    before any socket or model is touched."""
    try:
        return loader(path, overrides)
    except ConfigError as exc:
        print(f"{prog}: config error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


LOG_FILE = "process.log"

# What turns off the progress bars of the libraries (tqdm's own, huggingface_hub's and transformers' weight
# loading and saving) in a process that imports them after reading it: a launcher's children get it.
QUIET_PROGRESS_ENV = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def progress_bars_on(wanted: bool = True) -> bool:
    """Whether to draw a progress bar: asked for (`logging.progress_bar`) and stderr is a terminal. Elsewhere (a
    launcher's child, output redirected to a file) every `\r` update of a bar becomes a line of the log."""
    return wanted and sys.stderr.isatty()


def quiet_progress_bars() -> None:
    """Turn the libraries' progress bars off when stderr is not a terminal: for what this process imports from
    here on, for its children (the environment), and for transformers when it is imported already."""
    if sys.stderr.isatty():
        return
    os.environ.update(QUIET_PROGRESS_ENV)
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def setup_logging(name: str) -> None:
    """One line per record, prefixed with the process name, so merged logs of many processes stay readable;
    no progress bars unless stderr is a terminal (they would break those lines up)."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S", stream=sys.stderr, force=True)
    quiet_progress_bars()


def add_log_file(directory: Path) -> Path:
    """Also write this process's log records, and the traceback of an exception that ends it, to
    `<directory>/process.log`: a process started by hand (or on another machine) has no launcher console,
    and a launcher's merged console is gone when it closes. Call it once the directory is claimed."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOG_FILE
    handler = logging.FileHandler(path, encoding="utf-8")
    root = logging.getLogger()
    if root.handlers:
        handler.setFormatter(root.handlers[0].formatter)
    root.addHandler(handler)
    previous = sys.excepthook

    def log_uncaught(exc_type, exc, tb) -> None:
        if not issubclass(exc_type, KeyboardInterrupt):
            handler.handle(logging.LogRecord("drmas", logging.CRITICAL, "", 0, "process ended by an uncaught "
                                             "exception", None, (exc_type, exc, tb)))
        previous(exc_type, exc, tb)

    sys.excepthook = log_uncaught
    return path
