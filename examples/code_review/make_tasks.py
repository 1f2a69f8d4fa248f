"""Write tasks.jsonl, the code_review example's problems: short Python functions, each with a reference solution,
hidden reference tests and a deliberately wrong solution.

    python examples/code_review/make_tasks.py            # rewrite tasks.jsonl beside this file
    python examples/code_review/make_tasks.py --verify   # and check every task in the sandbox first

Each task below is a signature, a docstring, the reference body, a wrong body (a plausible bug: an off-by-one,
a missed case, the wrong operator) and the inputs of its hidden tests. The expected outputs are computed here by
running the reference (code written in this file, not by a model); every hidden test is then
``assert f(args) == expected``. `--verify` runs each reference and each wrong solution against the hidden tests
in drmas' sandbox and refuses to write a file where a reference fails a test or a wrong solution passes them all
(tests/test_examples.py checks the committed file the same way). Every fifth task is held out (split "test").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TASKS_FILE = HERE / "tasks.jsonl"
TEST_EVERY = 5  # every fifth task is held out

# (signature, docstring, reference body, wrong body, example args, hidden-test args); bodies are indented by 4
TASKS = [
    ("add(a: int, b: int) -> int", "Return the sum of a and b.",
     "return a + b", "return a - b", (2, 3), [(1, 2), (0, 0), (-4, 9), (10, -10), (123, 456)]),
    ("is_even(n: int) -> bool", "Return True if n is even, else False.",
     "return n % 2 == 0", "return n % 2 == 1", (4,), [(0,), (1,), (7,), (10,), (-3,)]),
    ("square(x: int) -> int", "Return x multiplied by itself.",
     "return x * x", "return x * 2", (3,), [(0,), (1,), (2,), (5,), (-4,)]),
    ("max_of_three(a: int, b: int, c: int) -> int", "Return the largest of a, b and c.",
     "return max(a, b, c)", "return max(a, b)", (1, 7, 3), [(1, 2, 3), (3, 2, 1), (5, 5, 5), (-1, -7, -3), (0, 9, 4)]),
    ("reverse_string(s: str) -> str", "Return s with its characters in reverse order.",
     "return s[::-1]", "return s[:-1][::-1]", ("abc",), [("",), ("a",), ("hello",), ("ab cd",), ("racecar",)]),
    ("count_vowels(s: str) -> int", "Return how many characters of s are vowels (a, e, i, o, u, in either case).",
     "return sum(1 for c in s if c in 'aeiouAEIOU')", "return sum(1 for c in s if c in 'aeiou')", ("banana",),
     [("",), ("xyz",), ("Apple",), ("EDUCATION",), ("Queue up",)]),
    ("factorial(n: int) -> int", "Return n! (the product 1 * 2 * ... * n); factorial(0) is 1.",
     "result = 1\n    for k in range(2, n + 1):\n        result *= k\n    return result",
     "result = 1\n    for k in range(2, n):\n        result *= k\n    return result", (4,), [(0,), (1,), (3,), (5,), (7,)]),
    ("fibonacci(n: int) -> int", "Return the n-th Fibonacci number, where fibonacci(0) is 0 and fibonacci(1) is 1.",
     "a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
     "a, b = 1, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a", (6,), [(0,), (1,), (2,), (5,), (10,)]),
    ("gcd(a: int, b: int) -> int", "Return the greatest common divisor of the positive integers a and b.",
     "while b:\n        a, b = b, a % b\n    return a", "return min(a, b)", (12, 18),
     [(7, 7), (8, 12), (9, 28), (100, 75), (17, 5)]),
    ("is_palindrome(s: str) -> bool", "Return True if s reads the same forwards and backwards.",
     "return s == s[::-1]", "return len(s) < 2 or s[0] == s[-1]", ("level",),
     [("",), ("a",), ("abba",), ("abca",), ("abcdba",)]),
    ("sum_list(xs: list) -> int", "Return the sum of the numbers in xs (0 for an empty list).",
     "return sum(xs)", "return sum(xs[1:])", ([1, 2, 3],), [([],), ([5],), ([1, 2, 3, 4],), ([-1, 1],), ([10, 20],)]),
    ("count_char(s: str, c: str) -> int", "Return how many times the character c occurs in s (case-sensitive).",
     "return s.count(c)", "return s.lower().count(c.lower())", ("banana", "a"),
     [("Abracadabra", "a"), ("Abracadabra", "A"), ("", "x"), ("mississippi", "s"), ("AaAa", "a")]),
    ("clamp(x: int, lo: int, hi: int) -> int", "Return x limited to the range lo..hi (lo <= hi).",
     "return max(lo, min(x, hi))", "return max(lo, x)", (15, 0, 10), [(5, 0, 10), (-3, 0, 10), (12, 0, 10), (0, 0, 0), (7, 7, 9)]),
    ("abs_diff(a: int, b: int) -> int", "Return the absolute difference between a and b.",
     "return abs(a - b)", "return a - b", (3, 8), [(5, 2), (2, 5), (0, 0), (-3, 4), (10, 10)]),
    ("last_element(xs: list) -> object", "Return the last element of the non-empty list xs.",
     "return xs[-1]", "return xs[0]", ([1, 2, 3],), [([7],), ([1, 2],), (["a", "b", "c"],), ([0, 0, 9],)]),
    ("second_largest(xs: list) -> int", "Return the second largest distinct value in xs (xs has at least two distinct values).",
     "return sorted(set(xs))[-2]", "return sorted(xs)[-2]", ([3, 1, 2],),
     [([1, 2],), ([5, 5, 4],), ([9, 1, 9, 3],), ([-1, -2, -3],), ([2, 8, 8, 8],)]),
    ("remove_duplicates(xs: list) -> list", "Return xs without repeated values, keeping the first occurrence of each, in order.",
     "seen = []\n    for x in xs:\n        if x not in seen:\n            seen.append(x)\n    return seen",
     "return sorted(set(xs))", ([3, 1, 3, 2],), [([],), ([1, 1, 1],), ([3, 2, 1, 2],), ([5, 4, 5, 4],), ([1, 2, 3],)]),
    ("flatten(xss: list) -> list", "Return the elements of the lists in xss, one list after another, in one list.",
     "return [x for xs in xss for x in xs]", "return [xs[0] for xs in xss if xs]", ([[1, 2], [3]],),
     [([],), ([[1]],), ([[1, 2], [3, 4]],), ([[], [5, 6]],), ([[7], [], [8, 9]],)]),
    ("word_count(s: str) -> int", "Return the number of words in s (words are separated by whitespace).",
     "return len(s.split())", "return s.count(' ') + 1", ("the quick fox",),
     [("",), ("one",), ("two words",), ("  spaced   out  ",), ("a b c d",)]),
    ("is_prime(n: int) -> bool", "Return True if n is a prime number.",
     "if n < 2:\n        return False\n    return all(n % d for d in range(2, int(n ** 0.5) + 1))",
     "return all(n % d for d in range(2, n))", (7,), [(0,), (1,), (2,), (9,), (13,), (25,)]),
    ("digit_sum(n: int) -> int", "Return the sum of the decimal digits of the non-negative integer n.",
     "return sum(int(d) for d in str(n))", "return sum(int(d) for d in str(n)[:-1])", (123,),
     [(0,), (5,), (99,), (1001,), (4567,)]),
    ("count_positive(xs: list) -> int", "Return how many numbers in xs are greater than zero.",
     "return sum(1 for x in xs if x > 0)", "return sum(1 for x in xs if x >= 0)", ([1, -2, 3],),
     [([],), ([0],), ([1, 2, 3],), ([-1, 0, 1],), ([0, 0, 5],)]),
    ("running_sum(xs: list) -> list", "Return the list of running totals of xs: element i is xs[0] + ... + xs[i].",
     "out, total = [], 0\n    for x in xs:\n        total += x\n        out.append(total)\n    return out",
     "out, total = [], 0\n    for x in xs:\n        out.append(total)\n        total += x\n    return out", ([1, 2, 3],),
     [([],), ([5],), ([1, 1, 1],), ([2, -2, 2],), ([0, 3, 4],)]),
    ("power(base: int, exp: int) -> int", "Return base raised to the non-negative integer power exp.",
     "return base ** exp", "return base * exp", (2, 5), [(2, 0), (3, 1), (2, 2), (5, 3), (10, 4)]),
    ("median(xs: list) -> float", "Return the median of the non-empty list xs (the mean of the two middle values when len(xs) is even).",
     "s = sorted(xs)\n    m = len(s) // 2\n    return float(s[m]) if len(s) % 2 else (s[m - 1] + s[m]) / 2",
     "return float(sorted(xs)[len(xs) // 2])", ([3, 1, 2],),
     [([5],), ([1, 2, 3],), ([4, 1, 3, 2],), ([10, 20],), ([7, 7, 1, 9, 3],)]),
    ("celsius_to_fahrenheit(c: float) -> float", "Return the temperature c (degrees Celsius) in degrees Fahrenheit.",
     "return c * 9 / 5 + 32", "return c * 5 / 9 + 32", (100,), [(0,), (100,), (-40,), (37,), (20,)]),
    ("is_leap_year(year: int) -> bool",
     "Return True if year is a leap year: divisible by 4, except centuries, which must be divisible by 400.",
     "return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)", "return year % 4 == 0", (2024,),
     [(2023,), (2000,), (1900,), (1996,), (2100,)]),
    ("merge_sorted(a: list, b: list) -> list", "Return one sorted list of the elements of the sorted lists a and b.",
     "return sorted(a + b)", "return a + b", ([1, 4], [2, 3]),
     [([], []), ([1], []), ([1, 3], [2, 4]), ([5, 6], [1, 2]), ([1, 1], [1])]),
    ("rotate_left(xs: list, k: int) -> list", "Return xs rotated left by k positions (k may exceed len(xs)); [] for [].",
     "if not xs:\n        return []\n    k %= len(xs)\n    return xs[k:] + xs[:k]",
     "return xs[k:] + xs[:k]", ([1, 2, 3, 4], 1),
     [([], 3), ([1, 2, 3], 0), ([1, 2, 3], 1), ([1, 2, 3], 4), ([1, 2], 5)]),
    ("to_binary(n: int) -> str", "Return the binary digits of the non-negative integer n, without a prefix.",
     "return bin(n)[2:]", "return bin(n)", (5,), [(0,), (1,), (2,), (10,), (255,)]),
    ("triangle_kind(a: int, b: int, c: int) -> str",
     "Return 'equilateral' if all three sides are equal, 'isosceles' if exactly two are, else 'scalene'.",
     "if a == b == c:\n        return 'equilateral'\n    if a == b or b == c or a == c:\n        return 'isosceles'\n"
     "    return 'scalene'",
     "if a == b == c:\n        return 'equilateral'\n    if a == b:\n        return 'isosceles'\n    return 'scalene'",
     (2, 2, 3), [(3, 3, 3), (2, 2, 3), (2, 3, 3), (3, 2, 3), (3, 4, 5)]),
    ("sign(x: int) -> int", "Return -1 if x is negative, 0 if x is zero and 1 if x is positive.",
     "return (x > 0) - (x < 0)", "return 1 if x >= 0 else -1", (-5,), [(-3,), (0,), (7,), (-1,), (100,)]),
    ("average(xs: list) -> float", "Return the mean of the numbers in xs, or 0.0 for an empty list.",
     "return sum(xs) / len(xs) if xs else 0.0", "return sum(xs) / len(xs)", ([1, 2, 3],),
     [([],), ([4],), ([1, 2],), ([2, 4, 6, 8],), ([-1, 1],)]),
    ("triangular(n: int) -> int", "Return the n-th triangular number 1 + 2 + ... + n (0 for n = 0).",
     "return n * (n + 1) // 2", "return n * (n - 1) // 2", (4,), [(0,), (1,), (2,), (5,), (10,)]),
    ("parse_ints(s: str) -> list", "Return the integers in the comma-separated string s ('1,2,3' -> [1, 2, 3]).",
     "return [int(part) for part in s.split(',')]", "return s.split(',')", ("4,5",),
     [("1",), ("1,2,3",), ("10,-2",), ("7,7",), ("0,100,5",)]),
    ("index_of_min(xs: list) -> int", "Return the index of the smallest value of the non-empty list xs (its first occurrence).",
     "return xs.index(min(xs))", "return len(xs) - 1 - xs[::-1].index(min(xs))", ([3, 1, 2],),
     [([5],), ([2, 1],), ([1, 2, 1],), ([4, 0, 0, 3],), ([9, 8, 7],)]),
    ("count_upper(s: str) -> int", "Return how many characters of s are upper-case letters.",
     "return sum(1 for c in s if c.isupper())", "return sum(1 for c in s if not c.islower())", ("Hello World",),
     [("",), ("abc",), ("ABC",), ("A1 b2",), ("Hi There!",)]),
    ("is_sorted(xs: list) -> bool", "Return True if xs is in non-decreasing order.",
     "return all(a <= b for a, b in zip(xs, xs[1:]))", "return all(a < b for a, b in zip(xs, xs[1:]))", ([1, 2, 2],),
     [([],), ([1],), ([1, 2, 3],), ([1, 1, 2],), ([3, 2],)]),
    ("repeat_string(s: str, n: int) -> str", "Return s repeated n times (n >= 0).",
     "return s * n", "return s * (n - 1) if n > 0 else ''", ("ab", 3), [("x", 0), ("x", 1), ("ab", 2), ("", 5), ("hi", 3)]),
    ("even_numbers(xs: list) -> list", "Return the even numbers of xs, in order.",
     "return [x for x in xs if x % 2 == 0]", "return [x for x in xs if x % 2 == 1]", ([1, 2, 3, 4],),
     [([],), ([1, 3],), ([2, 4],), ([0, 1, 2],), ([5, 6, 7, 8],)]),
    ("swap_case(s: str) -> str", "Return s with upper-case letters made lower-case and lower-case letters made upper-case.",
     "return s.swapcase()", "return s.upper()", ("Hello",), [("",), ("abc",), ("ABC",), ("aBc",), ("Hi 5!",)]),
    ("product(xs: list) -> int", "Return the product of the numbers in xs (1 for an empty list).",
     "result = 1\n    for x in xs:\n        result *= x\n    return result",
     "result = 0\n    for x in xs:\n        result *= x\n    return result", ([2, 3, 4],),
     [([],), ([5],), ([1, 2, 3],), ([-2, 3],), ([4, 0, 2],)]),
    ("longest_word(s: str) -> str", "Return the longest word of s (words are separated by spaces); the first one on a tie.",
     "best = ''\n    for word in s.split():\n        if len(word) > len(best):\n            best = word\n    return best",
     "best = ''\n    for word in s.split():\n        if len(word) >= len(best):\n            best = word\n    return best",
     ("a tall tree",), [("one",), ("hi there",), ("cat dog",), ("a bb cc",), ("tiny enormous huge",)]),
    ("count_digits(n: int) -> int", "Return the number of decimal digits of the integer n (the sign is not a digit).",
     "return len(str(abs(n)))", "return len(str(n))", (1234,), [(0,), (7,), (-5,), (100,), (-2048,)]),
    ("capitalize_words(s: str) -> str", "Return s with the first letter of every space-separated word in upper case.",
     "return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))", "return s[:1].upper() + s[1:]", ("hello world",),
     [("",), ("one",), ("two words",), ("a b c",), ("already Done",)]),
    ("min_max(xs: list) -> tuple", "Return (smallest, largest) of the non-empty list xs.",
     "return (min(xs), max(xs))", "return (xs[0], xs[-1])", ([3, 1, 2],),
     [([5],), ([1, 2],), ([2, 1],), ([3, 9, 1, 4],), ([-1, -5, 0],)]),
]


def _function(signature: str, body: str) -> str:
    return f"def {signature}:\n    {body}\n"


def _call(name: str, args: tuple) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def build() -> list[dict]:
    """Every task as a record of tasks.jsonl; the expected outputs computed by running its reference here."""
    records = []
    for index, (signature, doc, reference_body, wrong_body, example, inputs) in enumerate(TASKS):
        name = signature.split("(")[0]
        reference, wrong = _function(signature, reference_body), _function(signature, wrong_body)
        namespace: dict = {}
        exec(reference, namespace)  # our own reference code, to compute the expected outputs
        function = namespace[name]
        prompt = f'def {signature}:\n    """{doc}\n\n    Example: {_call(name, example)} == {function(*example)!r}\n    """\n'
        records.append({
            "id": name,
            "split": "test" if index % TEST_EVERY == TEST_EVERY - 1 else "train",
            "entry_point": name,
            "prompt": prompt,
            "reference": reference,
            "wrong": wrong,
            "tests": [f"assert {_call(name, args)} == {function(*args)!r}" for args in inputs],
        })
    return records


def render(records: list[dict]) -> str:
    return "".join(json.dumps(record) + "\n" for record in records)


def verify(records: list[dict], sandbox=None) -> list[str]:
    """What is wrong with `records` when run in the sandbox: a reference that fails a hidden test, a wrong
    solution that passes them all. `sandbox`: a SandboxService (default: one with the default limits)."""
    from drmas.api import AssertRequest, AssertService, SandboxConfig, SandboxService

    own = sandbox is None
    sandbox = sandbox or SandboxService(SandboxConfig(workers=2, timeout_s=10), where="make_tasks")
    try:
        requests = [AssertRequest(r[key], tuple(r["tests"]), per_test_timeout_s=2.0)
                    for r in records for key in ("reference", "wrong")]
        reports = AssertService(sandbox).call_batch(requests)
    finally:
        if own:
            sandbox.close()
    found = []
    for i, record in enumerate(records):
        reference, wrong = reports[2 * i], reports[2 * i + 1]
        if not reference.all_passed:
            failed = [o.error for o in reference.outcomes if not o.passed]
            found.append(f"{record['id']}: the reference fails: {reference.solution_error or failed}")
        if wrong.all_passed:
            found.append(f"{record['id']}: the wrong solution passes every hidden test")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verify", action="store_true", help="check every task in the sandbox before writing")
    parser.add_argument("--out", default=str(TASKS_FILE))
    args = parser.parse_args()
    records = build()
    if args.verify:
        problems = verify(records)
        if problems:
            print("\n".join(problems), file=sys.stderr)
            return 1
    Path(args.out).write_text(render(records))
    print(f"{len(records)} tasks ({sum(r['split'] == 'test' for r in records)} held out) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
