"""Lightning's checkpoints marked as they are written, and the newest healthy one kept.

Lightning writes every checkpoint (`ModelCheckpoint`, `trainer.save_checkpoint`) and removes the
ones `save_top_k` drops through the strategy's `CheckpointIO` plugin. `MarkingCheckpointIO`
wraps the plugin in use: after each write it writes the checkpoint's `trainguard.json` sidecar
(`checkpoint_health.mark_checkpoint`, on rank 0, where Lightning writes); a removal asked for
takes the sidecar and the saved Guard state with the file, except for the newest healthy
checkpoint while the checkpoints after it are not healthy: that one is kept (said once with a
`checkpoint_kept` action), and removed once a newer healthy checkpoint has been written.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from trainguard.checkpoint_health import mark_checkpoint
from trainguard.checkpoints import RESUMABLE, sidecar_path, state_path
from trainguard.events import ActionRecord
from trainguard.pipeline.run import Run

log = logging.getLogger("trainguard")


class MarkingCheckpointIO:
    """Wraps a Lightning `CheckpointIO`; anything else is the wrapped plugin's."""

    def __init__(self, inner: Any, owner: Any) -> None:
        self.inner = inner
        self.owner = owner
        """The callback, whose `run` marks the checkpoints."""
        self.last_healthy: Path | None = None
        self.newest: Path | None = None
        self._held: set[Path] = set()
        """Checkpoints Lightning asked to remove while they were the newest healthy one."""
        self._told = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any = None) -> None:
        self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)
        run = getattr(self.owner, "run", None)
        if not isinstance(run, Run) or run.closed:
            return
        target = Path(path)
        step = checkpoint.get("global_step") if isinstance(checkpoint, dict) else None
        record = mark_checkpoint(target, run, step=step if isinstance(step, int) else None)
        if record is None:
            return
        self.newest = target
        if record.status in RESUMABLE and not record.blocked:
            self.last_healthy = target
            for held in sorted(self._held - {target}):
                self._remove(held)
            self._held &= {target}

    def remove_checkpoint(self, path: Any) -> None:
        target = Path(path)
        if target == self.last_healthy and self.newest != target:
            self._held.add(target)
            self._tell(target)
            return
        self._remove(target)

    def _remove(self, target: Path) -> None:
        self.inner.remove_checkpoint(target)
        for own in (sidecar_path(target), state_path(target)):
            own.unlink(missing_ok=True)

    def _tell(self, kept: Path) -> None:
        run = getattr(self.owner, "run", None)
        if self._told or not isinstance(run, Run) or run.closed:
            return
        self._told = True
        newest = self.newest.name if self.newest is not None else "the newest checkpoint"
        run.emit_action(ActionRecord(
            kind="checkpoint_kept", step=run.state.step,
            message=f"{newest} is not healthy: {kept.name}, the newest healthy checkpoint, is "
                    f"kept although ModelCheckpoint's save_top_k rotated it out (it is removed "
                    f"once a newer healthy checkpoint is written); resume from "
                    f"trainguard.last_healthy_checkpoint(dirpath)",
            details={"kept": str(kept), "newest": str(self.newest)}))
