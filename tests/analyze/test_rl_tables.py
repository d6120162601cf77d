"""OpenAI baselines / stable-baselines console tables, written as those trainers print them."""

from __future__ import annotations

from pathlib import Path

from trainguard.analyze import analyze, read_log

RULE = "-" * 39


def _block(cells: dict[str, str]) -> str:
    body = "".join(f"| {name:<18} | {value:<14} |\n" for name, value in cells.items())
    return f"{RULE}\n{body}{RULE}\n"


def _ppo2(updates: int) -> str:
    """The baselines logger's table after each PPO2 update, with other console lines between."""
    out = ["Logging to /tmp/openai-2019-06-01\n"]
    for update in range(1, updates + 1):
        out.append(_block({"approxkl": f"{0.001 + 0.0001 * (update % 3):.6g}",
                           "eplenmean": str(20 + update), "fps": "1187",
                           "nupdates": str(update),
                           "policy_entropy": f"{0.69 - 0.01 * update:.4g}",
                           "policy_loss": f"{-0.004 - 0.001 * (update % 2):.4g}",
                           "total_timesteps": str(2048 * update),
                           "value_loss": f"{40.0 / update:.5g}"}))
    return "".join(out)


def test_baselines_logger_blocks_are_rows_numbered_by_update(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    path.write_text(_ppo2(12))
    log = read_log(path)
    assert log.format == "text:rl"
    assert log.steps == list(range(1, 13))
    assert log.label(2) == "nupdates 3"
    assert log.values("approxkl")[0] == 0.0011
    assert analyze(path).verdict == "healthy"


def test_stable_baselines3_sections_are_dropped_from_the_names(tmp_path: Path) -> None:
    blocks = []
    for iteration in range(1, 8):
        blocks.append(
            f"{RULE}\n| rollout/           |                |\n"
            f"|    ep_rew_mean     | {20 + iteration:<14} |\n"
            f"| time/              |                |\n"
            f"|    iterations      | {iteration:<14} |\n"
            f"|    total_timesteps | {2048 * iteration:<14} |\n"
            f"| train/             |                |\n"
            f"|    approx_kl       | {0.008:<14} |\n"
            f"|    loss            | {6.0 - 0.3 * iteration:<14.4g} |\n"
            f"|    value_loss      | {50.0 - iteration:<14} |\n{RULE}\n")
    path = tmp_path / "sb3.log"
    path.write_text("Using cuda device\n" + "".join(blocks))
    log = read_log(path)
    assert log.steps == list(range(1, 8)) and log.label(0) == "iterations 1"
    assert log.values("loss")[0] == 5.7
    assert "ep_rew_mean" in log.series and "value_loss" in log.series


def test_ppo1_optimisation_tables_are_rows_per_epoch(tmp_path: Path) -> None:
    lines = []
    for iteration in (0, 1):
        lines += [f"********** Iteration {iteration} ************", "Optimizing...",
                  "     pol_surr |    pol_entpen |       vf_loss |            kl |           ent"]
        for epoch in range(4):
            vf = 1.7e5 - 1e3 * (4 * iteration + epoch)
            lines.append(f"{-0.001 * epoch:13.5f} | {0.0:13.5f} | {vf:13.3g} | "
                         f"{0.01 + 0.001 * epoch:13.5f} | {-0.35:13.5f}")
    path = tmp_path / "ppo1.txt"
    path.write_text("\n".join(lines) + "\n")
    log = read_log(path)
    assert len(log) == 8
    assert log.label(5) == "iteration 1, epoch 2"
    assert log.values("kl")[1] == 0.011
    assert analyze(path).verdict == "healthy"


def _unruled(iterations: range) -> str:
    """baselines ACKTR's console as pasted: an `Iteration N` line, the KL controller's message,
    then the logger's `| name | value |` lines without their dashed rules, no loss column."""
    out = []
    for it in iterations:
        kl = f"{0.001 + 0.0002 * (it % 3):.6g}"
        out.append(f"Iteration {it}\nkl just right!\n\n"
                   f"| EVAfter   | {0.98 + 0.001 * (it % 2):<8.4g} |\n"
                   f"| EpLenMean | 200      |\n"
                   f"| EpRewMean | {-8.5 + 0.3 * (it % 4):<8.4g} |\n"
                   f"| KL        | {kl:<8} |\n\n")
    return "".join(out)


def test_tables_without_rules_are_numbered_by_the_iteration_line_before_them(
        tmp_path: Path) -> None:
    path = tmp_path / "acktr.txt"
    path.write_text(_unruled(range(3020, 3027)))
    log = read_log(path)
    assert log.format == "text:rl"
    assert log.steps == list(range(3020, 3027)) and log.label(1) == "iteration 3021"
    assert log.values("KL")[0] == 0.0014 and log.values("EpLenMean")[0] == 200
    assert analyze(path).verdict == "healthy"


def test_a_stray_cell_without_rules_or_a_number_is_no_table(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("the run printed this once:\n| KL | 0.5 |\n| fps | 1187 |\n\n"
                    "step 1 loss: 2.5\nstep 2 loss: 2.1\nstep 3 loss: 1.9\n")
    log = read_log(path)
    assert log.format == "text:generic" and log.steps == [1, 2, 3]
