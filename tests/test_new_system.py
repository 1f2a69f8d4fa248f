"""`drmas new-system NAME`: the skeleton it writes is a plugin that `drmas run` trains out of the box, in the
colocated loop (a plugin outside the package, in this loop: its async twin is tests/test_plugins.py)."""

from __future__ import annotations

import sys

import pytest
from cli_run import run_cli

from drmas.cli import main
from drmas.runtime.metrics import read_metrics


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_new_system_trains_out_of_the_box(tmp_path):
    made = run_cli([sys.executable, "-m", "drmas.cli", "new-system", "my_system", "--dir", "systems"], timeout=60,
                   cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert "train it: drmas run --config systems/my_system.yaml" in made.stdout
    module = (tmp_path / "systems" / "my_system.py").read_text()
    assert '@ORCHESTRAS.register("my_system", settings=MySystemSettings)' in module and "template" not in module
    # as written: the config's relative plugin path and output directory, run from the directory it was made in
    done = run_cli([sys.executable, "-m", "drmas.cli", "run", "--config", "systems/my_system.yaml"], timeout=240,
                   cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / "runs" / "my_system"
    steps = [r for r in read_metrics(out / "metrics.jsonl") if "loss/policy" in r]  # (step 0: accuracy before)
    assert [r["step"] for r in steps] == [1, 2]
    assert all("reward/writer/mean" in r and "reward/critic/mean" in r for r in steps)
    assert f"- {tmp_path / 'systems' / 'my_system.py'}" in (out / "config.yaml").read_text()
    assert "held-out accuracy: before" in done.stdout


@pytest.mark.parametrize(("name", "message"), [
    ("my-system", "'my-system' is not a Python identifier"),
    ("search", "'search' is the name of a registered system"),
    ("json", "a module named 'json' is importable already"),
])
def test_unusable_names_are_refused(tmp_path, capsys, name, message):
    assert main(["new-system", name, "--dir", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_existing_files_are_kept_unless_forced(tmp_path, capsys):
    assert main(["new-system", "mine", "--dir", str(tmp_path)]) == 0
    (tmp_path / "mine.py").write_text("# my work\n")
    assert main(["new-system", "mine", "--dir", str(tmp_path)]) == 2
    assert "already there: " in capsys.readouterr().err and (tmp_path / "mine.py").read_text() == "# my work\n"
    assert main(["new-system", "mine", "--dir", str(tmp_path), "--force"]) == 0
    assert "class MineOrchestra" in (tmp_path / "mine.py").read_text()
