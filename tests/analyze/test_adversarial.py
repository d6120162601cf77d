"""A GAN's log (`trainguard.analyze.adversarial`): its losses are a game's, their levels not
judged, their NaN still caught."""

from __future__ import annotations

import json
import math
from pathlib import Path

from trainguard.analyze import analyze


def _records(path: Path, dis: list[float], gen_name: str = "loss_gen",
             dis_name: str = "loss_dis") -> Path:
    """Chainer's `LogReport` lines: a generator loss that climbs 3.7 -> 13 while the
    discriminator's falls (a discriminator that wins the game)."""
    rows = [{"iteration": 100 * (i + 1), gen_name: 3.7 + 0.05 * i + 0.3 * (i % 3),
             dis_name: value} for i, value in enumerate(dis)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


FALLING = [1.2 - 0.005 * i for i in range(200)]


def test_a_generator_loss_that_climbs_is_the_game_not_a_divergence(tmp_path: Path) -> None:
    result = analyze(_records(tmp_path / "log.jsonl", FALLING))
    assert result.verdict == "healthy", result.evidence
    assert any("discriminator's loss (loss_dis)" in note for note in result.notes)
    assert "levels not judged" in result.evidence[0]


def test_a_gan_whose_discriminator_loss_ends_nan_is_degraded(tmp_path: Path) -> None:
    dis = FALLING[:150] + [math.nan] * 50
    result = analyze(_records(tmp_path / "log.jsonl", dis, gen_name="G_loss", dis_name="D_loss"))
    assert (result.verdict, result.kind) == ("degraded", "nan"), result.evidence


def test_a_second_loss_not_named_for_a_discriminator_leaves_the_loss_judged(tmp_path: Path
                                                                           ) -> None:
    result = analyze(_records(tmp_path / "log.jsonl", FALLING, gen_name="loss",
                              dis_name="loss_aux"))
    assert result.verdict == "degraded", result.evidence


def test_a_pix2pix_visualizer_log_is_read_as_a_gan(tmp_path: Path) -> None:
    """pytorch-CycleGAN-and-pix2pix prints its losses by their short names only."""
    lines = [f"(epoch: {1 + i // 10}, iters: {100 * (1 + i % 10)}, time: 0.189, data: 0.002) "
             f"G_GAN: {1.5 + 0.02 * i:.3f} G_L1: {40 - 0.2 * i:.3f} D_real: "
             f"{0.5 / (1 + 0.05 * i):.3f} D_fake: {0.4 / (1 + 0.05 * i):.3f} " for i in range(60)]
    assert_a_healthy_game(tmp_path / "loss_log.txt", lines, "discriminator's loss")


def assert_a_healthy_game(path: Path, lines: list[str], note: str) -> None:
    """The lines, written to `path`, are a GAN's log judged healthy, with `note` among its
    notes."""
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = analyze(path)
    assert result.verdict == "healthy", result.evidence
    assert any(note in said for said in result.notes), result.notes


def _cyclegan(path: Path, d_a: list[float]) -> Path:
    """pytorch-CycleGAN-and-pix2pix's `loss_log.txt`: the A side's discriminator loss as
    given, the rest a live game; three decimals, as the visualizer writes them."""
    lines = [f"(epoch: {1 + i // 20}, iters: {100 * (1 + i % 20)}, time: 0.5, data: 0.002) "
             f"D_A: {value:.3f} G_A: {1.0 if value < 0.01 else 0.5 + 0.1 * (i % 4):.3f} "
             f"cycle_A: {2.0 * 0.995 ** i:.3f} D_B: {0.15 + 0.05 * (i % 3):.3f} "
             f"G_B: {0.6 + 0.1 * (i % 5):.3f} " for i, value in enumerate(d_a)]
    path.write_text("================ Training Loss ================\n" + "\n".join(lines)
                    + "\n", encoding="utf-8")
    return path


GAME = [0.12 + 0.06 * ((i * 7) % 5) for i in range(120)]  # 0.12-0.36, a live discriminator


def test_a_discriminator_that_wins_for_good_is_a_collapse(tmp_path: Path) -> None:
    """From row 121 on the A discriminator's loss is 0.000-0.004 on most rows (a confident
    batch back at 0.2 now and then): it tells every fake from a real image, and its generator
    learns nothing from the game while the cycle loss keeps falling."""
    won = [0.2 if i % 6 == 5 else 0.001 * (i % 5) for i in range(300)]
    result = analyze(_cyclegan(tmp_path / "loss_log.txt", GAME + won))
    assert (result.verdict, result.onset) == ("stalled", "epoch 7, iters 100"), result.evidence
    assert "discriminator's loss loss_D_A is at its floor" in result.evidence[0]


def test_a_discriminator_confident_on_some_batches_only_is_the_game(tmp_path: Path) -> None:
    """Near 0 on a third of the rows, or on a short stretch at the end: no collapse."""
    some = [0.002 if i % 3 == 0 else value for i, value in enumerate(GAME * 3)]
    assert analyze(_cyclegan(tmp_path / "some.txt", some)).verdict == "healthy"
    late = GAME * 3 + [0.001] * 30  # 30 rows at the floor: under `WON_ROWS`
    assert analyze(_cyclegan(tmp_path / "late.txt", late)).verdict == "healthy"


def test_a_discriminator_caught_up_before_the_end_is_the_game(tmp_path: Path) -> None:
    """At the floor for 150 rows, then a live game again to the end: no collapse."""
    d_a = GAME[:20] + [0.002] * 150 + GAME[:130]
    assert analyze(_cyclegan(tmp_path / "loss_log.txt", d_a)).verdict == "healthy"


def test_a_wasserstein_critic_near_zero_is_a_close_game(tmp_path: Path) -> None:
    """A WGAN critic's loss is negative; its size falling towards 0 is the generator catching
    up, not a discriminator that won."""
    lines = [f"iter {100 * i} | loss_G: {2.0 + 0.01 * i:.3f} | "
             f"loss_D: {-30 * math.exp(-i / 40) - 0.05 * (i % 3):.4f} | gp: 0.1"
             for i in range(400)]
    assert_a_healthy_game(tmp_path / "wgan.txt", lines, "discriminator's loss (loss_D)")


def test_a_log_whose_first_loss_is_the_discriminators_is_a_gan(tmp_path: Path) -> None:
    """PyTorch-GAN prints `[D loss: x] [G loss: y]`: the discriminator's is read as the loss, and
    the log is still a game's, its levels not judged."""
    lines = [f"[Epoch {i // 50}/10] [Batch {i % 50}/50] [D loss: {1.2 - 0.002 * i:.4f}] "
             f"[G loss: {0.7 + 0.01 * i + 0.5 * (i % 7 == 0):.4f}]" for i in range(300)]
    assert_a_healthy_game(tmp_path / "gan.txt", lines, "discriminator's loss (D loss)")
