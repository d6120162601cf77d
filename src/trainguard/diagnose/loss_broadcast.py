"""A regression loss that broadcast the predictions against targets of another shape.

`F.mse_loss(pred, y)` with `pred` of shape (N, 1), the usual output of a last `nn.Linear(h, 1)`,
and `y` of shape (N,), as a dataset of scalars gives it, does not fail: both are broadcast to
(N, N), and every prediction is scored against every target of the batch. The best the model
can do under that loss is to predict the batch's mean target for every input, so the loss
falls to the targets' variance and stays there: training runs, the loss looks like a plateau,
nothing is learned about the inputs. PyTorch says so once in a `UserWarning` among the others;
the loss's autograd graph says it for sure: `mse_loss` (and `smooth_l1_loss`, `huber_loss`,
`l1_loss`, which broadcast the same way) records the prediction's broadcast as an expand node
right before the loss, with the shape it came from and the shape it went to. Read once, with
`double_activation`, at the first step whose loss has a graph (after the backward too: the
sizes are kept when the saved tensors are freed).

Told only for the outer comparison, n predictions broadcast to n x n values: a prediction
broadcast against targets of a larger shape (one learned vector fitted to a batch of them, a
centroid) scores each target once and is not told.
"""

from __future__ import annotations

from typing import Any

from trainguard.diagnose.double_activation import COMBINERS, RESHAPES, VISITED
from trainguard.finding import Finding

LOSSES = frozenset({"MseLossBackward0", "SmoothL1LossBackward0", "HuberLossBackward0"})
"""Loss nodes whose first input is the prediction, broadcast (an expand node) when the
target's shape differed."""
L1 = "AbsBackward0"
"""`l1_loss`: the absolute value of the broadcast difference (`SubBackward0`), then a mean."""
EXPAND = "ExpandBackward0"


def loss_broadcast(loss: Any) -> Finding | None:
    """The finding when a regression loss in the graph nearest `loss` compared predictions
    and targets broadcast against each other; None otherwise (no graph, or none found among
    the `VISITED` nodes nearest the loss, through sums, means, weights and reshapes)."""
    root = getattr(loss, "grad_fn", None)
    queue = [root] if root is not None else []
    seen = 0
    while queue and seen < VISITED:
        node = queue.pop(0)
        seen += 1
        name = type(node).__name__
        if name in LOSSES or name == L1:
            shapes = _outer(node if name in LOSSES else _first_input(node, "SubBackward0"))
            if shapes is not None:
                return _finding(*shapes)
            continue  # the loss's input: the model's side, not looked into
        if name in COMBINERS or name in RESHAPES:
            queue.extend(n for n, _ in getattr(node, "next_functions", ()) if n is not None)
    return None


def _first_input(node: Any, kind: str) -> Any:
    """The node's first input when it is a `kind` node; None otherwise."""
    inputs = getattr(node, "next_functions", ())
    inner = inputs[0][0] if inputs else None
    return inner if inner is not None and type(inner).__name__ == kind else None


def _outer(node: Any) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(the prediction's shape, the shape both were broadcast to) when `node`'s first input is
    the prediction expanded from n values to n x n (the outer comparison of (N, 1) against
    (N,), either way round); None otherwise. Read from the expand node's sizes, which outlive
    the backward (the saved tensors do not)."""
    expand = _first_input(node, EXPAND) if node is not None else None
    metadata = getattr(expand, "_input_metadata", None)
    if expand is None or not metadata:
        return None
    prediction = tuple(int(s) for s in expand._saved_self_sym_sizes)
    broadcast = tuple(int(s) for s in metadata[0].shape)
    count = _numel(prediction)
    return ((prediction, broadcast) if count > 1 and _numel(broadcast) == count * count
            else None)


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _finding(prediction: tuple[int, ...], broadcast: tuple[int, ...]) -> Finding:
    said_prediction, said_broadcast = _shape(prediction), _shape(broadcast)
    return Finding(
        "loss_broadcast", "warning",
        f"the loss compared predictions of shape {said_prediction} with targets of another "
        f"shape, and broadcast both to {said_broadcast}: every prediction is scored against "
        "every target of the batch, so the best the model can do is predict the batch's mean "
        "target whatever the input, and the loss stalls at the targets' variance.",
        "give the predictions and the targets the same shape (pred.squeeze(-1), or "
        "y.view_as(pred)) before the loss.",
        cause="loss_broadcast",
        evidence={"prediction_shape": list(prediction), "broadcast_shape": list(broadcast)})


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
