"""Adapters for trainers that own the optimizer step: the Hugging Face Trainer and Lightning.

    trainguard.hf.TrainguardCallback          transformers.Trainer (PEFT models included)
    trainguard.lightning.TrainguardCallback   lightning.pytorch and pytorch_lightning

Both run each optimizer step through the same `Run.before_update` / `Run.after_update` as
`trainguard.Guard`, around the trainer's own optimizer step. Importing this package imports
neither framework; each integration module imports only its own.
"""

from trainguard.recovery.lr import scale_learning_rate

__all__ = ["scale_learning_rate"]
