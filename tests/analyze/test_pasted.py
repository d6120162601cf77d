"""The tolerant text grammar (`trainguard.analyze.pasted`): the lines people paste into issues,
each test written from a line of a real log (quoted; the source named beside it)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainguard.analyze import analyze, pasted, read_log
from trainguard.analyze.log import LogError
from trainguard.analyze.pasted import parse_line

NAN = math.nan


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def same(values: list[float | None], expected: list[float]) -> bool:
    return len(values) == len(expected) and all(
        (a is not None and math.isnan(a) and math.isnan(b)) or a == pytest.approx(b)
        for a, b in zip(values, expected, strict=True))


# -- one line of each format, as it was pasted ----------------------------------------------------
@pytest.mark.parametrize("line, values, counters", [
    # HF Trainer console (ymcui/Chinese-LLaMA-Alpaca-3#64)
    ("{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 7.116424708226588e-08, 'epoch': 0.0}",
     {"loss": 0.0, "grad_norm": NAN, "learning_rate": 7.116424708226588e-08}, {"epoch": 0.0}),
    # kohya sd-scripts tqdm bar (kohya-ss/sd-scripts#2137)
    ("steps:   1%|▋                                                        | 41/3280 "
     "[00:50<1:06:54,  1.24s/it, avr_loss=nan]", {"avr_loss": NAN}, {"progress": 41.0}),
    # Keras progress line (alexander-rakhlin/CNN-for-Sentence-Classification-in-Keras#7)
    ("9595/9595 [==============================] - 1s - loss: nan - acc: 0.4117 - val_loss: nan "
     "- val_acc: 0.0000e+00", {"loss": NAN, "acc": 0.4117, "val_loss": NAN, "val_acc": 0.0},
     {"progress": 9595.0}),
    # TensorFlow console (tensorflow/models#3868)
    ("INFO:tensorflow:global step 435: loss = 0.0630 (0.408 sec/step)", {"loss": 0.063},
     {"step": 435.0}),
    # Python logging (guillaumegenthial/sequence_tagging#47)
    ("2018-03-23 15:29:33,355:INFO: train loss:1.10886", {"train loss": 1.10886}, {}),
    # a printed loss tensor (lich99/ChatGLM-finetune-LoRA#32)
    ("tensor(nan, device='cuda:0')", {"loss": NAN}, {}),
    # a tqdm description (primepake/wav2lip_288x288#33)
    ("Loss: 0.5212869264862754: : 11it [00:06,  1.59it/s]", {"Loss": 0.5212869264862754}, {}),
    # litgpt: the first counter on the line numbers it (Lightning-AI/litgpt#628)
    ("iter 1152 step 144: loss 11.4630, iter time: 1260.82ms", {"loss": 11.463},
     {"step": 1152.0}),
    # `key: value` with an epoch as the only counter (vpetren/gradnorm_tf#17)
    ("epoch: 3451 loss: nan", {"loss": NAN}, {"epoch": 3451.0}),
    # a value named, then the counter it was taken at (a course notebook's print)
    ("Cost after iteration 1000: 0.6237287551108738", {"Cost": 0.6237287551108738},
     {"step": 1000.0}),
    ("Loss after epoch 3: 0.51", {"Loss": 0.51}, {"epoch": 3.0}),
    # OpenNMT-py: `Step N/M;`, xent is the loss (OpenNMT/OpenNMT-py#1072)
    ("[2018-11-26 15:06:01,481 INFO] Step 5650/50000; acc:   0.19; ppl:   nan; xent:  nan; lr: "
     "0.00070; 1928/2310 tok/s;  21110 sec",
     {"acc": 0.19, "ppl": NAN, "xent": NAN, "lr": 0.0007}, {"step": 5650.0}),
    # BasicSR: `[epoch: 0, iter: 155, ...] l_pix: inf` (AHupuJR/EFNet#12)
    ("2023-06-16 22:22:49,505 INFO: [debug..][epoch:  0, iter:     155, lr:(2.000e-04,"
     "2.000e-05,)] [eta: 406 days, 12:46:06, time (data): 0.470 (0.001)] l_pix: inf ",
     {"l_pix": math.inf}, {"epoch": 0.0, "step": 155.0}),
    # BigDL: values in a sentence, `X is Y` (intel/ipex-llm#2000)
    ("2017-12-06 10:13:01 INFO  DistriOptimizer$:330 - [Epoch 34 254464/1281167][Iteration "
     "11885][Wall Clock 18617.882038226s] Trained 3584 records in 1.679330981 seconds. "
     "Throughput is 2134.1833 records/second. Loss is NaN. Current learning rate is 0.0805",
     {"Loss": NAN, "learning rate": 0.0805}, {"step": 11885.0, "epoch": 34.0}),
    # Caffe, with the user's markdown bold around the value (BVLC/caffe#4602)
    ("I0818 01:17:15.557899 30915 solver.cpp:228] Iteration 20440, loss = **0.000163291**",
     {"loss": 0.000163291}, {"step": 20440.0}),
    # Time-Series-Library, tab-indented (Secilia-Cxy/SOFTS#10)
    ("\titers: 1600, epoch: 6 | loss: 2.1373572", {"loss": 2.1373572},
     {"step": 1600.0, "epoch": 6.0}),
    # NVIDIA apex's Tacotron 2 example: a name numbered by its iteration (NVIDIA/apex#318)
    ("Validation loss 6312:  0.149928  ", {"Validation loss": 0.149928}, {"step": 6312.0}),
    # Marian: ` : `-separated fields, counters written short with a dot (marian-nmt/marian#120)
    ("[2017-10-18 18:14:31] Ep. 7 : Up. 306350 : Sen. 5630845 : Cost 34.46 : Time 6.91s : "
     "13596.73 words/s", {"Cost": 34.46}, {"step": 306350.0, "epoch": 7.0}),
    # Marian's validation line: the `[valid]` tag makes its cross-entropy an evaluation's
    ("[2019-10-17 17:51:28] [valid] Ep. 2 : Up. 80000 : cross-entropy : 53.9433 : new best",
     {"cross-entropy": 53.9433}, {"step": 80000.0, "epoch": 2.0}),
    # RefineDet: terms whose names differ only by a prefix the grammar would drop
    # (dd604/refinedet.pytorch#1)
    ("iter 50/120000 || ARM_L Loss: 2.9621 ARM_C Loss: 2.7995 ODM_L Loss: nan ODM_C Loss: "
     "12.1341 || ", {"ARM_L Loss": 2.9621, "ARM_C Loss": 2.7995, "ODM_L Loss": NAN,
                     "ODM_C Loss": 12.1341}, {"step": 50.0}),
    # pytorch-CycleGAN-and-pix2pix's visualizer: what follows its head is losses
    ("(epoch: 1, iters: 100, time: 0.189, data: 0.278) G_GAN: 2.261 G_L1: 40.529 D_real: 0.056 "
     "D_fake: 0.233 ", {"loss_G_GAN": 2.261, "loss_G_L1": 40.529, "loss_D_real": 0.056,
                        "loss_D_fake": 0.233}, {"epoch": 1.0, "step": 100.0}),
    # BasicSR's logger: a counter with thousands separators
    ("INFO: [SRNet..][epoch:  7, iter:  12,500, lr:(1.000e-04,)] [eta: 2:10:05, time (data): "
     "0.251 (0.003)] l_pix: 2.3125e-02", {"l_pix": 0.023125}, {"epoch": 7.0, "step": 12500.0}),
    # a value alone in brackets, a list of one printed as is (after bracketed log fields)
    ("[2024-03-02 09:15:00,120][train.py][INFO] Loss:[0.5125]", {"Loss": 0.5125}, {}),
    # its releases before 2018 print no data time
    ("(epoch: 3, iters: 400, time: 0.212) G_GAN: 1.250 G_L1: 35.500 D_real: -0.375 ",
     {"loss_G_GAN": 1.25, "loss_G_L1": 35.5, "loss_D_real": -0.375},
     {"epoch": 3.0, "step": 400.0}),
    # a line of a pretty-printed JSON record, its name quoted (facebookresearch/audiocraft#212)
    ('      "grad_norm": 1.315651535987854,', {"grad_norm": 1.315651535987854}, {}),
])
def test_a_pasted_line_gives_its_values_and_counters(line: str, values: dict[str, float],
                                                     counters: dict[str, float]) -> None:
    found, numbering = parse_line(line)
    numbering = {k: v for k, v in numbering.items() if not k.startswith("_")}
    assert set(found) >= set(values), found
    for name, value in values.items():
        assert same([found[name]], [value]), (name, found[name])
    for name, value in counters.items():
        assert numbering.get(name) == value, numbering


def test_units_and_percentages_are_not_values() -> None:
    found, _ = parse_line("steps:  41% | loss 1.5, time 1099.34ms, mfu 15.34%, 1.24s/it")
    assert found == {"loss": 1.5}


# -- whole pasted logs ----------------------------------------------------------------------------
HF_CONSOLE = """\
{'loss': 1.968, 'grad_norm': nan, 'learning_rate': 7.116424708226588e-09, 'epoch': 0.0}
{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 7.116424708226588e-08, 'epoch': 0.0}
{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 1.4232849416453175e-07, 'epoch': 0.0}
{'train_runtime': 12.5, 'train_samples_per_second': 3.1, 'train_loss': 0.6, 'epoch': 0.0}
"""


def test_hf_console_lines_are_rows_numbered_from_1(tmp_path: Path) -> None:
    """Lines without a step counter (the Trainer prints none) are rows 1, 2, ... named with
    their epoch; the closing totals are not a row; 0.0 beside NaN is a NaN window."""
    result = analyze(write(tmp_path / "paste.txt", HF_CONSOLE))
    log = result.log
    assert log is not None and log.format == "text:generic" and log.step_unit == "row"
    assert log.steps == [1, 2, 3]
    assert log.label(1) == "row 2 (epoch 0)"
    assert (result.verdict, result.kind, result.onset) == ("degraded", "nan", "row 1 (epoch 0)")


LLAMA_FACTORY = """\
03/12/2024 11:24:33 - INFO - llmtuner.extras.callbacks - {'loss': 2.1000, 'learning_rate': 4.9999e-02, 'epoch': 0.01}
{'loss': 2.1, 'grad_norm': 1.5, 'learning_rate': 0.04999871292419044, 'epoch': 0.01}
03/12/2024 11:24:42 - INFO - llmtuner.extras.callbacks - {'loss': 1.9000, 'learning_rate': 4.9995e-02, 'epoch': 0.02}
{'loss': 1.9, 'grad_norm': 1.2, 'learning_rate': 0.04999485182928687, 'epoch': 0.02}
"""  # noqa: E501 (the lines of hiyouga/LlamaFactory#2810, with finite values)


def test_a_row_printed_by_two_handlers_is_read_once(tmp_path: Path) -> None:
    log = read_log(write(tmp_path / "paste.txt", LLAMA_FACTORY))
    assert log.steps == [1, 2]
    assert log.series["lr"] == [0.04999871292419044, 0.04999485182928687], "the full-precision one"
    assert log.series["grad_norm"] == [1.5, 1.2]


KERAS = """\
Epoch 1/10
9595/9595 [==============================] - 1s - loss: 0.6242 - acc: 0.6295 - val_loss: 0.5265 - val_acc: 0.7470
Epoch 2/10
9595/9595 [==============================] - 1s - loss: nan - acc: 0.4117 - val_loss: nan - val_acc: 0.0000e+00
Epoch 3/10
9595/9595 [==============================] - 1s - loss: nan - acc: 0.0000e+00 - val_loss: nan - val_acc: 0.0000e+00
"""  # noqa: E501


def test_keras_rows_are_named_by_the_epoch_line_before_them(tmp_path: Path) -> None:
    result = analyze(write(tmp_path / "keras.txt", KERAS))
    log = result.log
    assert log is not None and [log.label(i) for i in range(3)] == ["epoch 1", "epoch 2",
                                                                     "epoch 3"]
    assert log.steps == [9595, 19190, 28785], "counted in steps: each row is an epoch's mean"
    assert [e[0] for e in log.evals] == log.steps, "val_* are evaluations"
    assert (result.verdict, result.kind, result.onset) == ("degraded", "nan", "epoch 2")


CAFFE = """\
I0818 01:17:12.052695 30915 solver.cpp:228] Iteration 20420, loss = 0.000200683
I0818 01:17:12.052738 30915 solver.cpp:244]     Train net output #0: loss = 0.000200677 (* 1 = 0.000200677 loss)
I0818 01:17:12.052752 30915 sgd_solver.cpp:106] Iteration 20420, lr = 0.0001
I0818 01:17:15.557899 30915 solver.cpp:228] Iteration 20440, loss = **0.000163291**
I0818 01:17:15.557940 30915 solver.cpp:244]     Train net output #0: loss = 0.000163287 (* 1 = 0.000163287 loss)
I0818 01:17:15.557948 30915 sgd_solver.cpp:106] Iteration 20440, lr = 0.0001
"""  # noqa: E501


def test_lines_without_the_step_belong_to_the_step_before_them(tmp_path: Path) -> None:
    """Caffe prints the iteration's loss, then the net's output without the iteration, then the
    LR: one row per iteration, with all three."""
    log = read_log(write(tmp_path / "caffe.log", CAFFE))
    assert log.steps == [20420, 20440] and log.step_unit == "iteration"
    assert log.series["lr"] == [0.0001, 0.0001]
    assert same(log.series["loss"], [0.000200677, 0.000163287])


def _tf_object_detection(losses: list[float]) -> str:
    """TF2 Object Detection API's `model_lib_v2`: the step on one line, then its losses as a
    dict printed over five lines."""
    return "".join(
        f"I0501 12:00:00.000000 140000 model_lib_v2.py:705] Step {100 * (i + 1)} per-step time "
        f"0.500s\nI0501 12:00:00.000000 140000 model_lib_v2.py:708] "
        f"{{'Loss/classification_loss': {loss / 2},\n 'Loss/localization_loss': {loss / 4},\n "
        f"'Loss/regularization_loss': {loss / 4},\n 'Loss/total_loss': {loss},\n "
        f"'learning_rate': 0.04}}\n" for i, loss in enumerate(losses))


def test_a_dict_printed_over_several_lines_is_one_row_at_the_step_before_it(
        tmp_path: Path) -> None:
    losses = [1.2 - 0.01 * i for i in range(30)]
    losses[20] = math.nan
    result = analyze(write(tmp_path / "train.log", _tf_object_detection(losses)))
    log = result.log
    assert log is not None and log.steps == [100 * (i + 1) for i in range(30)]
    assert same(log.series["loss"], losses), "the total loss, not the first term"
    assert "Loss/total_loss is read as the training loss" in log.notes
    assert (result.verdict, result.kind, result.onset) == ("recovered", "nan", "step 2100")


def test_an_object_that_never_closes_leaves_its_lines_to_be_read_one_by_one(
        tmp_path: Path) -> None:
    """A pasted JSON file whose outer object is cut: the records inside it are read."""
    records = "".join(f'    {{"loss": {2.0 - 0.05 * i}, "step": {10 * (i + 1)}}},\n'
                      for i in range(pasted.OBJECT_LINES + 10))
    text = 'the log_history of my trainer_state.json:\n{\n  "log_history": [\n' + records
    log = read_log(write(tmp_path / "state.txt", text))
    assert log.steps == [10 * (i + 1) for i in range(pasted.OBJECT_LINES + 10)]


@pytest.mark.parametrize("head,unit", [
    ("2020-01-20 10:56:56,094 - INFO - Step: {n}", "step"),  # NeMo
    ("[batch={n}/40]:", "batch"),  # Composer, one value a line after it
    ("[2024-05-01 12:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] step={n}, skipped=0, "
     "lr=[0.0001], mom=[(0.9, 0.999)]", "step"),  # DeepSpeed, before the Trainer's dict
])
def test_a_step_given_on_a_line_of_its_own_numbers_the_values_after_it(
        tmp_path: Path, head: str, unit: str) -> None:
    losses = [3.0 - 0.05 * i for i in range(40)]
    losses[30] = math.nan
    body = {"step": "2020-01-20 10:56:56,099 - INFO - Loss: {loss}\n",
            "batch": "\t Train time/batch: {n}\n\t Train loss/train/total: {loss}\n"}
    line = (body[unit] if "Rank 0" not in head
            else "{{'loss': {loss}, 'learning_rate': 0.0001, 'epoch': 0.5}}\n")
    text = "".join(head.format(n=10 * (i + 1) if unit == "step" else i + 1) + "\n"
                   + line.format(loss=loss, n=i) for i, loss in enumerate(losses))
    result = analyze(write(tmp_path / "train.log", text))
    log = result.log
    assert log is not None and log.step_unit == unit
    assert log.steps == [(10 * (i + 1) if unit == "step" else i + 1) for i in range(40)]
    assert result.onset == f"{unit} {310 if unit == 'step' else 31}"


def test_mmengine_lines_are_named_by_their_epoch_and_iteration(tmp_path: Path) -> None:
    text = "".join(
        f"2023/05/01 12:00:00 - mmengine - INFO - Epoch(train)  [{e}][{b:>3}/200]  "
        f"base_lr: 1.0000e-02 lr: 1.0000e-02  eta: 1:00:00  time: 0.2000  data_time: 0.0100  "
        f"memory: 3000  grad_norm: 1.5  loss: {2.0 - 0.01 * (4 * e + b // 50)}  "
        f"loss_cls: 1.0\n" for e in range(1, 6) for b in (50, 100, 150, 200))
    log = read_log(write(tmp_path / "20230501_120000.log", text))
    assert log.label(0) == "epoch 1, batch 50" and log.label(5) == "epoch 2, batch 100"
    assert log.steps[:5] == [50, 100, 150, 200, 250], "counted across the epochs"


def test_timm_lines_are_named_by_epoch_and_batch_and_its_test_lines_are_evaluations(
        tmp_path: Path) -> None:
    lines = []
    for i in range(24):
        lines.append(f"Train: {i // 4} [{(i % 4) * 100:>4}/400 ({(i % 4) * 25:>3.0f}%)]  "
                     f"Loss: {2.0 - 0.02 * i:#.3g} ({2.0 - 0.02 * i:#.3g})  Time: 0.300s,  "
                     "850.00/s  (0.300s,  850.00/s)  LR: 1.000e-03  Data: 0.010 (0.010)")
        if i % 4 == 3:  # its evaluation, at a loss of another level
            lines.append("Test: [  49/49]  Time: 0.100 (0.200)  Loss:  4.5000 (4.2000)  "
                         "Acc@1: 70.0000 (75.0000)  Acc@5: 90.0000 (93.0000)")
    log = read_log(write(tmp_path / "train.log", "\n".join(lines) + "\n"))
    assert len(log) == 24 and log.label(5) == "epoch 1, batch 100"
    assert max(log.values("loss")) == 2.0 and len(log.evals) == 6


def _caffe_named_output(losses: list[float], first: int, cut: bool) -> str:
    """Caffe's solver lines for a net whose loss layer has its own name: the iteration's loss,
    the net's outputs (a constant and the named loss) without the iteration, then the LR. With
    `cut`, the paste starts inside the first record: its `Iteration N, loss` line is missing."""
    lines = []
    for k, value in enumerate(losses):
        it = first + 100 * k
        lines += [f"I0718 05:{k:02d}:01.970 23375 solver.cpp:218] Iteration {it} (1.00034 iter/s, "
                  f"99.9662s/100 iters), loss = {value}",
                  f"I0718 05:{k:02d}:01.971 23375 solver.cpp:237]     Train net output #0: "
                  "lambda = 5",
                  f"I0718 05:{k:02d}:01.971 23375 solver.cpp:237]     Train net output #1: "
                  f"softmax_loss = {value} (* 1 = {value} loss)",
                  f"I0718 05:{k:02d}:01.972 23375 sgd_solver.cpp:105] Iteration {it}, lr = 0.0001"]
    return "\n".join(lines[1:] if cut else lines) + "\n"


@pytest.mark.parametrize("cut", [False, True])
def test_a_caffe_paste_starting_inside_a_record_numbers_every_row_by_its_iteration(
        tmp_path: Path, cut: bool) -> None:
    """The first record's `Train net output` line, its `Iteration` loss line cut off, takes the
    iteration of the `Iteration N, lr` line that closes it, and its named loss stands for the
    loss (the same value as the `loss = X` of every other record)."""
    losses = [35.8096, 38.7695, 43.6644, 47.6553]
    log = read_log(write(tmp_path / "caffe.log", _caffe_named_output(losses, 23400, cut)))
    assert log.steps == [23400, 23500, 23600, 23700] and log.step_unit == "iteration"
    assert same(log.series["loss"], losses)
    assert log.series["lr"] == [0.0001] * 4


def test_a_named_loss_that_differs_from_the_loss_does_not_stand_for_it(tmp_path: Path) -> None:
    """Only a value that is the loss printed again fills a record without it: an auxiliary loss
    with values of its own leaves that record without a loss."""
    text = ("step 1 aux_loss 9.0\nstep 2 loss 2.0 aux_loss 0.5\nstep 3 loss 1.9 aux_loss 0.4\n"
            "step 4 loss 1.8 aux_loss 0.3\n")
    log = read_log(write(tmp_path / "aux.log", text))
    assert log.steps == [1, 2, 3, 4] and log.series["loss"] == [None, 2.0, 1.9, 1.8]


def test_a_progress_counter_restarting_each_epoch_counts_across_epochs(tmp_path: Path) -> None:
    text = "".join(f"Epoch: [{e}] [{i:4d}/100] loss: {2.0 - e * 0.1 - i / 1000:.4f}\n"
                   for e in range(3) for i in (0, 50))
    log = read_log(write(tmp_path / "epochs.txt", text))
    assert log.steps == [0, 50, 100, 150, 200, 250]
    assert log.label(3) == "epoch 1, batch 50"


def test_a_loss_named_by_its_function_is_the_loss(tmp_path: Path) -> None:
    """A super-resolution trainer prints `[L1: 5.96]` under an `[Epoch E]` line: the loss
    function's own name is the loss, and the run's blow-up is judged on it."""
    values = [5.96, 6.08, 5.98, 5.97, 6.0, 6.06, 2948.0, 3150.1, 3019.9, 2876.3]
    text = "[Epoch 26]\tLearning rate: 1.00e-4\n" + "".join(
        f"[{1600 * (i + 1)}/16000]\t[L1: {v:.4f}]\t65.8+0.4s\n" for i, v in enumerate(values))
    path = write(tmp_path / "sr.txt", text)
    log = read_log(path)
    assert same(log.series["loss"], values)
    assert log.label(6) == "epoch 26, batch 11200"
    result = analyze(path)
    assert (result.verdict, result.kind, result.onset) == ("degraded", "explosion",
                                                           "epoch 26, batch 11200")


def test_perplexity_only_lines_read_as_the_log_of_it(tmp_path: Path) -> None:
    """OpenNMT (Lua) prints a perplexity, no loss: the cross-entropy is its log."""
    text = "".join(f"> Epoch 1 ; Iteration {i}000/77776 ; Learning rate 1.0000 ; Source tokens/s "
                   f"1270 ; Perplexity {p}\n" for i, p in ((74, 14.64), (75, 14.55), (76, 14.46)))
    log = read_log(write(tmp_path / "onmt.txt", text))
    assert log.steps == [74000, 75000, 76000] and log.step_unit == "iteration"
    assert same(log.series["loss"], [math.log(14.64), math.log(14.55), math.log(14.46)])


def test_an_excerpt_from_mid_run_is_not_judged_as_a_start(tmp_path: Path) -> None:
    """Six HF lines at epoch 0.24 (haotian-liu/LLaVA#918, one odd batch): no `bad_start`, the
    one-row outlier is isolated, the run healthy."""
    losses = [0.6623, 0.8022, 4.2653, 0.77, 0.556, 0.8223]
    text = "".join(f"{{'loss': {v}, 'learning_rate': {1.768e-4 - i * 2e-8!r}, 'epoch': 0.24}}\n"
                   for i, v in enumerate(losses))
    result = analyze(write(tmp_path / "paste.txt", text))
    assert result.log is not None and result.log.starts_at_start() is False
    assert result.verdict == "healthy"
    assert "bad_start" not in {e.kind for e in result.events}


def test_a_file_with_no_loss_says_what_was_looked_for(tmp_path: Path) -> None:
    path = write(tmp_path / "notes.txt", "loading\nacc 0.5 - f1 0.2\n")
    with pytest.raises(LogError, match=r"looked for a loss on a line: `loss: 0.53`"):
        read_log(path)


# -- `trainguard analyze -`: a pasted log on standard input ------------------------------------
def _cli(args: list[str], stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainguard", *args], input=stdin, text=True,
                          capture_output=True, timeout=120, check=False)


def test_analyze_reads_a_log_piped_to_it() -> None:
    done = _cli(["analyze", "-", "--json"], HF_CONSOLE)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["path"], result["verdict"], result["kind"]) == ("<stdin>", "degraded", "nan")


def test_analyze_of_an_empty_or_unreadable_pipe_is_one_clear_error() -> None:
    empty = _cli(["analyze", "-"], "")
    assert empty.returncode == 2 and "nothing was read from standard input" in empty.stderr
    prose = _cli(["analyze", "-"], "the loss went up, please help\n")
    assert prose.returncode == 2 and prose.stderr.startswith("trainguard: error: <stdin>: no ")
    assert "Traceback" not in prose.stderr and "trainguard-stdin" not in prose.stderr


def test_a_file_of_bare_counter_and_loss_lines_is_read_as_steps_and_losses(
        tmp_path: Path) -> None:
    # `print(epoch, loss)` pasted as is (HobbitLong/SupContrast#14)
    lines = ["788 41.23225021362305", "789 41.23267364501953", "790 41.23270034790039",
             "791 41.21902847290039", "792 41.21857452392578", "793 nan"]
    log = read_log(write(tmp_path / "pasted.txt", "\n".join(lines) + "\n"))
    assert log.format == "text:columns"
    assert list(log.steps) == [788, 789, 790, 791, 792, 793]
    assert same(log.series["loss"], [41.23225021362305, 41.23267364501953, 41.23270034790039,
                                      41.21902847290039, 41.21857452392578, NAN])


def test_bare_counter_of_a_total_and_loss_lines_are_read_as_steps_and_losses(
        tmp_path: Path) -> None:
    """makemore's `print(f'{i:7d}/{max_steps:7d}: {loss.item():.4f}')`, under the parameter
    count the cell printed first."""
    lines = ["12297"] + [f"{i * 10000:7d}/ 200000: {3.0 - i / 20:.4f}" for i in range(12)]
    log = read_log(write(tmp_path / "cell.txt", "\n".join(lines) + "\n"))
    assert log.format == "text:columns" and list(log.steps) == [i * 10000 for i in range(12)]
    assert log.series["loss"][0] == 3.0 and log.series["loss"][-1] == pytest.approx(2.45)


def test_a_csv_without_its_header_reads_the_second_column_as_the_loss(tmp_path: Path) -> None:
    """timm's summary.csv pasted without its header: epoch, train loss, eval loss, top-1,
    top-5; the guess is said in a note."""
    rows = [f"{200 + i},{4.40 - 0.01 * i},{4.13 + 0.003 * i},{7.7 + 0.01 * i},{24.4}"
            for i in range(9)] + [f"{209 + i},nan,nan,1.0,5.0" for i in range(5)]
    path = write(tmp_path / "summary.txt", "\n".join(rows) + "\n")
    log = read_log(path)
    assert log.format == "text:columns" and list(log.steps) == list(range(200, 214))
    assert log.series["loss"][0] == 4.40 and "second as the loss" in log.notes[0]
    result = analyze(path)
    assert (result.verdict, result.kind, result.onset) == ("degraded", "nan", "step 209")


def test_a_named_counter_over_unnamed_columns_names_the_rows(tmp_path: Path) -> None:
    """A CTR model's prints, `batch: N` then the batch loss, the running mean and the AUC:
    the rows are batches, the second column the loss."""
    rows = [f"batch: {500 + i} {0.61 + 0.01 * (i % 3) if i < 6 else math.nan} "
            f"{0.60 + 0.002 * i:.5f} {0.71 - 0.001 * i:.5f}" for i in range(14)]
    path = write(tmp_path / "train.txt", "\n".join(rows) + "\n")
    log = read_log(path)
    assert log.format == "text:columns" and log.step_unit == "batch"
    assert list(log.steps) == list(range(500, 514)) and log.label(0) == "batch 500"
    result = analyze(path)
    assert (result.verdict, result.kind, result.onset) == ("degraded", "nan", "batch 506")


def test_a_named_counter_after_a_loggers_prefix(tmp_path: Path) -> None:
    """A registration model's logger writes its own name and the time, then `epoch, N` and the
    epoch's values as CSV fields: the rows are epochs, the first value the loss."""
    rows = [f"INFO:RegNet, 2023-05-02 10:{i:02d}:13,512, epoch, {i + 40:04d}, "
            f"{0.31 * 0.96 ** i:.6f}, {0.12 * 0.97 ** i:.6f}, {0.0041:.6f}" for i in range(12)]
    log = read_log(write(tmp_path / "train.log", "\n".join(rows) + "\n"))
    assert log.format == "text:columns" and log.step_unit == "epoch"
    assert list(log.steps) == list(range(40, 52)) and log.values("loss")[0] == 0.31


def test_a_headerless_table_whose_second_column_is_whole_numbers_is_not_read(
        tmp_path: Path) -> None:
    """epoch, number of epochs, LR...: the second column counts something, it is no loss."""
    rows = [f"{35 + i}\t30\t0.0001\t{0.22 - 0.001 * i}" for i in range(8)]
    with pytest.raises(LogError):
        read_log(write(tmp_path / "table.tsv", "\n".join(rows) + "\n"))


@pytest.mark.parametrize("text", [
    "1 0.5\n2 0.4\n3 0.3\n",                                   # too few lines to say anything
    "1 0.5\n2 0.4\n3 0.3\n2 0.2\n5 0.1\n6 0.1\n",             # a first column that goes back
    "1 0.5\n2 0.4\n3 0.3\n4 0.2\n5 0.1\nthe run\nwas\nfine\n",  # more prose than numbers
])
def test_bare_number_lines_that_are_not_a_counter_and_a_loss_are_not_read(
        tmp_path: Path, text: str) -> None:
    with pytest.raises(LogError, match="bare `step loss` lines"):
        read_log(write(tmp_path / "numbers.txt", text))


def test_a_log_of_evaluation_losses_only_judges_them_and_says_so(tmp_path: Path) -> None:
    # NVIDIA/apex#318: the log prints a validation loss per epoch and no training loss
    text = "".join(f"Epoch: {e}\nValidation loss {i}:  {v}  \nEpoch {e} time 30.5 lr 0.001\n"
                   for e, i, v in [(11, 6312, 0.149928), (12, 6838, 0.147172),
                                   (13, 7364, 0.148571), (14, 7890, 0.148049)])
    log = read_log(write(tmp_path / "val.txt", text))
    assert list(log.steps) == [6312, 6838, 7364, 7890]
    assert same(log.series["loss"], [0.149928, 0.147172, 0.148571, 0.148049])
    assert any("no training loss" in note for note in log.notes)


def _marian_validation(entropies: list[float]) -> str:
    """Marian's validation log shape: a `[valid]` cross-entropy line and a BLEU line every
    10000 updates, nothing else."""
    return "".join(
        f"[2019-10-17 17:{i:02d}:28] [valid] Ep. 2 : Up. {80000 + 10000 * i} : cross-entropy : "
        f"{v} : new best\n[2019-10-17 17:{i:02d}:51] [valid] Ep. 2 : Up. {80000 + 10000 * i} : "
        f"bleu : {26.4 - 2 * i} : new best\n" for i, v in enumerate(entropies))


@pytest.mark.parametrize("entropies, verdict, kind, onset", [
    ([53.94, 53.02, 52.15, 52.33, 75.22], "degraded", "explosion", "update 120000"),
    ([53.94, 53.02, 52.15, 52.33, 51.90], "healthy", None, None),
])
def test_a_log_of_tagged_validation_cross_entropies_judges_them(
        tmp_path: Path, entropies: list[float], verdict: str, kind: str | None,
        onset: str | None) -> None:
    """No training loss, only `[valid]` lines: their cross-entropy is the loss judged, one row
    per update counter (the BLEU lines of the same update are no rows)."""
    result = analyze(write(tmp_path / "valid.log", _marian_validation(entropies)))
    log = result.log
    assert log is not None and list(log.steps) == [80000 + 10000 * i for i in range(5)]
    assert same(log.series["loss"], entropies)
    assert any("no training loss" in note for note in log.notes)
    assert (result.verdict, result.kind, result.onset) == (verdict, kind, onset)


def _metrics_column(norms: list[str]) -> str:
    """The `"grad_norm": X,` lines of a metrics JSON cut out of it, then its `"grad_scale"`
    lines, as a user pasted them (facebookresearch/audiocraft#212): no loss anywhere."""
    scales = ["32784.3828125", "36601.85546875", "61685.76171875"]
    return ("".join(f'      "grad_norm": {v},\n' for v in norms) + "\n"
            + "".join(f'      "grad_scale": {v},\n' for v in scales))


def test_lines_holding_a_gradient_norm_and_no_loss_are_the_rows(tmp_path: Path) -> None:
    """fp16 dynamic loss scaling: overflowed steps (Infinity, NaN) between finite norms, each a
    step the scaler skipped, since NaN weights never give a finite norm again: healthy."""
    norms = ["Infinity", "NaN", "1.315651535987854", "NaN", "1.2862744331359863", "NaN", "NaN",
             "1.2918434143066406", "NaN", "1.3084871768951416"]
    result = analyze(write(tmp_path / "metrics.txt", _metrics_column(norms)))
    log = result.log
    assert log is not None and log.format == "text:generic" and len(log) == len(norms)
    assert "loss" not in log.series and "grad_scale" not in log.series
    assert any("holds no loss" in note for note in log.notes)
    assert result.verdict == "healthy", result.evidence


def test_a_gradient_norm_non_finite_to_the_end_of_a_log_without_loss_is_nan(
        tmp_path: Path) -> None:
    norms = ["1.31", "1.29", "1.30", "1.32", "NaN", "NaN", "NaN"]
    result = analyze(write(tmp_path / "metrics.txt", _metrics_column(norms)))
    assert (result.verdict, result.kind, result.onset) == ("degraded", "nan", "row 5")


def test_more_rows_than_a_paste_holds_are_refused_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every row is kept to choose the counter: past the bound the grammar refuses, it does not
    grow without end."""
    monkeypatch.setattr(pasted, "MAX_ROWS", 50)
    path = tmp_path / "console.log"
    path.write_text("".join(f"{{'loss': {2.0 - k / 100}, 'epoch': {k / 10}}}\n"
                            for k in range(51)))
    with pytest.raises(LogError, match=f"{path}: more than 50 rows of free-form log lines"):
        read_log(path)
    path.write_text("".join(f"{{'loss': {2.0 - k / 100}, 'epoch': {k / 10}}}\n"
                            for k in range(50)))
    assert len(read_log(path)) == 50


# -- fairseq: the update counter, and `| valid |` lines as evaluations ---------------------------
FAIRSEQ = """\
2021-05-02 10:01:10 | INFO | train_inner | epoch 001:    100 / 812 loss=7.912, nll_loss=7.1, ppl=137.2, wps=21000.5, num_updates=100, lr=5e-05, gnorm=1.532, loss_scale=128, wall=410
2021-05-02 10:08:40 | INFO | train_inner | epoch 001:    200 / 812 loss=7.305, nll_loss=6.5, ppl=90.5, wps=21011.2, num_updates=200, lr=0.0001, gnorm=1.208, loss_scale=128, wall=860
2021-05-02 10:30:02 | INFO | train | epoch 001 | loss 7.41 | nll_loss 6.6 | ppl 97.0 | num_updates 812 | lr 0.000203 | gnorm 1.3 | loss_scale 128 | wall 2100
2021-05-02 10:30:20 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 6.905 | nll_loss 6.1 | ppl 68.6 | num_updates 812 | best_loss 6.905
2021-05-02 10:38:40 | INFO | train_inner | epoch 002:     88 / 812 loss=7.002, nll_loss=6.2, ppl=73.3, wps=20990.1, num_updates=900, lr=0.000225, gnorm=1.104, loss_scale=128, wall=2600
"""  # noqa: E501


def test_fairseq_rows_are_numbered_by_num_updates_as_the_log_writes_it(tmp_path: Path) -> None:
    log = read_log(write(tmp_path / "train.log", FAIRSEQ))
    assert log.steps == [100, 200, 812, 900]
    assert log.label(2) == "num_updates 812"
    assert log.values("loss")[2] == 7.41  # the training line's loss, not the validation's
    assert [metrics.get("eval_loss") for _, metrics in log.evals] == [6.905]


def test_an_iteration_counter_that_restarts_each_epoch_names_the_rows(tmp_path: Path) -> None:
    """`epoch: 2, iter: 40`: the onset is named as the line names it, not as a row number."""
    lines = []
    for epoch in (1, 2, 3):
        for it in range(20, 101, 20):
            loss = "nan" if (epoch, it) >= (3, 60) else f"{2.0 - 0.1 * epoch - it / 1000:.4f}"
            lines.append(f"2024-05-01 INFO epoch: {epoch}, iter: {it}, loss: {loss}, lr: 0.001")
    result = analyze(write(tmp_path / "train.log", "\n".join(lines) + "\n"))
    assert result.log is not None and result.log.steps[:6] == [20, 40, 60, 80, 100, 120]
    assert result.log.label(4) == "epoch 1, iter 100"
    assert (result.verdict, result.kind, result.onset) == ("degraded", "nan", "epoch 3, iter 60")


@pytest.mark.parametrize("width", [None, 64])
def test_records_printed_on_one_line_or_wrapped_are_cut_at_their_counter(
        tmp_path: Path, width: int | None) -> None:
    """`Epoch #1 Loss: 0.549 Accuracy: 0.72 Epoch #2 Loss: 0.430`: records printed with no
    line break between them (`print(..., end=" ")`), or wrapped at a width by the page they
    were pasted from; each is a row, numbered by its counter."""
    losses = ["0.549081", "0.430481", "0.391200", "nan", "nan", "nan"]
    text = " ".join(f"Epoch #{i} Loss: {v} Accuracy: {0.7 + 0.01 * i:.6f}"
                    for i, v in enumerate(losses, 1))
    if width is not None:
        text = "\n".join(textwrap.wrap(text, width))
    result = analyze(write(tmp_path / "paste.txt", text + "\n"))
    assert result.log is not None and result.log.steps == [1, 2, 3, 4, 5, 6]
    assert same(result.log.values("loss"), [0.549081, 0.430481, 0.3912, NAN, NAN, NAN])
    assert (result.verdict, result.kind, result.onset) == ("degraded", "nan", "epoch 4")


def test_a_line_naming_one_counter_twice_without_counting_up_is_one_record() -> None:
    lines = ["step 100 loss 0.52 (step 100 of 900)"]
    assert list(pasted._records(lines)) == lines


def _diffusers_bar(step: int, loss: float) -> str:
    """A diffusers example's accelerate/tqdm bar at `step` of 1000, with its postfix."""
    return (f"Steps:  {step // 10}%|{'█' * (step // 100)}{' ' * (10 - step // 100)}| "
            f"{step}/1000 [00:{step // 60:02d}<10:00,  1.52it/s, lr=1e-05, step_loss={loss:.3g}]")


def test_a_diffusers_training_bar_is_read_at_its_own_step_counter(tmp_path: Path) -> None:
    """The diffusers examples' bar, refreshed in place (carriage returns) as a file keeps it:
    the loss is `step_loss`, the step the bar's counter, the onset on that counter."""
    losses = [0.1 + 0.01 * (s % 7) if s < 300 else NAN for s in range(1, 401)]
    bars = "\r".join(_diffusers_bar(s, loss) for s, loss in enumerate(losses, start=1))
    result = analyze(write(tmp_path / "train.log", "Steps:   0%|          | 0/1000\r"
                           + bars + "\n"))
    log = result.log
    assert log is not None and log.steps[:3] == [1, 2, 3] and log.steps[-1] == 400
    assert same(log.values("lr")[:2], [1e-5, 1e-5])
    assert (result.verdict, result.kind, result.onset_step) == ("degraded", "nan", 300)


def test_a_counter_named_with_a_word_before_it_numbers_the_rows(tmp_path: Path) -> None:
    """`traing iter: 194` (as a script prints it) counts iterations; `valid step` does not."""
    path = tmp_path / "log.txt"
    path.write_text("".join(f"traing iter: {194 + i}, test accuracy : 0.18, loss : "
                            f"{-0.078 + i / 1000}\n" for i in range(5)))
    log = read_log(path)
    assert log.steps == list(range(194, 199)) and log.step_unit == "iter"
    path.write_text("".join(f"valid step: {i}, loss : {2 - i / 10}\n" for i in range(5)))
    assert read_log(path).step_unit != "step"


def test_a_loss_at_a_step_with_a_spaced_colon(tmp_path: Path) -> None:
    """`Average loss at step 2000 : 4.39983723116` (TensorFlow's word2vec and LSTM tutorials):
    the counter, then a colon with a space before it."""
    assert parse_line("Average loss at step  2000 :  4.39983723116") == (
        {"loss": pytest.approx(4.39983723116)}, {"step": 2000.0, "_spelling": "step"})
    lines = [f"Average loss at step {100 * i} : {3.3 - 0.2 * i} learning rate: 10.0\n"
             f"Minibatch perplexity: {20 - i}\n" for i in range(8)]
    log = read_log(write(tmp_path / "log.txt", "".join(lines)))
    assert log.steps == [100 * i for i in range(8)] and same(
        log.values("loss"), [3.3 - 0.2 * i for i in range(8)])


@pytest.mark.parametrize("line", [
    "Episode {n}\tAverage Score: {r:.2f}",  # a DQN loop's print (Udacity's DRL course)
    "[epoch={n}] reward avg={r:.4f} value avg=1.5",  # a REINFORCE notebook
    "Episode * {n} * Avg Reward is ==> {r}",  # keras.io's DDPG example
])
def test_an_rl_loop_that_prints_only_its_reward_is_read_on_it(tmp_path: Path,
                                                              line: str) -> None:
    """No loss on any line: the reward is what the log says of the run, its level not
    judged; a healthy verdict sums it up."""
    rewards = [-225.0, -176.9, -87.3, -56.2, -66.7, -42.5, 36.5, 48.2, 155.6, 191.3]
    text = "\n".join(line.format(n=100 * (i + 1), r=r) for i, r in enumerate(rewards))
    result = analyze(write(tmp_path / "log.txt", text + "\n"))
    assert result.verdict == "healthy"
    assert any("went from -225 to 191.3" in line for line in result.evidence)
    assert any("its reward is all it says" in note for note in result.notes)


def test_a_reward_that_goes_nan_for_good_breaks_the_run(tmp_path: Path) -> None:
    rewards = [-225.0, -176.9, -87.3, -56.2, -66.7, NAN, NAN, NAN, NAN, NAN]
    text = "\n".join(f"Episode {100 * (i + 1)}\tAverage Score: {r}"
                     for i, r in enumerate(rewards))
    result = analyze(write(tmp_path / "log.txt", text + "\n"))
    assert (result.verdict, result.kind, result.onset) == ("degraded", "nan", "episode 600")


def test_interleaved_ranks_are_read_as_the_lowest_rank(tmp_path: Path) -> None:
    """WeNet prints every rank's own loss of a step (`... loss 12.6 ... rank 0`), in any
    order: read in turn they make a sawtooth; the lowest rank's lines are the run's rows. Its
    `CV Batch` lines are the cross-validation's, not training rows."""
    lines = []
    for step, base in ((203700, 12.6), (203800, 12.1), (203900, 11.8)):
        for rank in (2, 0, 1):
            lines.append(f"2023-01-30 18:47:07,107 DEBUG TRAIN Batch 4/{step} loss "
                         f"{base + 4 * rank:.6f} lr 0.00032621 rank {rank}")
    for rank in (2, 0, 1):
        lines.append(f"2023-01-30 18:49:55,773 DEBUG CV Batch 4/0 loss {28.5 + rank / 100:.6f} "
                     f"history loss 27.95 rank {rank}")
    log = read_log(write(tmp_path / "log.txt", "\n".join(lines) + "\n"))
    assert same(log.values("loss"), [12.6, 12.1, 11.8])
    assert len(log.evals) == 1 and log.evals[0][1]["eval_loss"] == pytest.approx(28.5)


def test_a_line_whose_phase_word_is_an_evaluation_s_is_one(tmp_path: Path) -> None:
    """`Val epoch 0 has acc 0.249 and loss 1.386` between pandas-printed training epochs: the
    phase word before the counter makes it an evaluation, not a training row."""
    text = "".join(f"loss             {1.36 - 0.01 * e:.6f}\naccuracy         0.31\n"
                   f"Val epoch {e} has acc 0.249 and loss 1.386\n" for e in range(4))
    log = read_log(write(tmp_path / "log.txt", text))
    assert same(log.values("loss"), [1.36 - 0.01 * e for e in range(4)])
    assert [metrics["eval_loss"] for _, metrics in log.evals] == [1.386] * 4


def test_an_optical_flow_trainer_s_end_point_error_is_its_loss(tmp_path: Path) -> None:
    """`step: 000100     epe: 32.581` (GMFlow, RAFT): the end-point error is what it trains."""
    text = "".join(f"step: {100 * (i + 1):06d}     epe: {32.6 / (1 + i):.3f}\n" for i in range(8))
    log = read_log(write(tmp_path / "log.txt", text))
    assert log.steps[:2] == [100, 200] and log.values("loss")[0] == pytest.approx(32.6)


def test_a_bracketed_cross_validation_tag_makes_an_evaluation(tmp_path: Path) -> None:
    """WeTTS: `Epoch 0 [CV] progress 290/341 loss 1.02` beside `Epoch 1 [TRAIN] progress ...`."""
    text = "".join(f"Epoch {e} [TRAIN] progress {10 * i}/2754 loss {1.0 - 0.01 * i:.4f}\n"
                   for e in range(2) for i in range(5))
    text += "Epoch 1 [CV] progress 290/341 loss 1.020537\n"
    log = read_log(write(tmp_path / "log.txt", text))
    assert len(log.values("loss")) == 10
    assert log.evals[-1][1]["eval_loss"] == pytest.approx(1.020537)


# -- a loss term that is a mean over no samples --------------------------------------------------
def _two_tasks(path: Path, accuracy_when_nan: str) -> Path:
    """wetts' prosody and polyphone heads (wenet-e2e/wetts#251): each line holds both task losses
    and the total; on every third line the prosody task had no labels in the batch."""
    lines = []
    for i in range(30):
        prosody, acc = ("nan", accuracy_when_nan) if i % 3 == 2 else (f"{0.7 - 0.01 * i:.4f}",
                                                                      f"{0.7 + 0.004 * i:.3f}")
        total = "nan" if prosody == "nan" else f"{1.2 - 0.02 * i:.4f}"
        lines.append(f"Epoch 1 [TRAIN] progress {10 * i}/2754 loss {total} polyphone_loss "
                     f"{0.5 - 0.01 * i:.4f} polyphone_acc {0.8 + 0.005 * i:.3f} "
                     f"prosody_loss {prosody} prosody_acc {acc}")
    return write(path, "\n".join(lines) + "\n")


def test_a_term_nan_beside_its_own_accuracy_nan_is_no_value(tmp_path: Path) -> None:
    result = analyze(_two_tasks(tmp_path / "train.log", "nan"))
    assert result.verdict == "healthy", result.evidence
    assert any("mean over no samples" in note and "prosody_loss" in note
               for note in result.notes), result.notes


def test_a_term_nan_beside_a_finite_accuracy_is_a_nan(tmp_path: Path) -> None:
    result = analyze(_two_tasks(tmp_path / "train.log", "0.1"))
    assert (result.verdict, result.kind) == ("degraded", "nan"), result.evidence


def test_records_printed_over_several_lines_are_one_row_each(tmp_path: Path) -> None:
    """A Faster R-CNN trainer prints each record as a line with the iteration and the total,
    then a line per loss term (ruotianluo/pytorch-faster-rcnn's `iter: 200 / 70000`)."""
    records = []
    for i, (total, box) in enumerate([("0.622355", "0.055740"), ("0.248979", "0.003199"),
                                      ("0.3101", "0.0101"), ("0.2888", "0.0095"),
                                      ("nan", "nan"), ("nan", "nan")]):
        records.append(f"iter: {160 + 20 * i} / 70000, total loss: {total}\n"
                       f" >>> rpn_loss_cls: 0.22{i}\n >>> rpn_loss_box: {box}\n"
                       f" >>> lr: 0.001000\nspeed: 0.167s / iter\n")
    result = analyze(write(tmp_path / "train.log", "".join(records)))
    assert result.rows == 6 and result.interval == 20
    assert (result.verdict, result.kind, result.onset_step) == ("degraded", "nan", 240)


def _average_meter(losses: list[float]) -> str:
    """The ImageNet example's lines every 128 batches: each value beside its running average."""
    lines, total = [], 0.0
    for i, loss in enumerate(losses):
        total += loss
        lines.append(f"Epoch: [1][{5760 + 128 * i}/10010]\tTime 0.427 (2.773)\tData 0.000 "
                     f"(2.393)\tLoss {loss:.4f} ({total / (i + 1):.4f})\tAcc@1 15.625 (9.299)")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("losses, verdict", [
    # single batches' losses swinging 1.25x, as single batches do: no spike
    ([8.42, 8.22, 6.90, 7.05, 6.94, 7.17, 8.67, 7.89, 7.29, 6.64], "healthy"),
    # batches at 4x their neighbours for three rows are a spike all the same
    ([8.42, 8.22, 6.90, 7.05, 6.94, 7.17, 28.7, 27.9, 29.3, 7.29, 6.64], "recovered"),
])
def test_a_loss_printed_beside_its_running_average_is_one_batchs(
        tmp_path: Path, losses: list[float], verdict: str) -> None:
    path = write(tmp_path / "log.txt", _average_meter(losses))
    assert read_log(path).single_batch
    assert analyze(path).verdict == verdict


@pytest.mark.parametrize("line, values", [
    # a sentence's full stop ends the value when the text goes on after a space
    ("[ Fri Apr 14 17:53:34 2023 ] \tMean training loss: 0.0435.  Mean training acc: 99.94%.",
     {"Mean training loss": 0.0435}),
    ("loss: 0.53.", {"loss": 0.53}),
    # more right after the stop is no value's end (a version, an address)
    ("loss: 1.2.3 done", {}),
])
def test_a_full_stop_after_a_value_ends_it(line: str, values: dict[str, float]) -> None:
    found, _ = parse_line(line)
    assert {k: v for k, v in found.items() if "loss" in k.lower()} == values


def test_a_best_so_far_tracker_is_no_value_of_the_run(tmp_path: Path) -> None:
    """`best_mean_loss: inf` before the first evaluation is the tracker's start, not a NaN."""
    text = "".join(f"iter: {100 + 500 * i}  mean_loss: {1.9 - 0.05 * i:.4f}  best_mean_loss: "
                   f"{'inf' if i == 0 else f'{1.9 - 0.05 * (i - 1):.4f}'}\n" for i in range(10))
    path = write(tmp_path / "log.txt", text)
    assert not any(name.startswith("best") for name in read_log(path).series)
    assert analyze(path).verdict == "healthy"


def test_a_loss_numbered_by_its_step_without_a_colon(tmp_path: Path) -> None:
    """NVIDIA's Tacotron 2 prints `Train loss <iteration> <loss> Grad Norm <norm> <s>s/it`: the
    whole number is the step, not the loss; `Validation loss <iteration>:  <loss>` beside it."""
    lines = [f"Train loss {i} {48.2 * 0.6 ** i + 0.3:.6f} Grad Norm {13.5 / (i + 1):.6f} 3.99s/it"
             for i in range(10)]
    lines.insert(1, "Validation loss 0: 37.061010  ")
    log = read_log(write(tmp_path / "log.txt", "\n".join(lines) + "\n"))
    assert log.steps[:3] == [0, 1, 2] and log.values("loss")[0] == 48.5
    assert analyze(write(tmp_path / "b.txt", "\n".join(lines) + "\n")).verdict == "healthy"


def test_a_log_of_scores_only_is_read_and_watched_for_nan(tmp_path: Path) -> None:
    """A super-resolution run's validation lines (BasicSR's logger), no loss printed: the
    scores are the rows, a NaN among them is the run gone NaN, a falling score is not judged."""
    def lines(scores: list[float]) -> str:
        return "".join(f"24-01-15 10:00:00.000 - INFO: <epoch:{99 + 100 * i:3d}, iter: "
                       f"{5000 * (i + 1):7,d}> psnr: {v:.4e}.\n" for i, v in enumerate(scores))
    healthy = read_log(write(tmp_path / "val.log", lines([29.8 + 0.2 * i for i in range(8)]
                                                         + [30.9, 30.2])))
    assert list(healthy.steps) == [5000 * (i + 1) for i in range(10)]
    assert "loss" not in healthy.series and "its scores are all it says" in healthy.notes[0]
    assert analyze(tmp_path / "val.log").verdict == "healthy"
    write(tmp_path / "nan.log", lines([29.8 + 0.2 * i for i in range(8)] + [math.nan] * 3))
    result = analyze(tmp_path / "nan.log")
    assert (result.verdict, result.kind, result.onset) == ("degraded", "nan", "iter 45000")


def test_the_test_set_lines_of_pytorchs_mnist_example_are_evaluations(tmp_path: Path) -> None:
    """pytorch/examples' MNIST: `Train Epoch: 2 [6400/60000 (11%)]` lines, then `Test set:
    Average loss: ...` after each epoch; the test loss is no training row."""
    lines = []
    for epoch in range(1, 6):
        lines += [f"Train Epoch: {epoch} [{b}/60000 ({100 * b // 60000}%)]\tLoss: "
                  f"{2.3 * 0.7 ** (epoch + i / 10):.6f}"
                  for i, b in enumerate(range(0, 60000, 6400))]
        lines += ["", f"Test set: Average loss: {0.03 / epoch:.4f}, Accuracy: "
                      f"{9000 + 100 * epoch}/10000 ({90 + epoch}%)", ""]
    log = read_log(write(tmp_path / "mnist.log", "\n".join(lines) + "\n"))
    assert len(log.steps) == 50 and min(v for v in log.values("loss") if v is not None) > 0.2
    assert [m["eval_Average loss"] for _, m in log.evals] == [0.03, 0.015, 0.01, 0.0075, 0.006]
    # the rows are named as the lines number them: the epoch, then the samples seen in it
    assert log.step_unit == "sample" and log.label(11) == "epoch 2, sample 6400"


def test_a_step_printed_one_value_a_line_is_one_row(tmp_path: Path) -> None:
    """TensorFlowTTS's trainer logs each loss term of a step on a line of its own, the step in
    parentheses and the logger's `(module:line)` on each: the lines of one step are one row."""
    lines = []
    for step in (1200, 1300, 1400):
        for name, value in (("train_stop_loss", 0.21 - step / 1e5),
                            ("train_pitch_loss", 0.09 - step / 1e5),
                            ("train_mel_loss", NAN if step == 1400 else 0.8 - step / 1e4)):
            lines.append(f"2021-05-02 09:14:{step % 60:02d},120 (trainer:642) INFO: "
                         f"(Step: {step}) {name} = {value:.4f}.")
    log = read_log(write(tmp_path / "train.log", "\n".join(lines) + "\n"))
    assert log.steps == [1200, 1300, 1400] and log.step_unit == "step"
    assert same(log.values("train_mel_loss"), [0.68, 0.67, NAN])
    result = analyze(tmp_path / "train.log")
    assert result.kind == "nan" and result.onset == "step 1400", result.evidence


@pytest.mark.parametrize("line, values, counters", [
    # names in brackets before their values, as a couplet model's logger prints them
    ("2020-01-05 11:02:41,330 - __main__ - INFO - [epoch]: 12, [batch]: 3100, [loss]: 3.8817",
     {"loss": 3.8817}, {"epoch": 12.0, "batch": 3100.0}),
    ("[loss]: nan, [step]: 40", {"loss": NAN}, {"step": 40.0}),
    # a progress bar's bracketed prefix holds no value
    ("[train]:  61%|######    | 610/1000 [00:31<00:20,  19.5it/s]", {}, {"progress": 610.0}),
])
def test_a_bracketed_name_before_its_value(line: str, values: dict[str, float],
                                           counters: dict[str, float]) -> None:
    found, numbered = parse_line(line)
    assert same(list(found.values()), list(values.values())) and set(found) == set(values)
    assert {k: v for k, v in numbered.items() if not k.startswith("_")} == counters


@pytest.mark.parametrize("message", [
    "[2024-02-01 09:12:44,102] [INFO] [stage_1_and_2.py:1762:step] [deepspeed] OVERFLOW! Rank 0 "
    "Skipping step. Attempted loss scale: {scale}, reducing to {half}",
    "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {half}",
])
def test_a_loss_scalers_skip_message_marks_the_next_row_skipped(tmp_path: Path,
                                                                 message: str) -> None:
    """DeepSpeed's and apex's overflow messages between plain step lines: a step after one was
    skipped; every step skipped from step 40 to the end is a run that stopped training, not a
    healthy plateau."""
    lines, scale = [], 65536.0
    for step in range(1, 61):
        if step >= 40:
            lines.append(message.format(scale=scale, half=scale / 2))
            scale /= 2
        lines.append(f"step {step} | loss {2.0 - 0.01 * min(step, 40):.4f} | lr 1e-05")
    path = write(tmp_path / "train.log", "\n".join(lines) + "\n")
    log = read_log(path)
    assert log.skipped is not None and log.skipped.index(True) == 39 and all(log.skipped[39:])
    result = analyze(path)
    assert (result.verdict, result.kind, result.onset) == ("degraded", "nan", "step 40")
    assert not any("None" in line for line in result.evidence)


def test_a_very_long_number_on_a_line_is_refused_in_linear_time(tmp_path: Path) -> None:
    """A run of 20,000 digits after `epoch 1` (a dumped array, a hash) that ends in a word: no
    grammar reads it, and the columns grammar gives up at once (it took 36 s with a number
    pattern that split a digit run many ways)."""
    from trainguard.analyze.text import _COLUMNS

    assert _COLUMNS.match("run epoch 1 " + "7" * 20_000 + " x") is None
    assert parse_line("[INFO]: 3 items, [rank0]: 12 done")[0] == {}


def test_a_markdown_heading_over_a_pasted_log_is_no_row(tmp_path: Path) -> None:
    # a README: `### loss NAN` titles the mmdetection console pasted under it
    lines = ["# Detector", "", "### loss NAN", "", "```"]
    for i in range(1, 13):
        loss = "nan" if i >= 6 else f"{1.4 - 0.05 * i:.4f}"
        lines.append(f"2021-01-25 19:25:44,459 - mmdet - INFO - Epoch [1][{50 * i}/5455]\t"
                     f"lr: 4.983e-04, eta: 8:02:25, time: 0.443, loss_rpn_cls: 0.1925, "
                     f"loss: {loss}, grad_norm: 10.6679")
    path = tmp_path / "README.md"
    path.write_text("\n".join([*lines, "```", ""]))
    log = read_log(path)
    assert len(log.steps) == 12 and log.label(0) == "epoch 1, batch 50"
    result = analyze(path)
    assert result.verdict == "degraded" and result.onset == "epoch 1, batch 300"


def test_a_heading_that_holds_a_number_may_be_a_trainers_line(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text("".join(f"### Epoch {i}/10 - loss: {1.9 - 0.1 * i:.3f}\n"
                            for i in range(1, 11)))
    log = read_log(path)
    assert len(log.steps) == 10 and log.values("loss")[9] == pytest.approx(0.9)


def test_a_value_before_its_loss_word_is_the_loss(tmp_path: Path) -> None:
    """Neon's progress bar writes the cost after its value: `118/118  batches, 0.419 cost`."""
    lines = [f"Epoch {i}   [Train |####################|  117/117  batches, "
             f"{0.42 * 0.85 ** i:.3f} cost, 0.93s]" for i in range(10)]
    path = write(tmp_path / "neon.txt", "\n".join(lines) + "\n")
    log = read_log(path)
    assert log.values("loss")[0] == 0.42 and log.label(0) == "epoch 0"
    assert analyze(path).verdict == "healthy"
    assert parse_line("step 3 | 2.31 loss | lr 0.1")[0] == {"loss": 2.31, "lr": 0.1}
    # a loss named the usual way round keeps it: the value after `loss` is not read again
    assert parse_line("loss: 0.5, 0.7 cost")[0] == {"loss": 0.5}


def test_numpy_savetxt_columns_number_the_rows_by_their_whole_first_column(
        tmp_path: Path) -> None:
    """`np.savetxt("loss.dat", np.column_stack([steps, losses, ...]))` writes every number as
    `1.000000000000000000e+03`: the first column, whole numbers, is the step."""
    rows = [f"{i * 1000:.18e} {5.0 * 0.8 ** i:.18e} {0.3:.18e}" for i in range(12)]
    path = write(tmp_path / "loss.dat", "\n".join(rows) + "\n")
    log = read_log(path)
    assert log.format == "text:columns" and list(log.steps) == [i * 1000 for i in range(12)]
    assert log.values("loss")[1] == pytest.approx(4.0)
    fractional = [f"{i * 0.5 + 0.25:.6e} {1.0 - 0.01 * i:.6e}" for i in range(12)]
    with pytest.raises(LogError):  # a first column of fractions counts nothing
        read_log(write(tmp_path / "fractions.dat", "\n".join(fractional) + "\n"))


def test_a_price_or_a_sentence_before_the_loss_word_is_no_loss() -> None:
    assert parse_line("step 3 | tokens 1532 | $0.0042 cost")[0] == {"tokens": 1532.0}
    assert "loss" not in parse_line("WARNING: skipping batch with nan loss")[0]
    assert parse_line(" " + "1" * 100_000 + "x")[0] == {}  # in linear time


def test_a_bare_column_counter_keeps_every_digit(tmp_path: Path) -> None:
    rows = [f"{1714560000123456789 + i} {1.0 - 0.01 * i:.4f}" for i in range(12)]
    log = read_log(write(tmp_path / "loss.txt", "\n".join(rows) + "\n"))
    assert log.steps[0] == 1714560000123456789


@pytest.mark.parametrize("lines, unit, steps, label", [
    # char-rnn: the step of the planned steps, then the epoch it reached
    ([f"{s}/9500 (epoch {s / 190:.3f}), train_loss = {2.5 - s / 1e4:.8f}, grad/param norm = "
      "7.6e-02, time/batch = 0.168s" for s in range(228, 240)], "step", list(range(228, 240)),
     "step 230"),
    # a DQN's printed progress, spaced around the slash
    ([f"{s} / 1000000 eps 0.899 |  avgR -0.997 | Loss {1e-2 + s % 7 * 1e-3:.3e} | Grad 5.6e-03"
      for s in range(51000, 57000, 500)], "step", list(range(51000, 57000, 500)), "step 52000"),
])
def test_a_bare_step_of_its_total_at_the_head_of_a_line_numbers_the_rows(
        tmp_path: Path, lines: list[str], unit: str, steps: list[int], label: str) -> None:
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    log = read_log(path)
    assert (log.step_unit, log.steps) == (unit, steps)
    assert log.label(2) == label


@pytest.mark.parametrize("line, step", [
    ("25/25 \u2501\u2501\u2501\u2501\u2501\u2501 1s 3ms/step - accuracy: 0.51 - loss: 0.7088",
     None),
    ("1875/1875 - 3s - loss: 0.3012 - 3s/epoch - 2ms/step", None),  # Keras 2, verbose=2
    ("12/05 10:00:01 loss: 0.71", None),  # a date's day and month, the day past the month
    ("05/12 10:00:01 step 100 loss: 0.7", 100.0),  # a date, then the line's own step
    ("0/8 step 100 loss 0.5", 100.0),  # the step the line names
])
def test_a_progress_bar_a_date_or_a_named_step_overrules_the_head_of_a_line(
        line: str, step: float | None) -> None:
    _, counters = parse_line(line)
    assert counters.get("step") == step


@pytest.mark.parametrize("lines", [
    [f"Test: [{10 * i}/200] | val_acc {0.2 + 0.7 * (i % 3) / 2:.3f}" for i in range(20)],
    [f"fold {i} val_acc {a}" for i, a in enumerate([0.9, 0.91, 0.88, 0.4, 0.42])],
    [f"trial {i} | lr {10 ** -i:g} | val_acc {a}" for i, a in
     enumerate([0.5, 0.6, 0.7, 0.1, 0.1, 0.1])],
])
def test_scores_of_an_evaluation_loop_folds_or_a_sweep_are_no_run(
        tmp_path: Path, lines: list[str]) -> None:
    path = tmp_path / "evals.log"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(LogError):
        read_log(path)


def test_a_validations_scores_alone_are_the_rows(tmp_path: Path) -> None:
    """`epoch 5 | val_acc 0.102`: a log of evaluations only is judged on its quality metric."""
    accs = [0.412, 0.533, 0.611, 0.648, 0.102, 0.1, 0.1]
    path = tmp_path / "evals.log"
    path.write_text("".join(f"epoch {e} | val_acc {a} | val_f1 {a - 0.01:.3f}\n"
                            for e, a in enumerate(accs, start=1)))
    result = analyze(path)
    assert (result.verdict, result.kind, result.onset) == ("degraded", "explosion", "epoch 5")
    assert result.causes == []  # a metric's cliff alone tells no cause from another
    assert any("holds no loss" in note for note in result.notes)
