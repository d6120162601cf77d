"""Escaping for the report: every string read from a run (module and parameter names, event
messages, config values, the run directory) is untrusted.

- `text` makes a string safe as HTML text or attribute value, and as plotly's label markup
  (plotly renders `<b>`, `<br>`, `<a href=...>` in titles, ticks and hover labels, and decodes
  entities): control and format characters are escaped as in the CLI (`\\x1b`), lone
  surrogates too (they could not even be written as UTF-8), then `& < > " '` become entities.
- `script_json` serialises data for a `<script type="application/json">` block: `<`, `>` and `&`
  become `\\u003c`, `\\u003e`, `\\u0026` (valid JSON, parsed back unchanged), so no string can
  close the script element (`</script>`) or open a comment (`<!--`); U+2028 and U+2029 are
  escaped too, and everything outside ASCII is written as `\\uXXXX`. Non-finite numbers
  are refused: the report encodes them explicitly.
"""

from __future__ import annotations

import html
import json
import math
from typing import Any

from trainguard.formatting import visible

_SCRIPT_SAFE = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026",
                0x2028: "\\u2028", 0x2029: "\\u2029"}


def text(value: Any) -> str:
    """`value` as a string, safe inside HTML text, an attribute or a plotly label."""
    return html.escape(visible(str(value)), quote=True)


def finite_or_none(value: Any) -> Any:
    """`value` with every non-finite float replaced by None (lists, tuples and dicts walked)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def script_json(value: Any) -> str:
    """JSON text that can stand inside `<script type="application/json">` as it is."""
    return json.dumps(value, allow_nan=False, ensure_ascii=True,
                      separators=(",", ":")).translate(_SCRIPT_SAFE)
