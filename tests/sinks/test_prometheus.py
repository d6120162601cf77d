"""PrometheusSink on a real guarded run, scraped over HTTP and parsed with prometheus_client."""

from __future__ import annotations

import logging
import math
import re
import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from trainguard.errors import ConfigError
from trainguard.sinks import PrometheusSink
from trainguard.sinks.prometheus import SCRAPE_THREADS
from trainguard.vocabulary import VERDICTS

from .conftest import run_steps, tiny_run
from .test_conformance import Recorder

text_string_to_metric_families = pytest.importorskip(
    "prometheus_client.parser", reason="needs the prometheus extra").text_string_to_metric_families

PARAMS = ["body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias"]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def labelled(samples: Samples, name: str, label: str) -> set[str]:
    return {dict(key[1])[label] for key in samples if key[0] == name}


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


def test_a_guarded_run_is_scraped_with_nan_exported_and_counted() -> None:
    sink = PrometheusSink(port=0, top_k=2, linger_s=0)
    run = tiny_run([sink])
    assert sink.port and sink.port > 0
    run_steps(run, 4)
    healthy = scrape(sink.port)
    assert value(healthy, "trainguard_step") == 3
    assert value(healthy, "trainguard_steps_total") == 4
    assert value(healthy, "trainguard_loss") == pytest.approx(run.reports[-1].loss)
    assert value(healthy, "trainguard_grad_norm") == pytest.approx(run.reports[-1].grad_norm)
    assert value(healthy, "trainguard_learning_rate", group="0") == pytest.approx(1e-2)
    assert value(healthy, "trainguard_clip_coefficient") == pytest.approx(
        run.reports[-1].clip_coef)
    assert value(healthy, "trainguard_nonfinite_total", what="loss") == 0
    assert value(healthy, "trainguard_events_total", kind="nonfinite_loss",
                 severity="error") == 0  # every registered kind starts at 0
    chosen = labelled(healthy, "trainguard_param_grad_norm", "param")
    assert len(chosen) == 2 and chosen <= set(PARAMS)

    run.step(nan=True)
    poisoned = scrape(sink.port)
    assert math.isnan(value(poisoned, "trainguard_loss"))
    assert math.isnan(value(poisoned, "trainguard_grad_norm"))
    assert value(poisoned, "trainguard_nonfinite_total", what="loss") == 1
    assert value(poisoned, "trainguard_nonfinite_total", what="grad_norm") == 1
    assert value(poisoned, "trainguard_nonfinite_total", what="grads") == len(PARAMS)
    assert value(poisoned, "trainguard_skipped_steps_total") == 1
    assert value(poisoned, "trainguard_events_total", kind="nonfinite_loss",
                 severity="error") == 1

    run_steps(run, 4)
    later = scrape(sink.port)
    assert labelled(later, "trainguard_param_grad_norm", "param") == chosen  # stable
    assert labelled(later, "trainguard_param_update_ratio", "param") == chosen
    modules = labelled(later, "trainguard_activation_zero_ratio", "module")
    assert 0 < len(modules) <= 2
    assert all(0 <= value(later, "trainguard_activation_zero_ratio", module=m) <= 1
               for m in modules)
    assert value(later, "trainguard_run_status", status="running") == 1
    run.guard.close()


def test_the_sink_has_its_own_registry_and_listens_on_loopback() -> None:
    import prometheus_client

    sink = PrometheusSink(port=0, linger_s=0)
    run = tiny_run([sink])
    run.step()
    assert sink._server is not None and sink._server.server_address[0] == "127.0.0.1"
    assert not [m for m in prometheus_client.REGISTRY.collect()
                if m.name.startswith("trainguard")]
    run.guard.close()
    assert sink._server is None


def test_all_params_exports_every_parameter() -> None:
    sink = PrometheusSink(port=0, all_params=True, linger_s=0)
    run = tiny_run([sink])
    run_steps(run, 2)
    samples = scrape(sink.port)
    assert labelled(samples, "trainguard_param_grad_norm", "param") == set(PARAMS)
    run.guard.close()


