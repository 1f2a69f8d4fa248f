"""Run a solution against tests in the sandbox and say which passed: the check of a coder/tester system.

`AssertService` is an orchestra service over a `SandboxService`: a batch of `AssertRequest` (solution code and test
statements, usually one ``assert`` each) -> one `AssertReport` per request, all run in parallel on the
sandbox's workers. Every test is reported: passed, failed with its error, or "not run" when the program
ended before reaching it (the solution hung, crashed or exhausted a limit: `report.run` says how).

This is containment, not proof: the solution runs in the same interpreter as the tests, so code written
to fool the check (patching `AssertionError`, writing ``results.json`` itself) can; a test passes only when
the runner saw it finish, so merely crashing or exiting early never passes anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from drmas.tools.outcome import SandboxRequest, SandboxResult
from drmas.tools.sandbox import SandboxService

RUNNER = Path(__file__).with_name("assert_runner.py").read_text()
NOT_RUN = "not run"
_RESULTS = "results.json"


@dataclass(frozen=True)
class AssertRequest:
    """`solution` (code defining what the tests use) and `tests` (statements run one by one against it);
    `per_test_timeout_s` fails a single slow test instead of letting it spend the whole run's limit."""

    solution: str
    tests: tuple[str, ...]
    per_test_timeout_s: Optional[float] = None


@dataclass
class TestOutcome:
    passed: bool
    error: str = ""  # "AssertionError: ...", "NameError: ...", "timeout: ...", or "not run"


@dataclass
class AssertReport:
    outcomes: list[TestOutcome]
    run: SandboxResult  # how the program ended (status "ok" even when tests failed: the runner catches them)
    solution_error: str = ""  # the solution itself failed to load (then no test ran)

    @property
    def passed(self) -> list[bool]:
        return [outcome.passed for outcome in self.outcomes]

    @property
    def n_passed(self) -> int:
        return sum(self.passed)

    @property
    def all_passed(self) -> bool:
        return bool(self.outcomes) and all(self.passed)


def assert_request(request: AssertRequest) -> SandboxRequest:
    """The sandbox program that runs `request` (the runner, the solution and the tests as files)."""
    tests = {"tests": list(request.tests), "per_test_timeout_s": request.per_test_timeout_s}
    return SandboxRequest(code=RUNNER, files={"solution.py": request.solution, "tests.json": json.dumps(tests)},
                          read_back=(_RESULTS,))


def read_report(result: SandboxResult, n_tests: int) -> AssertReport:
    """The report of one run of `assert_request`, from the results file the runner keeps. The first test it
    does not mention is the one the program was in when it ended (its error says how: "timeout: ..."), the
    later ones are "not run"; a results file the code garbled counts as none."""
    outcomes: list[TestOutcome] = []
    solution_error, loaded = "", False
    try:
        raw = json.loads(result.files.get(_RESULTS, ""))
        solution_error, loaded = str(raw["solution_error"]), raw["loaded"] is True
        for item in raw["tests"][:n_tests]:
            outcomes.append(TestOutcome(passed=item["passed"] is True, error=str(item.get("error", ""))))
    except (ValueError, TypeError, KeyError, AttributeError):
        outcomes = []
    ended = f"{result.status}: {result.detail}" if not result.ok else ""
    if not loaded and not solution_error:  # the solution never finished loading
        solution_error = ended or "the solution ended the program while it was loaded"
    elif loaded and len(outcomes) < n_tests:
        outcomes.append(TestOutcome(passed=False, error=ended or "the program ended during this test"))
    outcomes += [TestOutcome(passed=False, error=NOT_RUN) for _ in range(n_tests - len(outcomes))]
    return AssertReport(outcomes=outcomes, run=result, solution_error=solution_error)


class AssertService:
    """Orchestra service: a batch of AssertRequests -> their AssertReports, on `sandbox`'s workers."""

    def __init__(self, sandbox: SandboxService) -> None:
        self.sandbox = sandbox

    def call_batch(self, requests: Sequence[AssertRequest]) -> list[AssertReport]:
        for request in requests:
            if not isinstance(request, AssertRequest):
                raise TypeError(f"AssertService takes AssertRequests, got {type(request).__name__}")
        results = self.sandbox.call_batch([assert_request(request) for request in requests])
        return [read_report(result, len(request.tests)) for request, result in zip(requests, results)]
