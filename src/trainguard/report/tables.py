"""The report's tables, as HTML: the run, its verdict, the likely causes with their evidence and
fixes, the preflight findings, the actions trainguard took, what happened to each step's update,
and the events. Every cell goes through `escape.text`."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from trainguard.formatting import local_time, short
from trainguard.report.data import RunData
from trainguard.report.escape import text
from trainguard.vocabulary import HEALTHY, NOT_WORKING, RECOVERED

MAX_ROWS = 1000
"""Rows per table at most (the plots keep every event; `trainguard show` lists them too)."""
DETAIL_CHARS = 300


_when = local_time
_fmt = short


def _compact(value: Any) -> str:
    """A record's details as short JSON text (not yet escaped)."""
    if value in (None, {}, []):
        return ""
    if isinstance(value, str):
        shown = value
    else:
        shown = json.dumps(value, default=repr, allow_nan=True, ensure_ascii=False)
    return shown if len(shown) <= DETAIL_CHARS else shown[:DETAIL_CHARS - 1] + "\u2026"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, css: str = "") -> str:
    """A table whose cells are already HTML (escape them first)."""
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    klass = f' class="{css}"' if css else ""
    return f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{anchor}"><h2>{text(title)}</h2>{body}</section>'


def _more(shown: int, total: int, what: str) -> str:
    if total <= shown:
        return ""
    return (f'<p class="note">the first {shown:,} of {total:,} {text(what)} are listed; the '
            f"plots mark every one</p>")


def summary_html(data: RunData) -> str:
    info, meta = data.info, data.meta
    config = data.config
    first = int(data.steps[0]) if data.steps.size else None
    last = int(data.steps[-1]) if data.steps.size else None
    if meta.get("log_format"):  # an analysed log, not a run store
        rows = [("log", data.run_dir), ("format", meta["log_format"]),
                ("steps", f"{data.steps.size:,} rows" + (f" ({first}..{last})"
                                                         if data.steps.size else ""))]
        rows += [("note", note) for note in data.notes]
        cells = "".join(f"<tr><th>{text(k)}</th><td>{text(v)}</td></tr>" for k, v in rows)
        return f'<table class="summary"><tbody>{cells}</tbody></table>'
    rows = [("run directory", data.run_dir),
            ("run", f"{data.run_id} of {len(data.run_ids)} in this directory"),
            ("status", info.get("status", meta.get("status", "unknown"))),
            ("steps", f"{data.steps.size:,} recorded" + (f" ({first}..{last})"
                                                        if data.steps.size else "")),
            ("policy", _fmt(config.get("policy"))),
            ("clip level", _fmt(data.max_grad_norm)),
            ("started", _when(info.get("started"))), ("ended", _when(info.get("ended"))),
            ("trainguard", _fmt(meta.get("trainguard_version")))]
    if meta.get("integration"):
        rows.append(("integration", meta["integration"]))
    if info.get("resumed"):
        rows.append(("resumed", f"{info['resumed']} time(s)"))
    if info.get("store_failed"):
        rows.append(("store", f"stopped writing at step {_fmt(info.get('failed_step'))}: "
                              f"{info['store_failed']}; {info.get('dropped_steps', 0)} steps "
                              f"not recorded ({info.get('dropped', 0)} records dropped)"))
    elif info.get("dropped"):
        rows.append(("store", f"{info.get('dropped_steps', 0)} steps not recorded "
                              f"({info['dropped']} records dropped; the writer fell behind)"))
    if meta.get("snapshot"):
        rows.append(("crash snapshot", meta["snapshot"]))
    for note in data.notes:
        rows.append(("note", note))
    cells = "".join(f"<tr><th>{text(k)}</th><td>{text(v)}</td></tr>" for k, v in rows)
    return f'<table class="summary"><tbody>{cells}</tbody></table>'


