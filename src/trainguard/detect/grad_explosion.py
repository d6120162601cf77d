"""`grad_explosion`: the pre-clip global gradient norm is far above normal.

Two rules. The guide's absolute rule of thumb (norm > `grad_norm_abs_threshold`, 1000) applies
while the run's own typical norm is below that threshold. The adaptive rule compares the norm with
a robust baseline of this run (median and MAD of recent log-norms), so a model whose normal norm is
50 and one whose normal norm is 0.5 are judged on their own scale.
"""

from __future__ import annotations

import math
from typing import Any

from trainguard.config import DetectorConfig
from trainguard.detect.base import Detector
from trainguard.events import Event
from trainguard.signals import RobustBaseline, StepSignals, safe_log


class GradExplosion(Detector):
    kind = "grad_explosion"

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        self.baseline = RobustBaseline(config.baseline_window, config.min_log_scale)
        self.active = False

    def check(self, signals: StepSignals) -> list[Event]:
        cfg = self.config
        norm = signals.grad_norm
        log_norm = safe_log(norm)
        if signals.amp_overflow or not math.isfinite(log_norm):
            return []
        warm = len(self.baseline) >= cfg.warmup_steps and len(self.baseline) > 0
        median, scale = self.baseline.stats() if warm else (math.nan, math.nan)
        typical = math.exp(median) if warm else math.nan
        adaptive = (warm and log_norm - median >= math.log(cfg.grad_norm_ratio)
                    and log_norm - median >= cfg.grad_norm_zscore * scale)
        absolute = norm > cfg.grad_norm_abs_threshold and (
            not warm or typical < cfg.grad_norm_abs_threshold)
        anomalous = adaptive or absolute
        if anomalous:
            cap = (median + math.log(cfg.grad_norm_ratio) if warm
                   else math.log(cfg.grad_norm_abs_threshold))
            self.baseline.admit(min(log_norm, cap))
        else:
            self.baseline.admit(log_norm)
        if not anomalous:
            self.active = False
            return []
        if self.active:
            return []
        self.active = True
        ratio = norm / typical if warm else math.nan
        if absolute:
            severity = "error"
            message = (f"gradient norm {norm:.4g} is above the absolute limit "
                       f"{cfg.grad_norm_abs_threshold:g}")
        else:
            severity = "error" if ratio >= cfg.grad_norm_error_ratio else "warning"
            message = f"gradient norm {norm:.4g}"
        if warm:
            message += f" ({ratio:.1f}x this run's typical {typical:.3g})"
        worst = int(signals.param_grad_norm.argmax()) if len(signals.param_grad_norm) else None
        param = signals.param_names[worst] if worst is not None else None
        if param is not None:
            message += f"; largest in {param} ({signals.param_grad_norm[worst]:.3g})"
        return [self.event(signals.step, severity, message, param=param, value=norm,
                           baseline=typical if warm else None, ratio=ratio if warm else None)]

    def state_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline.state_dict(), "active": self.active}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.baseline.load_state_dict(state["baseline"])
        self.active = bool(state["active"])
