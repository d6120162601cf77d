"""The catalogue of root causes, in one place.

Scenario ground truth, diagnosis rankings and reports all speak these codes. `docs/causes.md`
describes each one for people (symptom, detection, fix, the guide's section). A fix here is the
general one; a guarded run makes the LR's concrete for its model (`lr_range.SaneLR.fixes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainguard.diagnose.lr_range import GUIDE_RANGES, SMALL_MODEL_LR_FACTOR, TINY_MODEL_LR_FACTOR


@dataclass(frozen=True, slots=True)
class Cause:
    code: str
    title: str
    guide_section: str
    """Section of the reference guide that discusses it."""
    fix: str
    """The guide's recommendation, in one line."""


_ALL = (
    Cause("lr_too_high", "Learning rate too high for the fine-tuning mode", "3.1",
          f"Lower the LR into the range for the mode and the model: {GUIDE_RANGES} for 7B-class "
          f"pre-trained models; smaller models, and training from scratch, take up to "
          f"{SMALL_MODEL_LR_FACTOR:g}-{TINY_MODEL_LR_FACTOR:g}x more (LoRA adapters never). To "
          "rescue a run, divide the LR by 10."),
    Cause("missing_warmup", "No learning-rate warmup", "3.1, 6",
          "Warm the LR up linearly over ~5-10% of the run (the guide's 500 steps suit a run of "
          "5k-10k steps), then cosine decay."),
    Cause("lora_scaling", "LoRA alpha/r too large", "5.1",
          "Keep lora_alpha / r at 1-2 (alpha = r or 2r) and use lora_dropout = 0.1."),
    Cause("bad_init", "Badly initialised new layer", "3.3.1, 6",
          "Initialise new heads with std 0.02 (or Kaiming for hidden layers)."),
    Cause("input_scale", "Input normalisation differs from pre-training", "3.2",
          "Normalise inputs as in pre-training ([0, 1] or [-1, 1], same channel order)."),
    Cause("unfrozen_part", "A pre-trained VAE or text encoder trained beside the UNet", "5.2",
          "Freeze the autoencoder and the text encoder (requires_grad_(False)) and build the "
          "optimizer from the UNet's parameters (or its LoRA's) only."),
    Cause("prediction_type_mismatch", "The diffusion loss's target is not the noise "
          "scheduler's prediction_type", "5.2",
          "Score the denoiser against the target the scheduler's prediction_type names (the "
          "noise for epsilon, get_velocity for v_prediction), or set prediction_type to the "
          "target trained, on the scheduler that samples too."),
    Cause("nonfinite_input", "NaN or Inf in the input batch", "3.2",
          "Find and clean the sample; check the data pipeline for divisions by zero."),
    Cause("outlier_batch", "Outlier batch with extreme input values", "3.2",
          "Check data statistics per batch; clip or drop the outliers; skip the batch."),
    Cause("fp16_overflow", "float16 overflow under mixed precision", "3.3.2",
          "Use autocast with a GradScaler, keep softmax/norms in fp32, or train in bf16."),
    Cause("batch_truncated", "Batches silently truncated", "3.4.2",
          "Assert the real batch size equals the configured one; fix the loader or memory."),
    Cause("optimizer_eps", "Adam epsilon/betas too aggressive", "5.3",
          "Use eps >= 1e-8 (1e-6 under fp16) and betas (0.9, 0.999)."),
    Cause("tokenizer_mismatch", "Token ids from a different tokenizer or vocabulary", "3.2",
          "Use the tokenizer the model was trained with; check ids < vocabulary size."),
    Cause("numerical_op", "A numerically unsafe operation (log(0), division by zero)", "3.3.2",
          "Clamp arguments (log(x.clamp_min(eps))), use fused stable ops."),
    Cause("dead_units", "Dead ReLU units: a layer stopped responding", "2.2",
          "Use GELU or LeakyReLU, lower the LR (or clip) and warm it up; re-initialise the dead "
          "layer or roll back to before it died."),
    Cause("label_problem", "Wrong or shuffled labels", "3.2",
          "Check the label pipeline: the mapping of classes to ids, shuffling of inputs without "
          "their labels, and the evaluation set's labels."),
    Cause("double_activation", "The loss applies a softmax (or sigmoid) the model already "
          "applied", "3.3.1", "Drop the model's final softmax (or sigmoid) while training and "
          "hand the loss the logits; apply it only to read probabilities."),
    Cause("nll_input", "nll_loss handed probabilities or raw scores, not log-probabilities",
          "3.3.1", "Apply log_softmax before nll_loss (nn.LogSoftmax as the model's last layer), "
          "or hand the raw scores to cross_entropy, which applies it."),
    Cause("weight_decay_too_high", "A weight decay that shrinks every weight faster than the "
          "gradients can train it", "3.1", "Lower weight_decay until lr x weight_decay is about "
          "1e-4 a step or less (1e-4 to 5e-4 for SGD at LR 0.1, 0.01 to 0.1 for AdamW)."),
    Cause("weight_decay_coupled", "A weight decay added to the gradient of an optimizer that "
          "normalises it (Adam's L2 term where AdamW's decay was meant), outweighing the "
          "gradient", "3.1", "Use torch.optim.AdamW with this weight_decay (or Adam(..., "
          "decoupled_weight_decay=True)), or lower weight_decay until the term is well under "
          "the gradient."),
    Cause("loss_broadcast", "The loss broadcast predictions against targets of another shape "
          "((N, 1) against (N,)): every prediction scored against every target", "3.3.1",
          "Give the predictions and the targets the same shape before the loss "
          "(pred.squeeze(-1), or y.view_as(pred))."),
    Cause("padding_labels", "The loss counts the padding: labels not -100 where the attention "
          "mask is 0", "3.2", "Set the labels of padding to -100 (labels[attention_mask == 0] "
          "= -100), or use a collator that does (DataCollatorForLanguageModeling(tokenizer, "
          "mlm=False), DataCollatorForSeq2Seq, DataCollatorForTokenClassification)."),
    Cause("unshuffled_data", "Training data ordered by label, not shuffled: one class at a "
          "time", "3.2", "Shuffle the training data (DataLoader(..., shuffle=True), or a sampler "
          "that mixes the classes)."),
    Cause("empty_loss", "Nothing for the loss to average: every label of a batch ignored", "3.2",
          "Check the label masking (a prompt mask or a truncation that left no answer token, "
          "labels all -100); drop batches without a single target, or divide by "
          "max(count, 1)."),
    Cause("no_gradients", "Nothing trains: no gradients reach the weights", "3.4",
          "Call loss.backward() on the loss itself before the optimizer step; check that the "
          "parameters to train have requires_grad=True and the loss is not detached."),
    Cause("grads_not_cleared", "Gradients never cleared between steps: each update applies the "
          "sum of every gradient so far", "3.4",
          "Call optimizer.zero_grad(set_to_none=True) once per optimizer step, after it (or "
          "before loss.backward()); with gradient accumulation, after the step that ends the "
          "accumulation."),
    Cause("model_in_eval_mode", "The model trains in eval mode: dropout off, batch norm on "
          "frozen running statistics", "3.4",
          "Call model.train() before the training steps: after each evaluation (or at the "
          "start of each epoch), and once after from_pretrained, which returns the model in "
          "eval mode."),
    Cause("lr_too_low", "Learning rate too low to move the weights", "3.1",
          f"Raise the LR into the range for the mode and the model ({GUIDE_RANGES} for "
          "7B-class pre-trained models; smaller ones take more); check the scheduler did not "
          "decay it to ~0."),
    Cause("clip_too_tight", "The loop's gradient clip scales every update down to nothing",
          "2.1", "Raise the max_norm of the loop's clip_grad_norm_ (1.0 is the usual; it should "
          "clip the rare large step, not every step), or leave clipping to the Guard "
          "(policy='protect' clips only a step that explodes)."),
    Cause("lr_at_zero", "The LR held at 0: a schedule shorter than the run, or code that sets it",
          "3.1", "Give the scheduler the optimizer steps the run takes (num_training_steps = "
          "ceil(len(loader) / gradient_accumulation_steps) * epochs; total_iters, T_max), step "
          "it once per optimizer step, and check code that writes param_group['lr']."),
    Cause("ddp_desync", "Replicas out of sync across ranks", "3.4.1",
          "Check DDP initialisation and that every parameter's gradient is all-reduced."),
    Cause("loss_reduction", "The loss's reduction or normalisation: a scale factor, a sum "
          "where a mean was meant, a division by the wrong count", "3.4",
          "Compute the loss as the mean over the targets that count: check its reduction (mean, "
          "not sum), any factor it is multiplied by and the count it is divided by; log the "
          "loss the model returns beside the one you step on."),
    Cause("attention_logit_growth", "Attention logits growing without bound (attention entropy "
          "collapse)", "3.1",
          "Normalise q and k (QK-norm / QK-layernorm), lower the LR, or cap the logits (attention "
          "logit softcapping, QK-clip); a z-loss keeps the output logits from growing alike."),
    Cause("beta_too_low", "KL penalty (beta) too weak to hold the policy near its reference",
          "3.1",
          "Raise beta (GRPO/RLOO: 0.01-0.1 where the KL matters; DPO: 0.1-0.5) or lower the LR; "
          "a KL that blows up at a normal LR is a penalty too weak."),
    Cause("reward_constant", "The reward function gives every completion the same score", "3.2",
          "Test the reward function on a few sampled completions: it must tell a better one from "
          "a worse one (a parse that always fails, a format never met, a constant return)."),
    Cause("max_completion_length_too_small", "Completions cut at max_completion_length before "
          "they end", "3.2",
          "Raise max_completion_length until completions/clipped_ratio is well below 1, or "
          "reward partial answers, so that some completions reach what the reward looks for."),
    Cause("policy_dropout", "Dropout left on in the policy: its forward is not its "
          "reference's", "3.4",
          "Turn dropout off in the policy (TRL: disable_dropout=True, the default; or set the "
          "model config's dropout probabilities to 0); if the reference is meant to differ from "
          "the policy's start, this is expected."),
    Cause("reference_is_policy", "The reference model is the policy itself", "3.4",
          "Give the trainer a separate frozen reference (ref_model=None lets TRL make its own "
          "copy, or a PEFT adapter disabled); never pass the policy object as ref_model."),
)

CAUSES: dict[str, Cause] = {c.code: c for c in _ALL}


def cause(code: str) -> Cause:
    try:
        return CAUSES[code]
    except KeyError:
        raise KeyError(f"unknown cause code {code!r}; known: {', '.join(CAUSES)}") from None
