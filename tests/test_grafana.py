"""`trainguard grafana`: the dashboard and its provisioning files are what Grafana reads, and
every PromQL expression in them returns data from a real Prometheus scraping a guarded run."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from trainguard.cli import main
from trainguard.grafana import DATASOURCE_UID, URL_VARIABLE, dashboard, dashboard_expressions

from .sinks.conftest import tiny_run

yaml = pytest.importorskip("yaml", reason="reads the provisioning files")


def _write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    out = tmp_path / "grafana"
    assert main(["grafana", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("wrote ") == 3
    return out


def test_the_provisioning_files_are_what_grafana_reads(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = _write(tmp_path, capsys)
    datasources = yaml.safe_load((out / "datasources" / "trainguard.yaml").read_text())
    assert datasources["apiVersion"] == 1
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["access"] == "proxy"
    assert source["url"] == "${" + URL_VARIABLE + "}" and source["uid"] == DATASOURCE_UID
    assert source["name"]
    providers = yaml.safe_load((out / "dashboards" / "trainguard.yaml").read_text())
    assert providers["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["name"] and provider["orgId"] == 1
    assert Path(provider["options"]["path"]) == (out / "dashboards").resolve()
    assert (Path(provider["options"]["path"]) / "trainguard.json").is_file()
    container = "/etc/grafana/provisioning/dashboards"
    assert main(["grafana", "--out", str(out), "--dashboards-path", container]) == 0
    providers = yaml.safe_load((out / "dashboards" / "trainguard.yaml").read_text())
    assert providers["providers"][0]["options"]["path"] == container


def test_the_dashboard_json_is_valid_for_provisioning(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = _write(tmp_path, capsys)
    model = json.loads((out / "dashboards" / "trainguard.json").read_text())
    assert model == json.loads(json.dumps(dashboard()))
    assert model["id"] is None and model["uid"] and model["title"]
    assert isinstance(model["schemaVersion"], int) and model["panels"]
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["datasource"]["current"]["value"] == DATASOURCE_UID
    assert variables["instance"]["type"] == "query"
    ids = [panel["id"] for panel in model["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    kinds = {panel["type"] for panel in model["panels"]}
    assert {"timeseries", "heatmap", "stat"} == kinds
    for panel in model["panels"]:
        grid = panel["gridPos"]
        assert {"h", "w", "x", "y"} <= set(grid) and grid["x"] + grid["w"] <= 24, panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [target["refId"] for target in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        assert all(target["expr"] for target in panel["targets"])
    events = [a for a in model["annotations"]["list"] if a.get("expr")]
    assert len(events) == 1 and "trainguard_events_total" in events[0]["expr"]
    assert events[0]["datasource"]["uid"] == "${datasource}" and events[0]["enable"]
    titles = " ".join(panel["title"] for panel in model["panels"])
    for needed in ("Loss", "Loss curvature", "Gradient norm", "Clip coefficient",
                   "Learning rate", "Loss scale", "Non-finite", "per layer"):
        assert needed in titles, needed


def test_every_metric_the_dashboard_reads_is_one_the_sink_exports() -> None:
    pytest.importorskip("prometheus_client", reason="needs the prometheus extra")
    from trainguard.sinks import PrometheusSink

    sink = PrometheusSink(port=None)
    exported = {sample.name for family in sink.registry.collect() for sample in family.samples}
    exported |= {family.name for family in sink.registry.collect()}  # labelled, not yet set
    read = {name for expr in dashboard_expressions(dashboard())
            for name in re.findall(r"trainguard_[a-z_]+", expr)}
    assert read and read <= exported, read - exported


def test_an_unusable_out_is_exit_2_with_one_line(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["grafana", "--out", str(blocker)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainguard: error: cannot write the Grafana files") and err.count(
        "\n") == 1
    with pytest.raises(SystemExit):
        main(["grafana", "--help"])
    assert "exit codes:" in capsys.readouterr().out
    with pytest.raises(SystemExit) as missing:
        main(["grafana"])  # --out is required
    assert missing.value.code == 2


# -- a real Prometheus -------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read().decode())


def _query(base: str, expr: str) -> list[dict[str, Any]]:
    answer = _get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


def _until(condition: Any, timeout: float, what: str, tick: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        if tick is not None:
            tick()
        time.sleep(0.2)


def _promql(expr: str) -> str:
    """The expression as Grafana sends it, with its variables substituted."""
    return (expr.replace("$instance", ".*").replace("$__rate_interval", "1m")
            .replace("$__interval", "1m"))


@pytest.mark.slow
def test_every_expression_returns_data_from_a_real_prometheus(tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is missing (apt-get install prometheus; `make test` "
                    "installs it when run as root)")
    pytest.importorskip("prometheus_client", reason="needs the prometheus extra")
    from trainguard.sinks import PrometheusSink

    sink = PrometheusSink(port=0, linger_s=60)
    run = tiny_run([sink], probes={"sample_every": 2})
    listen = f"127.0.0.1:{_free_port()}"
    base = f"http://{listen}"
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "trainguard",
                            "static_configs": [{"targets": [f"127.0.0.1:{sink.port}"]}]}]}))
    log = (tmp_path / "prometheus.log").open("w")
    server = subprocess.Popen([binary, f"--config.file={config}",
                               f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                               f"--web.listen-address={listen}"],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        _until(lambda: urllib.request.urlopen(f"{base}/-/ready", timeout=2).status == 200, 60,
               "Prometheus to be ready")
        # healthy steps until Prometheus has scraped the run (the counters at 0 included)
        _until(lambda: _query(base, "trainguard_steps_total > 1"), 60,
               "the first scrapes", tick=run.step)
        run.step(nan=True)
        assert run.reports[-1].action == "skipped"
        for _ in range(15):
            run.step()
            time.sleep(0.15)
        run.guard.observe_eval({"accuracy": 0.5})
        time.sleep(1.5)
        run.guard.close()  # the endpoint lingers with the final status and the verdict
        _until(lambda: _query(base, "trainguard_verdict == 1")
               and _query(base, 'trainguard_run_status{status="finished"} == 1'), 30,
               "the final scrape")
        nonfinite = _query(base, 'trainguard_nonfinite_total{what="loss"}')
        assert [float(r["value"][1]) for r in nonfinite] == [1.0]
        empty = []
        for expr in dashboard_expressions(dashboard()):
            if not _query(base, _promql(expr)):
                empty.append(expr)
        assert not empty, f"no data for {empty}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