def test_the_verdict_and_status_are_served_after_close() -> None:
    sink = PrometheusSink(port=0, linger_s=30)
    run = tiny_run([sink])
    run_steps(run, 24)  # long enough to judge
    run.guard.close()
    final = scrape(sink.port)
    verdict = run.guard.run.verdict
    assert verdict is not None and verdict.verdict is not None
    assert value(final, "trainguard_verdict", verdict=verdict.verdict) == 1
    assert value(final, "trainguard_run_status", status="finished") == 1
    assert value(final, "trainguard_run_status", status="running") == 0
    # a new sink on the same port takes a lingering endpoint over
    port = sink.port
    successor = PrometheusSink(port=port, linger_s=0)
    run = tiny_run([successor])
    assert successor.active and successor.port == port
    run.guard.close()


def test_a_port_in_use_is_one_warning_and_training_goes_on(
        taken_port: int, caplog: pytest.LogCaptureFixture) -> None:
    sink = PrometheusSink(port=taken_port, linger_s=0)
    recorder = Recorder()
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        run = tiny_run([sink, recorder])
        run_steps(run, 4, nan_at=2)
        run.guard.close()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING
                and "Prometheus" in r.getMessage()]
    assert len(warnings) == 1 and str(taken_port) in warnings[0].getMessage()
    assert not sink.active and sink.port is None
    assert recorder.names().count("on_step") == 4
    assert run.reports[2].action == "skipped"
    assert "PrometheusSink" not in run.guard.run.sinks.failures  # it disabled itself


