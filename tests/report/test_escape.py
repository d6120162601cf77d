"""Every string from a run is escaped: in the HTML, in plotly's labels and inside the embedded
JSON, where a message holding `</script>` must not close the script element."""

from __future__ import annotations

import json
import math
import re

import pytest

from trainguard.report import build_report
from trainguard.report.escape import finite_or_none, script_json, text
from trainguard.report.output import plotly_js

from .helpers import HOSTILE, Synthetic, payload


def test_text_escapes_markup_and_control_characters() -> None:
    assert text('<b>"x" & \'y\'</b>') == "&lt;b&gt;&quot;x&quot; &amp; &#x27;y&#x27;&lt;/b&gt;"
    assert text("red\x1b[31m\nnext\u202e") == "red\\x1b[31m\\nnext\\u202e"
    assert text("\ud800") == "\\ud800", "a lone surrogate could not even be written as UTF-8"
    assert text(1.5) == "1.5"
    assert text("a&lt;b") != text("a<b"), "escaping keeps distinct names distinct"


def test_script_json_cannot_close_its_script_element() -> None:
    value = {"message": "</script><script>alert(1)</script><!-- & \u2028\u2029 \u00e9",
             "nested": [{"</SCRIPT>": 1}]}
    encoded = script_json(value)
    assert "<" not in encoded and ">" not in encoded and "&" not in encoded
    assert "\u2028" not in encoded and "\u2029" not in encoded
    assert encoded.isascii()
    assert json.loads(encoded) == value, "the escapes are plain JSON and parse back unchanged"


def test_script_json_refuses_non_finite_numbers() -> None:
    with pytest.raises(ValueError):
        script_json({"x": math.nan})
    assert finite_or_none({"a": [math.inf, 1.0, (math.nan,)]}) == {"a": [None, 1.0, [None]]}


def _without_plotly(html: str) -> str:
    script = plotly_js()
    assert html.count(script) == 1
    return html.replace(script, "")


def test_a_hostile_store_cannot_inject_markup(hostile_run: Synthetic) -> None:
    html, _ = build_report(hostile_run.run_dir)
    ours = _without_plotly(html)
    assert HOSTILE not in html
    # our own four scripts (watcher, plotly.js, data, boot) and nothing else
    assert len(re.findall(r"<script", ours, re.I)) == 4
    assert len(re.findall(r"</script", ours, re.I)) == 4
    assert "<img" not in ours and "<!--" not in ours
    assert "dataset.pwned" in ours, "the hostile text is shown, escaped"
    assert "&lt;/script&gt;&lt;script&gt;document.documentElement" in ours
    assert "\x1b" not in ours and "\u202e" not in ours
    # the run directory's name, in the title and the summary
    assert "run &lt;b&gt;&quot;&amp;amp;&lt;/b&gt;" in ours


def test_strings_in_the_embedded_data_are_html_escaped(hostile_run: Synthetic) -> None:
    html, _ = build_report(hostile_run.run_dir)
    data = payload(html)
    strings: list[str] = []

    def walk(value: object) -> None:
        if isinstance(value, str):
            strings.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(data)
    assert strings
    for string in strings:
        # plotly renders <b> and <br> in labels (ours); nothing from the run is markup
        assert "<script" not in string and "<img" not in string and "<!--" not in string
    grad = next(f for f in data["figures"] if f["id"] == "grad_heat")
    names = grad["data"][0]["y"]
    assert names[0].startswith("w&lt;/script&gt;&lt;script&gt;")
    assert names[2:] == ["a&amp;lt;b", "a&lt;b", "esc\\x1b[31m\\u202e"]
    loss = next(f for f in data["figures"] if f["id"] == "loss")
    hover = [h for t in loss["data"] for h in t.get("hovertext", [])]
    assert any("NaN&lt;/script&gt;&lt;script&gt;" in h for h in hover)