def verdict_html(data: RunData) -> str:
    verdict = data.meta.get("verdict")
    if not isinstance(verdict, dict):
        return _section("verdict", "Verdict", '<p class="note">no verdict recorded (the run did '
                                              "not close, or was written by an older "
                                              "trainguard)</p>")
    label = str(verdict.get("verdict", "?"))
    klass = ("bad" if label in NOT_WORKING else
             {HEALTHY: "ok", RECOVERED: "warn"}.get(label, ""))
    numbers = [(name.replace("_", " "), verdict[name])
               for name in ("start", "before_trouble", "final", "trouble_step", "halt_step")
               if verdict.get(name) is not None]
    extra = table(["", "loss / step"], [[text(k), text(_fmt(v))] for k, v in numbers],
                  css="compact") if numbers else ""
    said = text(verdict.get("message", ""))
    body = (f'<p class="verdict {klass}"><b>{text(label.upper())}</b>: {said}</p>{extra}'
            if verdict.get("verdict") is not None  # none: too short to judge, as said
            else f'<p class="verdict">{said}</p>{extra}')
    return _section("verdict", "Verdict", body)


def diagnosis_html(data: RunData) -> str:
    causes = data.meta.get("diagnosis") or []
    if not causes:
        return _section("diagnosis", "Likely causes", '<p class="note">no diagnosis: nothing '
                                                      "went wrong badly enough to rank "
                                                      "causes</p>")
    rows = []
    for cause in causes:
        evidence = cause.get("evidence") or []
        items = "".join(f"<li>{text(e)}</li>" for e in evidence)
        confidence = cause.get("confidence", 0)
        shown = (f"{float(confidence):.0%}" if isinstance(confidence, (int, float))
                 and math.isfinite(confidence) else "-")
        rows.append([f"<b>{text(cause.get('code', ''))}</b>", text(shown),
                     f"<ul>{items}</ul>" if items else "", text(cause.get("fix", ""))])
    return _section("diagnosis", "Likely causes",
                    table(["cause", "confidence", "evidence", "fix"], rows))


def preflight_html(data: RunData) -> str:
    findings = data.meta.get("preflight")
    if findings is None:
        body = '<p class="note">no preflight audit recorded</p>'
    elif not findings:
        body = '<p class="note">the preflight audit found nothing</p>'
    else:
        rank = {"critical": 0, "error": 1, "warning": 2, "info": 3}
        ordered = sorted(findings, key=lambda f: rank.get(str(f.get("severity")), 9))
        rows = [[f'<span class="sev {text(f.get("severity", ""))}">'
                 f'{text(f.get("severity", ""))}</span>',
                 text(f.get("check", "")), text(f.get("message", "")),
                 text(f.get("fix") or ""), text(_compact(f.get("evidence")))]
                for f in ordered]
        body = table(["severity", "check", "finding", "fix", "evidence"], rows)
    return _section("preflight", "Preflight findings", body)


def actions_html(data: RunData) -> str:
    outcomes = Counter(str(a) for a in data.step_actions)
    order = ["applied", "clipped", "skipped", "rolled_back", "halted"]
    listed = [k for k in order if k in outcomes] + sorted(k for k in outcomes if k not in order)
    parts = []
    if listed:
        parts.append("<p>step updates: " + ", ".join(
            f"{text(k)} <b>{outcomes[k]:,}</b>" for k in listed) + "</p>")
    actions = data.actions
    if not actions:
        parts.append('<p class="note">trainguard took no action on this run</p>')
    else:
        kinds = Counter(a.kind for a in actions)
        parts.append("<p>actions: " + ", ".join(
            f"{text(k)} <b>{n:,}</b>" for k, n in sorted(kinds.items())) + "</p>")
        rows = [[text(a.step), text(a.kind), text(a.message), text(_compact(a.details))]
                for a in actions[:MAX_ROWS]]
        parts.append(table(["step", "action", "what trainguard did", "details"], rows))
        parts.append(_more(min(len(actions), MAX_ROWS), len(actions), "actions"))
    return _section("actions", "Actions taken", "".join(parts))


def events_html(data: RunData) -> str:
    events = data.events
    if not events:
        return _section("events", "Events", '<p class="note">no events</p>')
    kinds = Counter((e.kind, e.severity) for e in events)
    counts = table(["kind", "severity", "count"],
                   [[text(k), text(s), text(n)] for (k, s), n in sorted(kinds.items())],
                   css="compact")
    rows = [[text(e.step), f'<span class="sev {text(e.severity)}">{text(e.severity)}</span>',
             text(e.kind), text(e.param or ""), text(_fmt(e.value)), text(e.message)]
            for e in events[:MAX_ROWS]]
    listing = table(["step", "severity", "kind", "parameter", "value", "message"], rows)
    return _section("events", f"Events ({len(events):,})",
                    counts + listing + _more(min(len(events), MAX_ROWS), len(events),
                                             "events"))