class _Gateway(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[str, str, bytes]]] = []

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.received.append(("PUT", self.path, body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_the_metrics_are_pushed_to_a_pushgateway_at_the_end() -> None:
    gateway = HTTPServer(("127.0.0.1", 0), _Gateway)
    thread = threading.Thread(target=gateway.serve_forever, daemon=True)
    thread.start()
    _Gateway.received.clear()
    try:
        sink = PrometheusSink(port=None, pushgateway=f"127.0.0.1:{gateway.server_port}",
                              job="unit")
        run = tiny_run([sink])
        run_steps(run, 3)
        assert _Gateway.received == []  # only at the end
        run.guard.close()
    finally:
        gateway.shutdown()
        gateway.server_close()
    assert len(_Gateway.received) == 1
    method, path, body = _Gateway.received[0]
    assert (method, path) == ("PUT", "/metrics/job/unit")
    assert b"trainguard_steps_total 3.0" in body
    assert b'trainguard_run_status{status="finished"} 1.0' in body


def test_a_failed_push_is_one_warning(taken_port: int, caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]  # nothing listens there once closed
    sink = PrometheusSink(port=0, pushgateway=f"127.0.0.1:{closed_port}", linger_s=0,
                          push_timeout=2)
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        run = tiny_run([sink])
        run_steps(run, 2)
        run.guard.close()  # does not raise
    warnings = [r for r in caplog.records if "Pushgateway" in r.getMessage()]
    assert len(warnings) == 1


def test_without_prometheus_client_the_error_names_the_extra(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError, match=r"trainguard\[prometheus\]"):
        PrometheusSink(port=0)


# -- the endpoint under hostile or careless clients ---------------------------------------------
def _endpoint_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("trainguard-prometheus"))


def _closed_by_server(conn: socket.socket) -> bool:
    conn.settimeout(0.05)
    try:
        return conn.recv(1) == b""
    except TimeoutError:
        return False  # still open
    except OSError:
        return True  # reset


def _wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_a_run_too_short_to_judge_serves_no_verdict() -> None:
    sink = PrometheusSink(port=0, linger_s=30)
    run = tiny_run([sink])
    run_steps(run, 6)
    run.guard.close()
    verdict = run.guard.run.verdict
    assert verdict is not None and verdict.verdict is None, verdict
    final = scrape(sink.port)
    assert {labels: v for (name, labels), v in final.items() if name == "trainguard_verdict"
            } == {(("verdict", name),): 0.0 for name in VERDICTS}
    successor = PrometheusSink(port=sink.port, linger_s=0)  # ends the lingering endpoint
    tiny_run([successor]).guard.close()


def test_idle_connections_hold_no_thread_and_are_closed_after_the_timeout() -> None:
    """Before, each idle connection held a thread forever (400 connections: 400 threads)."""
    sink = PrometheusSink(port=0, linger_s=0, idle_timeout_s=1.0)
    run = tiny_run([sink])
    run_steps(run, 2)
    assert sink.port
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", sink.port), timeout=5) for _ in range(50)]
    partial = socket.create_connection(("127.0.0.1", sink.port), timeout=5)
    partial.sendall(b"GET /metr")  # a request that never ends is closed at its deadline
    try:
        time.sleep(0.3)
        assert threading.active_count() == before, "no thread per connection"
        assert _endpoint_threads() == 2 + SCRAPE_THREADS  # accept, idle watch, workers
        assert value(scrape(sink.port), "trainguard_step") == 1  # answered meanwhile
        assert not any(_closed_by_server(c) for c in idle[:5])
        assert _wait_for(lambda: all(_closed_by_server(c) for c in [*idle, partial]), 5.0)
        assert threading.active_count() == before
        assert value(scrape(sink.port), "trainguard_step") == 1
    finally:
        for conn in [*idle, partial]:
            conn.close()
        run.guard.close()
    assert _wait_for(lambda: _endpoint_threads() == 0, 5.0), "the endpoint's threads end"


@pytest.mark.slow
def test_slow_clients_cannot_hold_the_scrape_threads() -> None:
    """Clients that send their request a byte at a time, each byte well within the timeout:
    before, each held a scrape thread for as long as it kept sending (4 of them: a scrape took
    54 s). The whole request is due `idle_timeout_s` after the connection was accepted."""
    sink = PrometheusSink(port=0, linger_s=0, idle_timeout_s=1.5)
    run = tiny_run([sink])
    run_steps(run, 2)
    assert sink.port
    stop = threading.Event()
    cut: list[float] = []

    def drip() -> None:
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", sink.port), timeout=5) as conn:
            for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 100:
                if stop.wait(0.25):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    cut.append(time.monotonic() - started)  # closed by the endpoint
                    return

    slow = [threading.Thread(target=drip, daemon=True) for _ in range(2 * SCRAPE_THREADS)]
    try:
        for thread in slow:
            thread.start()
        time.sleep(0.6)  # every slow client has sent a few bytes
        for _ in range(3):
            started = time.monotonic()
            assert value(scrape(sink.port), "trainguard_step") == 1
            assert time.monotonic() - started < 1.0
        assert _wait_for(lambda: len(cut) == len(slow), 6.0), cut
        assert max(cut) < 4.0, cut  # cut at their deadline, though they kept sending
    finally:
        stop.set()
        for thread in slow:
            thread.join(timeout=5)
        run.guard.close()


def test_at_most_max_connections_are_open_the_oldest_closed_first() -> None:
    sink = PrometheusSink(port=0, linger_s=0, idle_timeout_s=30.0, max_connections=10)
    run = tiny_run([sink])
    run.step()
    assert sink.port
    conns = []
    try:
        for _ in range(30):
            conns.append(socket.create_connection(("127.0.0.1", sink.port), timeout=5))
        assert _wait_for(lambda: all(_closed_by_server(c) for c in conns[:19]), 5.0)
        assert not any(_closed_by_server(c) for c in conns[-5:])
        assert value(scrape(sink.port), "trainguard_step") == 0
    finally:
        for conn in conns:
            conn.close()
        run.guard.close()


@pytest.mark.parametrize("settings, message", [
    ({"port": 70000}, "port must be a whole number from 0 to 65535"),
    ({"port": -1}, "port must be a whole number from 0 to 65535"),
    ({"port": "9464"}, "got '9464'"),
    ({"port": True}, "got True"),
    ({"addr": ""}, "addr must be a host name or address"),
    ({"idle_timeout_s": 0}, "idle_timeout_s must be a positive number of seconds"),
    ({"idle_timeout_s": math.inf}, "idle_timeout_s"),
    ({"max_connections": 0}, "max_connections must be at least 1"),
])
def test_a_bad_port_or_limit_is_a_config_error_when_the_sink_is_made(
        settings: dict[str, object], message: str) -> None:
    """Before, a port of 70000 or '9464' failed only at the run's start, as a sink failure."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        PrometheusSink(**settings)  # type: ignore[arg-type]


def test_an_address_not_of_this_machine_is_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    sink = PrometheusSink(port=0, addr="no-such-host.invalid", linger_s=0)
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        run = tiny_run([sink])
        run_steps(run, 3)
        run.guard.close()
    warnings = [r.getMessage() for r in caplog.records if "Prometheus" in r.getMessage()]
    assert len(warnings) == 1 and "no-such-host.invalid" in warnings[0]
    assert "training goes on" in warnings[0] and not sink.active
    assert len(run.reports) == 3
