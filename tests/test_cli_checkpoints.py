"""`trainguard checkpoints OUTPUT_DIR`: the checkpoints with their health, as a table or JSON;
a folder without sidecars, or with a corrupt one, is one message and exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import trainguard
from trainguard import GuardConfig
from trainguard.checkpoints import SIDECAR
from trainguard.cli import main


def _saved_run(out: Path) -> None:
    """Three checkpoints of a plain loop; its weights are poisoned before the third."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = trainguard.Guard(model, optimizer, config=GuardConfig(policy="observe",
                                                                  sinks={"console": False}))
    for step in range(30):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
        if step == 25:
            with torch.no_grad():
                model.bias.fill_(float("nan"))
        if (step + 1) % 10 == 0:
            path = out / f"step{step + 1}.pt"
            torch.save(model.state_dict(), path)
            trainguard.mark_checkpoint(path, guard)
    guard.close()


def test_the_table_lists_each_checkpoint_with_its_health(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    _saved_run(tmp_path)
    assert main(["checkpoints", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["step", "status"]
    rows = [line.split() for line in lines[1:4]]
    assert [(r[0], r[1]) for r in rows] == [("10", "healthy"), ("20", "healthy"),
                                           ("30", "poisoned")]
    assert rows[2][2] == "NON-FINITE"
    assert lines[4] == f"last healthy: {tmp_path / 'step20.pt'}"


def test_json_holds_every_sidecar(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _saved_run(tmp_path)
    assert main(["checkpoints", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [c["status"] for c in data["checkpoints"]] == ["healthy", "healthy", "poisoned"]
    assert data["checkpoints"][2]["sidecar"]["weights_finite"] is False
    assert data["last_healthy"] == str(tmp_path / "step20.pt")


def _fails(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainguard: error: "), captured.err
    return lines[0]


def test_a_folder_without_sidecars_exits_2(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "checkpoint-10").mkdir()
    (tmp_path / "checkpoint-10" / "model.safetensors").write_bytes(b"weights")
    assert "has a trainguard sidecar" in _fails(["checkpoints", str(tmp_path)], capsys)
    assert "does not exist" in _fails(["checkpoints", str(tmp_path / "nowhere")], capsys)


@pytest.mark.parametrize("content", [b'{"step": 10, "hea', b"\xff\xfe not text",
                                     b'{"format": 1, "step": "ten"}', b"[1, 2]",
                                     b'{"format": 1, "step": NaN}'])
def test_a_corrupt_sidecar_exits_2_with_one_message(tmp_path: Path, content: bytes,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _saved_run(tmp_path)
    (tmp_path / f"step20.pt.{SIDECAR}").write_bytes(content)
    message = _fails(["checkpoints", str(tmp_path)], capsys)
    assert f"step20.pt.{SIDECAR}" in message
    # resuming stays possible: the unreadable one is left out
    assert trainguard.last_healthy_checkpoint(tmp_path) == tmp_path / "step10.pt"


def test_listing_imports_no_torch(tmp_path: Path) -> None:
    _saved_run(tmp_path)
    code = ("import sys; from trainguard.cli import main; "
            "code = main(['checkpoints', sys.argv[1]]); print('torch' in sys.modules, code)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "False 0", done.stderr[-2000:]
