"""A loss that applies its own softmax (or sigmoid) to outputs that already went through one.

`F.cross_entropy` takes logits and applies `log_softmax` itself; a model whose last layer is an
`nn.Softmax` hands it probabilities, and the loss becomes log_softmax(softmax(z)): the scores it
sees lie in [0, 1], the loss cannot fall below ln(1 + (C - 1)/e) (1.46 for 10 classes) and its
gradients shrink as the model grows sure, so training crawls without ever failing. The same
holds for `binary_cross_entropy_with_logits` on a sigmoid's outputs, and for either loss on the
other's squashing (a sigmoid before `cross_entropy`, a softmax before the logits BCE). Its
cousin: `nll_loss` takes log-probabilities, and fed a softmax's probabilities its loss is
-p[y], bounded in [-1, 0] with gradients that vanish as p grows sure; fed a linear layer's raw
scores, -z[y], it falls without bound, and its fall says nothing of what is learned (finding
`nll_input`). Nothing in the numbers says it for sure; the loss's own autograd graph does: the
loss node's input, through ops that only reshape or cast, is a softmax's (or a sigmoid's, or a
linear layer's) output. Read once, at the first step whose loss has a graph (a few Python
attribute reads), and told as a warning finding. A compiled model (`torch.compile`: one node for
the whole graph) or a reentrant activation checkpoint around the last layer hides its softmax,
and is not told.
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
ACTIVATIONS = {"SoftmaxBackward0": ("softmax", "nn.Softmax"),
               "SigmoidBackward0": ("sigmoid", "nn.Sigmoid")}
"""A squashing activation's node -> its name, its module's."""
LOSSES = {"LogSoftmaxBackward0": ("cross_entropy", "softmax"),
          "BinaryCrossEntropyWithLogitsBackward0": ("binary_cross_entropy_with_logits",
                                                    "sigmoid")}
"""The node a loss applies its own activation with -> the loss's name, that activation's."""
NLL = frozenset({"NllLossBackward0", "NllLoss2DBackward0"})
RAW_SCORES = frozenset({"AddmmBackward0", "MmBackward0", "BmmBackward0", "BaddbmmBackward0",
                        "LinearBackward0", "ConvolutionBackward0", "EmbeddingBackward0"})
"""A linear layer's (or a convolution's, or an embedding table's) output: scores, not
log-probabilities..."""
LOG_PROBABILITIES = frozenset({"LogSoftmaxBackward0", "LogSigmoidBackward0"})
"""...unless it mixes log-probabilities made just before it (an ensemble's weighted sum, a
verbalizer's or a permutation's matrix, a fixed upsampling of a segmentation's): one of these
among the `MIXED` nodes it is made from."""
MIXED = 16
COMBINERS = frozenset({"AddBackward0", "AddBackward1", "SubBackward0", "SubBackward1",
                       "MulBackward0", "MulBackward1", "DivBackward0", "DivBackward1",
                       "SumBackward0", "SumBackward1", "MeanBackward0", "MeanBackward1",
                       "NegBackward0", "StackBackward0", "CatBackward0"})
"""What makes a loss of its terms (sums, means, weights, a division by the accumulation): an
`nll_loss` reached through these alone is the loss, not a value inside another one (a
Q-learning loss that picks Q(s, a) with `-nll_loss(q, a)` under its squared error)."""
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
    """The finding when the loss's graph applies an activation twice, or hands `nll_loss`
    what is not log-probabilities; None otherwise (no graph, or none found among the `VISITED`
    nodes nearest the loss)."""
    root = getattr(loss, "grad_fn", None)
    queue: list[tuple[Any, bool]] = [(root, True)] if root is not None else []
    seen, scores, normalised = 0, [], set()
    while queue and seen < VISITED:
        node, direct = queue.pop(0)  # direct: reached through `COMBINERS` and reshapes alone
        seen += 1
        name = type(node).__name__
        if name in LOSSES or name in NLL:
            inner = _input(node)
            found = type(inner).__name__ if inner is not None else None
            if name in LOSSES and found in ACTIVATIONS:
                return _finding(*LOSSES[name], *ACTIVATIONS[found])
            if name in NLL and direct and found in ACTIVATIONS:
                return _nll_finding(ACTIVATIONS[found][0])
            if (name in NLL and direct and found in RAW_SCORES
                    and not _mixes_log_probabilities(inner)):
                scores.append(inner)  # unless the loss adds their logsumexp (read on)
            elif name in NLL and inner is not None:
                queue.append((inner, False))  # cross_entropy's log_softmax, read next
            continue  # the loss's input: the model's side, not looked into
        if name == "LogsumexpBackward0":
            normalised.add(id(_input(node)))  # nll_loss(z, y) + logsumexp(z): a cross-entropy
        further = direct and (name in COMBINERS or name in RESHAPES)
        queue.extend((n, further) for n, _ in getattr(node, "next_functions", ())
                     if n is not None)
    if any(id(inner) not in normalised for inner in scores):
        return _nll_finding(None)
    return None


def _mixes_log_probabilities(node: Any) -> bool:
    """Whether a linear op's output is made from log-probabilities: a log_softmax (or a
    log_sigmoid) among the `MIXED` nodes nearest it, the weights' leaves not followed."""
    queue, seen = [n for n, _ in getattr(node, "next_functions", ()) if n is not None], 0
    while queue and seen < MIXED:
        node = queue.pop(0)
        seen += 1
        name = type(node).__name__
        if name in LOG_PROBABILITIES:
            return True
        if name != "AccumulateGrad" and name not in RAW_SCORES:
            queue.extend(n for n, _ in getattr(node, "next_functions", ()) if n is not None)
    return False


def _finding(loss_name: str, own: str, activation: str, module: str) -> Finding:
    twice = own == activation
    return Finding(
        "double_activation", "warning",
        f"the loss applies {own} to outputs that already went through "
        f"{'one' if twice else 'a ' + activation}: {loss_name} (or its nn module) computes its "
        f"own {own}, and the model's last step is a {activation}{' too' if twice else ''}, "
        "so the loss sees squashed scores, cannot fall to 0 and trains ever more slowly as the "
        "model grows sure.",
        f"drop the model's final {module} while training (hand the loss the logits), and apply "
        f"{activation} only to read probabilities.",
        cause="double_activation", evidence={"activation": activation, "loss": loss_name})


def _nll_finding(activation: str | None) -> Finding:
    """`activation`: the one whose probabilities nll_loss was handed; None: raw scores."""
    said = (f"a {activation}'s probabilities p, so its loss is -p[y]: between -1 and 0, never "
            "the cross-entropy, with gradients that vanish as the model grows sure"
            if activation is not None else
            "a linear layer's raw scores z, so its loss is -z[y]: it falls without bound as the "
            "scores grow, and a falling loss says nothing of what is learned")
    return Finding(
        "nll_input", "warning",
        f"nll_loss takes log-probabilities and is handed {said}.",
        "apply log_softmax to the scores before nll_loss (nn.LogSoftmax as the model's last "
        "layer), or hand the raw scores to cross_entropy, which applies it.",
        cause="nll_input", evidence={"input": "scores" if activation is None else "probabilities",
                                     "activation": activation})
