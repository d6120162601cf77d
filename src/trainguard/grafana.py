"""A Grafana dashboard for `PrometheusSink`'s metrics, with the files that provision it.

    trainguard grafana --out grafana/        # or write_provisioning("grafana/")

writes

    grafana/datasources/trainguard.yaml   a Prometheus datasource (uid `trainguard-prometheus`)
                                          whose URL is Grafana's environment variable
                                          TRAINGUARD_PROMETHEUS_URL (http://localhost:9090, say)
    grafana/dashboards/trainguard.yaml    a file provider loading the dashboard's folder
    grafana/dashboards/trainguard.json    the dashboard

Point Grafana's provisioning directory at `grafana/` (`GF_PATHS_PROVISIONING`, or mount it as
`/etc/grafana/provisioning` and pass `dashboards_path="/etc/grafana/provisioning/dashboards"`).
The dashboard has a datasource variable and an `instance` variable (every scraped run, or one),
time series of the key metrics, per-layer heat maps, and an annotation at each event, made from
`trainguard_events_total`. Every expression is plain PromQL once Grafana's variables are
substituted (`dashboard_expressions` lists them; the tests run each one against a real
Prometheus).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

DATASOURCE_UID = "trainguard-prometheus"
DASHBOARD_UID = "trainguard-run"
URL_VARIABLE = "TRAINGUARD_PROMETHEUS_URL"
SELECTOR = '{instance=~"$instance"}'
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _target(expr: str, legend: str = "__auto", ref: str = "A") -> dict[str, Any]:
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref,
            "range": True, "instant": False, "editorMode": "code"}


def _panel(title: str, targets: list[dict[str, Any]], *, kind: str = "timeseries",
           description: str = "", unit: str = "short", log_scale: bool = False,
           bars: bool = False, options: dict[str, Any] | None = None) -> dict[str, Any]:
    custom: dict[str, Any] = {"drawStyle": "bars" if bars else "line", "lineWidth": 1,
                              "fillOpacity": 60 if bars else 10, "spanNulls": False,
                              "showPoints": "never"}
    if log_scale:
        custom["scaleDistribution"] = {"type": "log", "log": 10}
    panel: dict[str, Any] = {
        "type": kind, "title": title, "description": description, "datasource": DATASOURCE,
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": unit,
                                     "custom": custom if kind == "timeseries" else {}},
                        "overrides": []},
        "options": options if options is not None else {
            "legend": {"showLegend": True, "displayMode": "list", "placement": "bottom"},
            "tooltip": {"mode": "multi", "sort": "desc"}}}
    return panel


def _heatmap(title: str, expr: str, legend: str, description: str) -> dict[str, Any]:
    """One row per layer (each series is a row), coloured by its value."""
    return _panel(title, [_target(expr, legend)], kind="heatmap", description=description,
                  options={"calculate": False, "cellGap": 1,
                           "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64,
                                     "exponent": 0.5, "fill": "dark", "reverse": False},
                           "rowsFrame": {"layout": "auto"},
                           "yAxis": {"axisPlacement": "left", "reverse": False},
                           "legend": {"show": True},
                           "tooltip": {"mode": "single", "yHistogram": False,
                                       "showColorScale": True}})


def _stat(title: str, expr: str, legend: str, description: str,
          unit: str = "short") -> dict[str, Any]:
    return _panel(title, [_target(expr, legend)], kind="stat", description=description,
                  unit=unit, options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "",
                                                        "values": False},
                                      "textMode": "value_and_name", "colorMode": "value",
                                      "graphMode": "none", "justifyMode": "auto"})


def _panels() -> list[dict[str, Any]]:
    s = SELECTOR
    rate = "$__rate_interval"
    stats = [
        _stat("Step", f"trainguard_step{s}", "{{instance}}", "the last optimizer step reported"),
        _stat("Run status", f"trainguard_run_status{s} == 1", "{{status}}",
              "running, then finished, halted, failed, crashed or interrupted"),
        _stat("Verdict", f"trainguard_verdict{s} == 1", "{{verdict}}",
              "did training work: healthy, recovered or degraded (set when the run closes)"),
        _stat("Since the last step", f"time() - trainguard_last_step_timestamp_seconds{s}",
              "{{instance}}", "seconds since the run last reported a step", unit="s"),
    ]
    series = [
        _panel("Loss", [_target(f"trainguard_loss{s}", "{{instance}}")],
               description="non-finite losses are counted in 'Non-finite values'"),
        _panel("Loss curvature", [_target(f"trainguard_loss_curvature{s}", "{{instance}}")],
               description="smoothed second difference of the log loss: positive while the "
                           "loss accelerates upwards"),
        _panel("Gradient norm (global, before clipping)",
               [_target(f"trainguard_grad_norm{s}", "{{instance}}")], log_scale=True),
        _panel("Clip coefficient", [_target(f"trainguard_clip_coefficient{s}", "{{instance}}")],
               description="the factor gradients were multiplied by (1: not clipped)"),
        _panel("Learning rate", [_target(f"trainguard_learning_rate{s}",
                                         "group {{group}} {{instance}}")], log_scale=True),
        _panel("Loss scale (AMP)", [_target(f"trainguard_loss_scale{s}", "{{instance}}")],
               log_scale=True),
        _panel("Non-finite values",
               [_target(f"increase(trainguard_nonfinite_total{s}[{rate}])", "{{what}}")],
               bars=True, description="NaN/inf losses, global norms and parameter gradients"),
        _panel("Skipped steps and rollbacks",
               [_target(f"increase(trainguard_skipped_steps_total{s}[{rate}])", "skipped"),
                _target(f"increase(trainguard_rollbacks_total{s}[{rate}])", "rollbacks", "B")],
               bars=True),
        _panel("Events by kind",
               [_target(f"sum by (kind, severity) "
                        f"(increase(trainguard_events_total{s}[{rate}]))",
                        "{{kind}} ({{severity}})")], bars=True),
        _panel("Steps per second", [_target(f"rate(trainguard_steps_total{s}[{rate}])",
                                            "{{instance}}")], unit="ops"),
        _heatmap("Gradient norm per layer", f"trainguard_param_grad_norm{s}", "{{param}}",
                 "the top_k parameters by gradient norm (all of them with all_params=True)"),
        _panel("Gradient norm per layer (series)",
               [_target(f"trainguard_param_grad_norm{s}", "{{param}}")], log_scale=True),
        _panel("Update ratio per layer",
               [_target(f"trainguard_param_update_ratio{s}", "{{param}}")], log_scale=True,
               description="||dW|| / ||W|| on sampled steps"),
        _heatmap("Activation sparsity per module", f"trainguard_activation_zero_ratio{s}",
                 "{{module}}", "share of exact zeros in each module's output (sampled steps)"),
        _panel("Evaluation metrics", [_target(f"trainguard_eval_metric{s}", "{{metric}}")]),
    ]
    panels = []
    for index, panel in enumerate(stats):
        panels.append({**panel, "gridPos": {"h": 4, "w": 6, "x": 6 * index, "y": 0}})
    for index, panel in enumerate(series):
        panels.append({**panel, "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2),
                                            "y": 4 + 8 * (index // 2)}})
    for number, panel in enumerate(panels, start=1):
        panel["id"] = number
    return panels


def dashboard() -> dict[str, Any]:
    """The dashboard model, as Grafana's file provisioning reads it."""
    return {
        "id": None, "uid": DASHBOARD_UID, "title": "trainguard", "tags": ["trainguard"],
        "description": "A PyTorch training run watched by trainguard (PrometheusSink)",
        "editable": True, "graphTooltip": 1, "schemaVersion": 39, "version": 1,
        "time": {"from": "now-1h", "to": "now"}, "refresh": "10s", "timezone": "browser",
        "fiscalYearStartMonth": 0, "liveNow": False, "links": [],
        "templating": {"list": [
            {"type": "datasource", "name": "datasource", "label": "Prometheus",
             "query": "prometheus", "current": {"text": "trainguard Prometheus",
                                                "value": DATASOURCE_UID},
             "hide": 0, "refresh": 1, "regex": "", "options": [], "includeAll": False,
             "multi": False},
            {"type": "query", "name": "instance", "label": "run", "datasource": DATASOURCE,
             "definition": "label_values(trainguard_step, instance)",
             "query": {"query": "label_values(trainguard_step, instance)",
                       "refId": "PrometheusVariableQueryEditor-VariableQuery"},
             "current": {"text": "All", "value": "$__all"}, "includeAll": True,
             "allValue": ".*", "multi": True, "refresh": 2, "regex": "", "sort": 1,
             "hide": 0, "options": []}]},
        "annotations": {"list": [
            {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
             "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
             "name": "Annotations & Alerts", "type": "dashboard"},
            {"name": "trainguard events", "datasource": DATASOURCE, "enable": True,
             "iconColor": "red",
             "expr": f"sum by (kind, severity) "
                     f"(changes(trainguard_events_total{SELECTOR}[$__interval])) > 0",
             "step": "$__interval", "titleFormat": "{{kind}}",
             "textFormat": "{{severity}}: {{kind}}", "tagKeys": "kind,severity",
             "useValueForTime": False}]},
        "panels": _panels(),
    }


