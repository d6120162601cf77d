"""`trainguard.hf.TrainguardCallback`: trainguard for the Hugging Face Trainer (and PEFT models).

A short import path for `trainguard.integrations.hf`; it needs `transformers` installed.
"""

from trainguard.integrations.hf import TrainguardCallback, model_loss

__all__ = ["TrainguardCallback", "model_loss"]
