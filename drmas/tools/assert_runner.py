"""The program `drmas.tools.asserts` runs in the sandbox (as its main.py; standard library only): load
``solution.py``, run each test of ``tests.json`` against it, and rewrite ``results.json`` after every test,
so a test that hangs until the wall-clock limit still leaves the results of those before it.

Each test runs in a copy of the solution's namespace (names a test defines do not leak into the next);
the solution is loaded under the module name ``solution``, so its ``if __name__ == "__main__":`` demo
code does not run. A test passes when it runs to its end; anything it raises (AssertionError or another
exception, SystemExit included) fails it, and one over `per_test_timeout_s` (SIGALRM) fails it as a timeout.
"""

import json
import signal
import sys

MESSAGE_CHARS = 300


class TestTimeout(BaseException):
    """Raised in a test by its own alarm (a BaseException, so `except Exception` in the code does not eat it)."""


def _alarm(signum, frame):
    raise TestTimeout()


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:MESSAGE_CHARS]


def _save(report: dict) -> None:
    with open("results.json", "w") as handle:
        json.dump(report, handle)


def main() -> None:
    with open("tests.json") as handle:
        spec = json.load(handle)
    report = {"loaded": False, "solution_error": "", "tests": []}
    _save(report)
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        with open("solution.py") as handle:
            exec(compile(handle.read(), "solution.py", "exec"), namespace)
    except BaseException as exc:
        report["solution_error"] = _describe(exc)
        _save(report)
        return
    report["loaded"] = True
    _save(report)
    limit = spec.get("per_test_timeout_s")
    signal.signal(signal.SIGALRM, _alarm)
    for index, test in enumerate(spec["tests"]):
        outcome = {"passed": False, "error": ""}
        try:
            if limit:
                signal.setitimer(signal.ITIMER_REAL, limit)
            exec(compile(test, f"<test {index}>", "exec"), dict(namespace))
            outcome["passed"] = True
        except TestTimeout:
            outcome["error"] = f"timeout: over {limit:g} s"
        except BaseException as exc:
            outcome["error"] = _describe(exc)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        report["tests"].append(outcome)
        _save(report)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
