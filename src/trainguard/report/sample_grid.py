"""The report's grid of samples over steps: what a generative model made as it trained.

Read from the run store's meta `samples` (`RunStoreSink.on_samples`): one strip of images per
step that made samples, all drawn in the colour range of the run's first samples (NaN and inf
magenta), with the statistics the sample judge read and whether it held them broken.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

from trainguard.report.data import RunData
from trainguard.report.escape import text

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SHOWN_STATS = (("roughness", "roughness"), ("spread", "spread"), ("saturated", "saturated"),
               ("diversity", "diversity"), ("nonfinite", "non-finite"))


def _png(entry: dict[str, Any]) -> str | None:
    """The entry's PNG as base64, checked to be one (a store is read as untrusted input)."""
    data = entry.get("png")
    if not isinstance(data, str):
        return None
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None
    return data if raw.startswith(PNG_SIGNATURE) else None


def _stat(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "?"
    return f"{value:.3g}" if math.isfinite(value) else str(value)


def sample_entries(data: RunData) -> list[dict[str, Any]]:
    samples = data.meta.get("samples")
    if not isinstance(samples, list):
        return []
    return [s for s in samples if isinstance(s, dict) and _png(s) is not None]


def samples_html(data: RunData) -> str | None:
    """The section, or None when the run kept no samples."""
    entries = sample_entries(data)
    if not entries:
        return None
    rows = []
    for entry in entries:
        stats = entry.get("stats")
        stats = stats if isinstance(stats, dict) else {}
        numbers = ", ".join(f"{label} {_stat(stats.get(key))}" for key, label in SHOWN_STATS)
        mark = ('<span class="sev warning">broken</span>' if entry.get("degraded") is True
                else "reference" if entry.get("first") is True else "")
        rows.append(
            f'<tr><td>{text(entry.get("step", "?"))}</td><td>{mark}</td>'
            f'<td><img class="samples" alt="samples after step {text(entry.get("step", "?"))}" '
            f'src="data:image/png;base64,{_png(entry)}"></td><td class="note">{text(numbers)}'
            f"</td></tr>")
    body = ('<p class="note">the samples made after each step, in the colour range of the '
            "first ones (NaN and inf drawn magenta); roughness about 0 for smooth pictures, "
            "1 for noise</p>"
            "<table><thead><tr><th>step</th><th></th><th>samples</th><th>statistics</th></tr>"
            f"</thead><tbody>{''.join(rows)}</tbody></table>")
    return f'<section id="samples"><h2>Samples</h2>{body}</section>'