def dashboard_expressions(model: dict[str, Any]) -> list[str]:
    """Every PromQL expression of a dashboard: panel targets, annotations and the `label_values`
    variable queries (as the metric they read)."""
    found: list[str] = []
    for panel in model.get("panels", []):
        found.extend(t["expr"] for t in panel.get("targets", []) if t.get("expr"))
    found.extend(a["expr"] for a in model.get("annotations", {}).get("list", []) if a.get("expr"))
    for variable in model.get("templating", {}).get("list", []):
        query = variable.get("definition", "")
        if query.startswith("label_values(") and query.endswith(")"):
            found.append(query[len("label_values("):-1].rpartition(",")[0].strip())
    return found


def _yaml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a YAML double-quoted scalar


def datasource_yaml() -> str:
    return "\n".join([
        "# trainguard's Prometheus datasource, for Grafana's provisioning (written by",
        "# `trainguard grafana`). Set TRAINGUARD_PROMETHEUS_URL in Grafana's environment to the",
        "# Prometheus that scrapes your PrometheusSink, e.g. http://localhost:9090.",
        "apiVersion: 1",
        "datasources:",
        f"  - name: {_yaml_string('trainguard Prometheus')}",
        f"    uid: {_yaml_string(DATASOURCE_UID)}",
        '    type: "prometheus"',
        '    access: "proxy"',
        f"    url: {_yaml_string('${' + URL_VARIABLE + '}')}",
        "    isDefault: false",
        "    editable: true",
        "    jsonData:",
        '      timeInterval: "15s"   # the scrape interval: $__rate_interval is made from it',
        ""])


