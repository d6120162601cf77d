"""`trainguard.lightning.TrainguardCallback`: trainguard for Lightning Trainers.

A short import path for `trainguard.integrations.lightning`; it needs `lightning` or
`pytorch_lightning` installed, and works with the Trainer of either.
"""

from trainguard.integrations.lightning import NAMESPACES, TrainguardCallback

__all__ = ["NAMESPACES", "TrainguardCallback"]
