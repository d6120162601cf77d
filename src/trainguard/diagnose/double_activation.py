"""A loss that applies its own softmax (or sigmoid) to outputs that already went through one.

`F.cross_entropy` takes logits and applies `log_softmax` itself; a model whose last layer is an
`nn.Softmax` hands it probabilities, and the loss becomes log_softmax(softmax(z)): the scores it
sees lie in [0, 1], the loss cannot fall below ln(1 + (C - 1)/e) (1.46 for 10 classes) and its
gradients shrink as the model grows sure, so training crawls without ever failing. The same
holds for `binary_cross_entropy_with_logits` on a sigmoid's outputs. Nothing in the numbers says
it for sure; the loss's own autograd graph does: the loss node's input, through ops that only
reshape or cast, is a softmax's (or a sigmoid's) output. Read once, at the first step whose loss
has a graph (a few Python attribute reads), and told as a warning finding. A compiled model
(`torch.compile`: one node for the whole graph) or a reentrant activation checkpoint around the
last layer hides its softmax, and is not told.
"""

from __future__ import annotations

from typing import Any

from trainguard.finding import Finding

RESHAPES = frozenset({"ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0",
                      "TransposeBackward0", "PermuteBackward0", "ToCopyBackward0",
                      "CloneBackward0", "SqueezeBackward0", "SqueezeBackward1",
                      "UnsqueezeBackward0", "ExpandBackward0", "SliceBackward0",
                      "SelectBackward0", "IndexBackward0", "ContiguousBackward0",
                      "_DDPSinkBackward"})
"""Autograd nodes that move values without changing them (DDP's sink, which it puts between
the loss and the output under `find_unused_parameters` or `static_graph`, included)."""
LOSSES = {"LogSoftmaxBackward0": ("SoftmaxBackward0", "cross_entropy", "softmax", "nn.Softmax"),
          "BinaryCrossEntropyWithLogitsBackward0": ("SigmoidBackward0",
                                                    "binary_cross_entropy_with_logits",
                                                    "sigmoid", "nn.Sigmoid")}
"""The node a loss applies its activation with -> the node of that activation already applied,
the loss's name, the activation's, its module's."""
VISITED = 32
"""Nodes looked at back from the loss (the sum of several losses, their reductions, reshapes):
never deep into the model."""


def _input(node: Any) -> Any:
    """What a loss node's input (its first argument: a target that needs a gradient is its
    second) came from, past reshapes and casts; None when the input needs no gradient."""
    for _ in range(VISITED):
        inputs = getattr(node, "next_functions", ())
        node = inputs[0][0] if inputs else None
        if node is None or type(node).__name__ not in RESHAPES:
            return node
    return None


def double_activation(loss: Any) -> Finding | None:
    """The finding when the loss's graph applies an activation twice; None otherwise (no graph,
    or none found among the `VISITED` nodes nearest the loss)."""
    root = getattr(loss, "grad_fn", None)
    queue, seen = ([root] if root is not None else []), 0
    while queue and seen < VISITED:
        node = queue.pop(0)
        seen += 1
        name = type(node).__name__
        if name in LOSSES:
            inner = _input(node)
            if inner is not None and type(inner).__name__ == LOSSES[name][0]:
                return _finding(*LOSSES[name][1:])
            continue  # the loss's input: the model's side, not looked into
        queue.extend(n for n, _ in getattr(node, "next_functions", ()) if n is not None)
    return None


def _finding(loss_name: str, activation: str, module: str) -> Finding:
    return Finding(
        "double_activation", "warning",
        f"the loss applies {activation} to outputs that already went through one: {loss_name} "
        f"(or its nn module) computes its own {activation}, and the model's last step is a "
        f"{activation} too, so the loss sees squashed scores, cannot fall to 0 and trains ever "
        "more slowly as the model grows sure.",
        f"drop the model's final {module} while training (hand the loss the logits), and apply "
        f"{activation} only to read probabilities.",
        cause="double_activation", evidence={"activation": activation, "loss": loss_name})
