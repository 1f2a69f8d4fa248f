"""Check that a folder of wheels is complete for the GPU machine: every wheel is for CPython 3.12 on Linux
x86_64, every requirement of `scripts/gpu_wheels.txt` has its wheel, and every `Requires-Dist` of those
(markers evaluated for that platform, extras as requested) is met by a wheel of the folder or by a package
the machine has already (`PREINSTALLED`).

    python scripts/check_wheels.py .whl [scripts/gpu_wheels.txt]
    python scripts/check_wheels.py --missing .whl    # the wheels whose distribution this Python lacks

`--missing` is what scripts/gpu_check.sh installs on the GPU machine: a wheel of a package that is there
already is left out (installing it into a --target that comes first on PYTHONPATH would shadow the
machine's own version).

Exit 1 with the unmet requirements named, else a one-line summary.
"""

from __future__ import annotations

import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

# The GPU machine of issue 24 (Python 3.12, no network): what it named, and what those depend on.
PREINSTALLED = {canonicalize_name(n) for n in (
    "torch", "transformers", "safetensors", "accelerate", "tensorboard", "pyarrow", "scipy", "peft", "rich", "tqdm",
    "numpy", "sympy", "mpmath", "filelock", "fsspec", "jinja2", "networkx", "packaging", "huggingface-hub",
    "tokenizers", "regex", "psutil", "protobuf", "pygments", "markdown-it-py", "setuptools",
)}
ENVIRONMENT = {"python_version": "3.12", "python_full_version": "3.12.0", "implementation_name": "cpython",
               "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
               "platform_machine": "x86_64", "os_name": "posix"}


def metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(archive.read(name).decode())


def _fits(tag) -> bool:
    linux = tag.platform == "any" or (tag.platform.startswith("manylinux") and tag.platform.endswith("x86_64"))
    return tag.interpreter in ("cp312", "py3", "py312") and linux


def unmet(folder: Path, listed: list[Requirement]) -> list[str]:
    wheels = {}
    for wheel in sorted(folder.glob("*.whl")):
        name, version, _, tags = parse_wheel_filename(wheel.name)
        if not any(_fits(t) for t in tags):
            raise SystemExit(f"{wheel.name}: not a wheel for CPython 3.12 on Linux x86_64")
        wheels[name] = (version, wheel)
    problems, wanted = [], []
    for requirement in listed:
        name = canonicalize_name(requirement.name)
        if name not in wheels or not requirement.specifier.contains(wheels[name][0], prereleases=True):
            problems.append(f"{requirement}: no such wheel in {folder}")
        wanted += [(name, "")] + [(name, e) for e in requirement.extras]
    seen = set()
    while wanted:
        name, extra = wanted.pop()
        if (name, extra) in seen or name not in wheels:
            continue
        seen.add((name, extra))
        version, wheel = wheels[name]
        for line in metadata(wheel).get_all("Requires-Dist") or []:
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate({**ENVIRONMENT, "extra": extra}):
                continue
            dep = canonicalize_name(requirement.name)
            if dep in wheels:
                if not requirement.specifier.contains(wheels[dep][0], prereleases=True):
                    problems.append(f"{name} {version} needs {requirement}, the folder has {wheels[dep][0]}")
                wanted += [(dep, "")] + [(dep, e) for e in requirement.extras]
            elif dep not in PREINSTALLED:
                problems.append(f"{name} {version} needs {requirement}: not in the folder, not preinstalled")
    return problems


def missing(folder: Path) -> list[Path]:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for wheel in sorted(folder.glob("*.whl")):
        try:
            version(parse_wheel_filename(wheel.name)[0])
        except PackageNotFoundError:
            out.append(wheel)
    return out


def main() -> None:
    if sys.argv[1:2] == ["--missing"]:
        print(" ".join(str(w) for w in missing(Path(sys.argv[2] if len(sys.argv) > 2 else ".whl"))))
        return
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else ".whl")
    listing = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).with_name("gpu_wheels.txt")
    listed = [Requirement(line.split("#")[0].strip()) for line in listing.read_text().splitlines()
              if line.split("#")[0].strip()]
    problems = list(dict.fromkeys(unmet(folder, listed)))
    if problems:
        print("\n".join(problems))
        raise SystemExit(1)
    size = sum(w.stat().st_size for w in folder.glob("*.whl"))
    print(f"{len(list(folder.glob('*.whl')))} wheels, {size / 2**20:.1f} MiB: every requirement met for CPython 3.12 "
          "on Linux x86_64 (by the folder or the machine's preinstalled packages)")


if __name__ == "__main__":
    main()
