"""Each example script runs as a user would run it, in its own process, and does what it says."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard import RunReader

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str, *args: str) -> str:
    # one thread: these tiny models only slow down when two threads compete for a busy CPU
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True,
                            text=True, timeout=120, env=env, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


@pytest.mark.slow
def test_hf_trainer_example_skips_the_poisoned_step(tmp_path: Path) -> None:
    out = run_example("hf_trainer.py", "--steps", "30", "--poison-step", "12",
                      "--workdir", str(tmp_path))
    assert "trainguard skipped steps: [12]" in out
    assert "weights finite: True" in out
    assert "trainguard clips gradients at max_grad_norm=1, as the Trainer would" in out
    with RunReader(tmp_path / "run") as reader:
        assert len(reader.steps()) == 30
        assert {e.kind for e in reader.events()} == {"nonfinite_loss", "nonfinite_grad"}


@pytest.mark.slow
def test_hf_peft_lora_example_names_adapter_parameters(tmp_path: Path) -> None:
    out = run_example("hf_peft_lora.py", "--steps", "30", "--poison-step", "12",
                      "--workdir", str(tmp_path))
    assert "event nonfinite_grad at step 12: base_model.model.transformer.h.0.attn.c_attn" \
           ".lora_A.default.weight" in out
    assert "weights finite: True" in out
    with RunReader(tmp_path / "run") as reader:
        assert all("lora_" in name for name in reader.param_names())


@pytest.mark.slow
def test_lightning_example_resumes_with_the_guard_state(tmp_path: Path) -> None:
    out = run_example("lightning_loop.py", "--steps", "30", "--poison-step", "8",
                      "--workdir", str(tmp_path))
    assert "events ['nonfinite_loss@8', 'nonfinite_grad@8']" in out
    assert "part 2: resumed at step 15 with the guard's loss baseline of 14 steps; now 29" in out
    assert "weights finite: True" in out
    assert (tmp_path / "half.ckpt").is_file()


@pytest.mark.slow
def test_accelerate_example_guards_an_accumulating_mixed_precision_loop(tmp_path: Path) -> None:
    out = run_example("accelerate_loop.py", "--steps", "30", "--poison-step", "10",
                      "--run-dir", str(tmp_path / "run"))
    assert "30 optimizer steps of 2 micro-batches" in out
    assert "skipped steps: [10]" in out
    assert "weights finite: True" in out
    with RunReader(tmp_path / "run") as reader:
        steps = reader.steps()
    assert [s["step"] for s in steps] == list(range(30))
    assert [s["step"] for s in steps if s["action"] == "skipped"] == [10]


@pytest.mark.slow
def test_diffusers_example_is_quiet_healthy_and_names_the_pixel_range(tmp_path: Path) -> None:
    pytest.importorskip("diffusers")
    healthy = run_example("diffusers_loop.py", "--steps", "30", "--run-dir", str(tmp_path / "a"))
    assert "events: none" in healthy and "verdict: healthy" in healthy
    pixels = run_example("diffusers_loop.py", "--steps", "5", "--pixels-255",
                         "--run-dir", str(tmp_path / "b"))
    assert "events: ['batch_image_range']" in pixels and "likely cause: input_scale" in pixels
    velocity = run_example("diffusers_loop.py", "--steps", "3", "--velocity",
                           "--run-dir", str(tmp_path / "c"))
    assert "findings: ['diffusion_target']" in velocity
    assert "likely cause: prediction_type_mismatch" in velocity
