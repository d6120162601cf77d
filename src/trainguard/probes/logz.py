"""log Z of the model's class scores, step by step: a light forward hook on the model itself.

Metric keys (one value each per step; registered in `trainguard.registry`):
    logz_mean   mean over positions (samples x positions) of logsumexp over the class scores
    logz_max    their maximum
    ce_ceiling  the maximum over positions of logsumexp minus the smallest class score: the
                most a cross-entropy of these scores can cost, whatever the target

log Z = logsumexp(logits) is the softmax's normaliser. Cross-entropy only pins the logits'
differences, so nothing in the loss holds log Z: when the output logits grow without bound (an
output head's LR past what it can take, tokens the model can fit ever more confidently, no
z-loss or soft cap) log Z grows with them, and the loss spikes once updates multiplied by those
logits overshoot (on the `logit_growth` scenarios the largest position's log Z stood 3-6 nats
above its level 10-20 steps before the loss spiked). A z-loss, 1e-4 * log Z^2, holds the mean
near 0 (PaLM, Chowdhery et al. 2022). The growth is a trend over tens of steps, so the detector
needs a point every step, not one every `probes.sample_every` steps.

The cross-entropy of a target t at one position is log Z - z_t, at most log Z - min(z): no
target, right or wrong, costs more under the scores the model made. A loss above the ceiling of
every position was not computed from those scores alone (`diagnose/loss_bound.py`). It costs one
min over the rows the logsumexp reads.

Why every step, through its own hook (not the sampled output probe): the logits exist already
(the model made them); the hook takes one logsumexp over at most `MAX_ROWS` of their rows (the
positions, evenly strided) and keeps their log Z and smallest score on the device, which ride
the step's one transfer. Measured on one CPU thread against a step of the GPT-2 workload of
`benchmarks/overhead.py` (8 x 128 positions, 8192 classes; a 1.7-2.0 s step on the shared
machine): logsumexp over all 1024 positions took 38-60 ms (2.3-2.9% of the step: too much for
every step), over 256 of them 3.7-8.6 ms (0.22-0.42%), over 64 of them 0.9 ms (4.6 ms for 256
in the same run). With the other every-step probes, 256 of them left the Guard above 1% of the
step, so the budget is in values, `MAX_ELEMENTS` (64 positions of that vocabulary), and 256
positions at most: a small vocabulary keeps 256 positions (with 64 of its 512, two of the
`logit_growth` family's healthy twins warned on seed 0 of seeds 0-5; with 256, none), a large
one at least `MIN_ROWS`. The largest and the mean log Z of the strided positions follow the
trend the detector reads (log Z grows at every position alike when the output logits grow),
and the ceiling a loss is judged against keeps its factor-2 margin (`diagnose/loss_bound.py`).

Cost: one logsumexp over at most `MAX_ROWS` positions and about `MAX_ELEMENTS` values, a min
over the same values, a subtraction and a concatenation, on the device: at most 512 values join
the step's pack as one tensor, and the mean and the two maxima are taken on the host
(`logz_values`); on a 512-512-10 MLP's step (64 positions, one CPU thread) the hook took 44 us
where the five reductions and the stack it had before took 66 us, and 12 us more under
`torch.no_grad()`, which a detached tensor does not need. Scores that few (`HOST_VALUES`, after
the striding) are copied as they are instead, one operator call, and reduced on the host
(`host_rows`). On the steps the precursor's cadence skips
(`detectors.instability_precursor.every`: far from every bound, no event) the hook is disarmed
and returns at once.

Class scores are a floating B x C or B x T x V output with C >= 2 (what the output probe calls
class scores); anything else (a regression's B x 1, an image) is left alone. The hook never
raises into the user's forward pass.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from torch import nn

from trainguard.probes.activations import training_forward
from trainguard.probes.outputs import model_output_tensor

log = logging.getLogger("trainguard")

LOGZ_KEYS = ("logz_mean", "logz_max", "ce_ceiling")
MAX_ROWS = 256
"""At most this many positions enter the logsumexp (evenly strided): its cost stays a small,
fixed share of a step whatever the batch and sequence length."""
MAX_ELEMENTS = 1 << 19
"""At most about this many class scores enter it, whatever the vocabulary (fewer positions for
a large one)..."""
MIN_ROWS = 16
"""...but never fewer positions than this."""
HOST_VALUES = 4096
"""Class scores read this few (after the striding) ride the step's transfer as they are, and log
Z is taken of them on the host (`host_rows`): the device's two reductions are some ten operator
calls, which on a small model's step cost more than the values they would save from the
transfer (on the MLP of `benchmarks/overhead.py`, 64 x 10 scores, one CPU thread: 180-250 us in
the forward hook against about 20 us of NumPy)."""


def logz_rows(t: torch.Tensor) -> torch.Tensor | None:
    """The log Z of each position read (logsumexp over the last dimension of class scores),
    then each one's log Z minus its smallest score, as one float32 tensor on the tensor's device
    (2 x positions values); None for an output that is not class scores. Two reductions, a
    subtraction (in the scores' precision: float64 scores of 1e8 keep their differences) and a
    concatenation: the three values of `LOGZ_KEYS` are taken from them on the host
    (`logz_values`), after the step's one transfer, where a mean and two maxima of a few
    hundred values cost less than the operator calls that would make them on the device."""
    if t.dim() not in (2, 3) or t.shape[-1] < 2 or not t.is_floating_point() or not t.numel():
        return None
    rows = t.detach().reshape(-1, t.shape[-1])
    most = max(MIN_ROWS, min(MAX_ROWS, MAX_ELEMENTS // rows.shape[1]))
    if rows.shape[0] > most:
        rows = rows[::-(-rows.shape[0] // most)]  # evenly strided: no copy
    if rows.dtype not in (torch.float32, torch.float64):
        rows = rows.float()  # half precision: exp and its sum in float32
    logz = torch.logsumexp(rows, dim=-1)
    return torch.cat([logz, logz - rows.amin(dim=-1)]).float()


def host_rows(scores: np.ndarray, classes: int) -> np.ndarray:
    """`logz_rows` of class scores read as they are (`classes` to a position), on the host in
    float64: the same values, NaN, inf and -inf as the device's logsumexp gives them."""
    rows = np.asarray(scores, dtype=np.float64).reshape(-1, classes)
    top = np.maximum.reduce(rows, axis=1)  # (ufuncs: the methods' bookkeeping costs more here)
    if np.isfinite(top).all():  # the usual step: nothing to warn of, no context to enter
        logz = np.log(np.add.reduce(np.exp(rows - top[:, None]), axis=1)) + top
        return np.concatenate([logz, logz - np.minimum.reduce(rows, axis=1)])
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        shift = np.where(np.isinf(top), 0.0, top)  # as torch.logsumexp: inf - inf is no NaN
        logz = np.log(np.add.reduce(np.exp(rows - shift[:, None]), axis=1)) + shift
        return np.concatenate([logz, logz - np.minimum.reduce(rows, axis=1)])


def logz_values(rows: np.ndarray, classes: int | None = None) -> dict[str, np.ndarray]:
    """`LOGZ_KEYS` from `logz_rows`' values on the host (one value each, float64): the mean and
    the largest log Z over the positions, and the largest log Z minus smallest score of a
    position (`ce_ceiling`). A NaN among them is kept (a max or a mean of it is NaN).
    `classes`: `rows` are the class scores themselves, that many to a position (`host_rows`)."""
    if classes is not None:
        finite = _finite_scores_values(rows, classes)
        if finite is not None:
            return finite
        rows = host_rows(rows, classes)
    half = len(rows) // 2
    logz = rows[:half]
    # the reductions as ufuncs: `ndarray.mean`'s own bookkeeping cost more than its sum here
    with np.errstate(invalid="ignore"):  # -inf and inf among them: NaN, as on the device
        values = np.array([np.add.reduce(logz) / half, np.maximum.reduce(logz),
                           np.maximum.reduce(rows[half:])])
    return {key: values[i:i + 1] for i, key in enumerate(LOGZ_KEYS)}


def _finite_scores_values(scores: np.ndarray, classes: int) -> dict[str, np.ndarray] | None:
    """`logz_values` of class scores whose every position's largest score is finite (the usual
    step), in the same arithmetic as `host_rows` and `logz_values` (the same values to the
    bit) and half their NumPy calls: right after a step's backward these run cold, some 5 us
    each (on the MLP of `benchmarks/overhead.py`, 64 x 10 scores, 59-79 us against 111-145 us
    in one training loop). None: a largest score is not finite, for `host_rows`."""
    rows = np.asarray(scores, dtype=np.float64).reshape(-1, classes)
    top = np.maximum.reduce(rows, axis=1)
    if not np.isfinite(top).all():
        return None
    logz = np.log(np.add.reduce(np.exp(rows - top[:, None]), axis=1)) + top
    values = np.array([np.add.reduce(logz) / len(logz), np.maximum.reduce(logz),
                       np.maximum.reduce(logz - np.minimum.reduce(rows, axis=1))])
    return {key: values[i:i + 1] for i, key in enumerate(LOGZ_KEYS)}


class LogZProbe:
    """A forward hook on the model for the life of the run (`close` removes it): the last
    training forward of a step counts, as for the output probe."""

    def __init__(self, model: nn.Module) -> None:
        self.armed = True
        """Whether the next forward is measured (the precursor's cadence,
        `detectors.instability_precursor.every`); a forward of a step not measured costs nothing."""
        self._rows: torch.Tensor | None = None
        self._classes: int | None = None
        """The scores per position of `_rows` when they are the scores themselves (None: log Z
        was taken on the device)."""
        self.taken_classes: int | None = None
        """`_classes` of what `take` returned last, which `values` reads."""
        self._handle: torch.utils.hooks.RemovableHandle | None = (
            model.register_forward_hook(self._hook))

    def _hook(self, module: nn.Module, inputs: Any, output: Any) -> None:
        if not self.armed or not training_forward(module):
            return
        try:
            tensor = model_output_tensor(output)
            if tensor is not None:  # detached: no graph is recorded
                self._rows, self._classes = _host_scores(tensor) or (logz_rows(tensor), None)
        except Exception as exc:  # never break the user's forward pass
            self._rows, self._classes = None, None
            log.debug("trainguard: log Z probe skipped (%s)", exc)

    def take(self) -> torch.Tensor | None:
        """The step's `logz_rows`, or the scores themselves when they are few, as one tensor
        (None when no class scores were seen since the last call): what the step's pack adds in
        one piece, read on the host with `values`."""
        rows, self._rows = self._rows, None
        self.taken_classes = self._classes
        return rows

    def values(self, host: np.ndarray) -> dict[str, np.ndarray]:
        """`LOGZ_KEYS` from what `take` returned last, read on the host."""
        return logz_values(host, self.taken_classes)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self._rows = None


def _host_scores(t: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """The class scores `logz_rows` reads, as they are (flat, `HOST_VALUES` at most, float32)
    with the classes of a position, when they are few enough for the host and float32 or
    narrower (a float32 transfer keeps them; float64 scores keep the device's reductions); None
    else. Always a copy, in one operator call: the forward's scores are read even if the loop
    writes its logits in place later (a mask, a temperature), and the output's storage is not
    held through the backward."""
    if (t.dim() not in (2, 3) or t.shape[-1] < 2 or not t.is_floating_point()
            or t.dtype is torch.float64 or not t.numel()):
        return None
    classes = t.shape[-1]
    positions = t.numel() // classes
    most = max(MIN_ROWS, min(MAX_ROWS, MAX_ELEMENTS // classes))
    stride = -(-positions // most) if positions > most else 1
    if -(-positions // stride) * classes > HOST_VALUES:  # before any copy of a large output
        return None
    rows = t.detach().reshape(-1, classes)[::stride]
    return rows.reshape(-1).to(torch.float32, copy=True), classes