def provider_yaml(dashboards_path: str) -> str:
    return "\n".join([
        "# Loads trainguard's dashboard (written by `trainguard grafana`).",
        "apiVersion: 1",
        "providers:",
        f"  - name: {_yaml_string('trainguard')}",
        "    orgId: 1",
        f"    folder: {_yaml_string('trainguard')}",
        '    type: "file"',
        "    disableDeletion: false",
        "    allowUiUpdates: true",
        "    updateIntervalSeconds: 30",
        "    options:",
        f"      path: {_yaml_string(dashboards_path)}",
        "      foldersFromFilesStructure: false",
        ""])


def write_provisioning(out: str | Path, dashboards_path: str | None = None) -> list[Path]:
    """Write the datasource, the dashboard provider and the dashboard under `out`; returns the
    paths. `dashboards_path` is where Grafana will find `out/dashboards` (default: its absolute
    path here). Each file is replaced whole (written aside, then renamed)."""
    out = Path(out)
    where = dashboards_path or str((out / "dashboards").resolve())
    files = {out / "datasources" / "trainguard.yaml": datasource_yaml(),
             out / "dashboards" / "trainguard.yaml": provider_yaml(where),
             out / "dashboards" / "trainguard.json": json.dumps(dashboard(), indent=2) + "\n"}
    for path in files:  # every folder first: an unusable `out` fails before any file is written
        path.parent.mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return list(files)
