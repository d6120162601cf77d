"""Drivers for trainers that own the optimizer step: the Hugging Face Trainer and Lightning.

    trainguard.hf.TrainguardCallback          transformers.Trainer (PEFT models included)
    trainguard.lightning.TrainguardCallback   lightning.pytorch and pytorch_lightning

Both run each optimizer step through the same engine pipeline as `trainguard.Guard`, through the
shared `trainguard.driver.StepDriver`. Importing this package imports neither
framework; each integration module imports only its own.
"""

from trainguard.recovery.lr import scale_learning_rate

__all__ = ["scale_learning_rate"]
