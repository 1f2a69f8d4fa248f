"""`AssertService`: a solution run against assert statements in the real sandbox, every test reported (passed,
failed with its error, or where and why the program ended before it), one batch run in parallel."""

from __future__ import annotations

import pytest

from drmas.config.sandbox import SandboxConfig
from drmas.tools import SandboxService
from drmas.tools.asserts import NOT_RUN, AssertRequest, AssertService

ADD = "def add(a, b):\n    return a + b\n"
TESTS = ("assert add(1, 2) == 3", "assert add(5, 0) == 5", "assert add(2, 2) == 4, 'two and two'")


def _assert_service(tmp_path_factory, timeout_s: float):
    config = SandboxConfig(timeout_s=timeout_s, cpu_s=5, memory_mb=256, max_processes=8, workers=4,
                           tmp_dir=str(tmp_path_factory.mktemp("asserts")))
    with SandboxService(config, where="test.sandbox") as sandbox:
        yield AssertService(sandbox)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """A wall clock no solution here runs into, however loaded the machine."""
    yield from _assert_service(tmp_path_factory, 30.0)


@pytest.fixture(scope="module")
def short_service(tmp_path_factory):
    """A wall clock of 1.5 s, for the solutions and tests that must run into it."""
    yield from _assert_service(tmp_path_factory, 1.5)


def _errors(report) -> list[str]:
    return [outcome.error for outcome in report.outcomes]


def test_which_asserts_pass(service):
    wrong = "def add(a, b):\n    return a - b\n"
    right, bad, missing = service.call_batch([
        AssertRequest(ADD, TESTS),
        AssertRequest(wrong, TESTS),
        AssertRequest(ADD, ("assert sub(1, 1) == 0", "x = 1\nassert add(x, x) == 2")),
    ])
    assert right.passed == [True, True, True] and right.all_passed and right.run.ok
    assert bad.passed == [False, True, False] and bad.n_passed == 1
    assert _errors(bad) == ["AssertionError", "", "AssertionError: two and two"]
    assert missing.passed == [False, True] and _errors(missing)[0] == "NameError: name 'sub' is not defined"


def test_tests_are_independent_and_main_blocks_do_not_run(service):
    solution = ADD + "if __name__ == '__main__':\n    print(add(int(input()), 1))\n"  # stdin is closed
    tests = ("y = 5\nassert add(y, 0) == 5", "assert 'y' not in dir()")
    report = service.call_batch([AssertRequest(solution, tests)])[0]
    assert report.passed == [True, True] and report.solution_error == ""


def test_a_solution_that_fails_to_load(short_service):
    syntax, hangs, exits = short_service.call_batch([
        AssertRequest("def add(a, b:\n    return a", TESTS),
        AssertRequest("while True:\n    pass\n" + ADD, TESTS),
        AssertRequest("import os\nos._exit(0)\n" + ADD, TESTS),
    ])
    assert syntax.solution_error.startswith("SyntaxError") and syntax.run.ok
    assert hangs.solution_error == "timeout: wall-clock limit of 1.5 s"
    assert exits.solution_error == "the solution ended the program while it was loaded"
    for report in (syntax, hangs, exits):
        assert report.passed == [False] * 3 and _errors(report) == [NOT_RUN] * 3


def test_a_test_that_hangs_or_crashes(short_service):
    tests = ("assert add(1, 2) == 3", "while True:\n    pass", "assert add(2, 2) == 4")
    crash = "import ctypes\nctypes.string_at(0)"
    whole_limit, own_limit, crashed = short_service.call_batch([
        AssertRequest(ADD, tests),
        AssertRequest(ADD, tests, per_test_timeout_s=0.3),
        AssertRequest(ADD, (tests[0], crash, tests[2])),
    ])
    assert whole_limit.passed == [True, False, False]
    assert _errors(whole_limit) == ["", "timeout: wall-clock limit of 1.5 s", NOT_RUN]
    assert own_limit.passed == [True, False, True] and _errors(own_limit)[1] == "timeout: over 0.3 s"
    assert crashed.passed == [True, False, False]
    assert _errors(crashed) == ["", "crashed: killed by SIGSEGV", NOT_RUN]


def test_a_garbled_results_file_passes_nothing(service):
    """Code that overwrites the runner's results after the fact gets nothing for it but 'not run'."""
    cheat = ADD + "import atexit\natexit.register(lambda: open('results.json', 'w').write('{garbage'))\n"
    report = service.call_batch([AssertRequest(cheat, TESTS)])[0]
    assert report.passed == [False] * 3
