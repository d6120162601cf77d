"""Prometheus: a run's health as metrics on an HTTP endpoint, for Prometheus to scrape.

    from trainguard.sinks import PrometheusSink
    guard = Guard(model, optimizer, sinks=[PrometheusSink(port=9464)])
    # scrape http://127.0.0.1:9464/metrics; `trainguard grafana --out DIR` writes a dashboard

Needs the `prometheus_client` package (`pip install 'trainguard[prometheus]'`). The metrics live
in the sink's own `CollectorRegistry` (never the process-wide one), are served by a small
threaded HTTP server on `addr:port` (loopback by default; port 0 picks a free port, read it from
`.port`), and are named `trainguard_*` in base units:

    gauges     trainguard_step, trainguard_loss, trainguard_loss_curvature,
               trainguard_grad_norm (global, before clipping), trainguard_clip_coefficient,
               trainguard_learning_rate{group}, trainguard_loss_scale,
               trainguard_last_step_timestamp_seconds, trainguard_eval_metric{metric},
               trainguard_run_status{status} (1 for the current one),
               trainguard_verdict{verdict} (1 for the run's verdict, set at the end)
    per layer  trainguard_param_grad_norm{param}, trainguard_param_update_ratio{param} (sampled
               steps), trainguard_activation_zero_ratio{module} (activation sparsity, sampled
               steps)
    counters   trainguard_steps_total, trainguard_skipped_steps_total,
               trainguard_rollbacks_total, trainguard_events_total{kind,severity},
               trainguard_nonfinite_total{what="loss"|"grad_norm"|"grads"} ("grads" counts
               parameters with a non-finite gradient norm)

A non-finite value is exported as it is (Prometheus keeps NaN and inf) and counted in
`trainguard_nonfinite_total`, so a rate or an alert sees it. The per-layer label set is bounded:
the `top_k` parameters by gradient norm at the first step whose norms are finite, kept for the
rest of the run, and the `top_k` modules ranked by the gradient norm of the parameters they hold
(the sparsest first among the others) at the first sampled step; `all_params=True` exports every
parameter and module instead. Every registered event kind starts at 0, so `increase()` sees the
first event.

The server starts when the run starts (on rank 0 only, under torch.distributed). A port that is
not a whole number from 0 to 65535 is a `ConfigError` when the sink is made; a port already in
use, or an address that is not this machine's, is one warning at the start: the sink disables
itself and training goes on (with a `pushgateway` it still keeps the metrics for the push).

The endpoint holds a bounded number of threads whatever its clients do: a connection's request
is gathered in one selector thread, without a thread of its own, until its head is whole, and the
connection is closed when the whole head has not come `idle_timeout_s` (10) seconds after it was
accepted, however the bytes trickle in; `SCRAPE_THREADS` (4) threads answer the whole requests,
and a connection still held by one `idle_timeout_s` after its request was whole is shut down (a
client that does not read its answer); at most `max_connections` (64) are open at once, the
longest-waiting one closed for a new one. A scrape is answered while hundreds of idle
connections, or slow ones sending a byte every few seconds, are open. After the run closed the
endpoint serves the final values for `linger_s` (15) seconds more, so a scrape sees the final
status and the verdict; a new sink on the same port takes it over at once. With
`pushgateway="host:9091"` the metrics are pushed once when the run closes, under `job`; a failed
push is one warning.
"""

from __future__ import annotations

import io
import logging
import math
import queue
import selectors
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, cast
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import numpy as np

from trainguard import vocabulary
from trainguard.errors import ConfigError
from trainguard.events import ActionRecord, Event, RunInfo, StepReport
from trainguard.sinks.base import Sink

if TYPE_CHECKING:
    from trainguard.run_verdict import RunVerdict
    from trainguard.signals import SampledStats

log = logging.getLogger("trainguard")

INSTALL_HINT = "pip install 'trainguard[prometheus]'"
STATUSES: tuple[str, ...] = vocabulary.STATUSES
NONFINITE = ("loss", "grad_norm", "grads")
NAN = math.nan
SCRAPE_THREADS = 4
"""Threads that answer requests (a scrape takes milliseconds)."""
MAX_HEAD_BYTES = 65536
"""A request head longer than this is not a scrape: the connection is closed."""


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise ImportError(f"PrometheusSink needs the prometheus_client package: {INSTALL_HINT} "
                          f"({exc})") from exc
    return prometheus_client


class _Server(WSGIServer):
    """A WSGI server with a bounded number of threads: accepted connections wait in a selector
    (no thread each) until their request head is whole, then `SCRAPE_THREADS` workers answer
    them. A connection is closed when its head is not whole `idle_timeout_s` after it was
    accepted, and shut down when a worker still holds it `idle_timeout_s` after the head was
    whole: a whole-request deadline, not one per read; at most `max_connections` are open."""

    request_queue_size = 64
    idle_timeout_s = 10.0
    max_connections = 64
    _active = False

    def server_activate(self) -> None:
        super().server_activate()
        self._active = True
        self._lock = threading.Lock()
        self._new: list[tuple[socket.socket, Any]] = []
        self._waiting: dict[socket.socket, tuple[Any, float]] = {}
        self._heads: dict[socket.socket, bytearray] = {}
        self._working: dict[socket.socket, float] = {}
        """Connections a worker holds -> when they are shut down (under `_lock`)."""
        self._open = 0
        self._stopping = False
        self._jobs: queue.SimpleQueue[tuple[socket.socket, Any] | None] = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)  # never stall the accepting thread
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._threads = [threading.Thread(target=self._watch, name="trainguard-prometheus-idle",
                                          daemon=True)]
        self._threads += [threading.Thread(target=self._work, daemon=True,
                                           name=f"trainguard-prometheus-{i}")
                          for i in range(SCRAPE_THREADS)]
        for thread in self._threads:
            thread.start()

    # -- called by serve_forever's thread, once per accepted connection
    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            if self._stopping:
                self.shutdown_request(request)
                return
            self._open += 1
            self._new.append((request, client_address))
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass  # the wake-up pipe is full: the watcher is awake already

    def _watch(self) -> None:
        """Wait for requests without a thread per connection; close idle connections."""
        while True:
            with self._lock:
                if self._stopping:
                    return
                new, self._new = self._new, []
            now = time.monotonic()
            for request, address in new:
                try:
                    self._selector.register(request, selectors.EVENT_READ)
                except (ValueError, OSError):  # closed by its client already
                    self._done(request)
                    continue
                self._waiting[request] = (address, now + self.idle_timeout_s)
            while self._waiting and self._open > self.max_connections:
                oldest = min(self._waiting, key=lambda r: self._waiting[r][1])
                self._close_waiting(oldest)
            with self._lock:
                deadlines = [d for _, d in self._waiting.values()] + list(self._working.values())
            timeout = min(deadlines) - now if deadlines else None
            for key, _ in self._selector.select(None if timeout is None else max(timeout, 0)):
                if key.fileobj is self._wake_r:
                    try:
                        while self._wake_r.recv(4096):
                            pass
                    except OSError:
                        pass  # drained
                    continue
                self._gather(cast(socket.socket, key.fileobj))
            now = time.monotonic()
            for request in [r for r, (_, d) in self._waiting.items() if d <= now]:
                self._close_waiting(request)
            self._cut_overdue(now)

    def _gather(self, request: socket.socket) -> None:
        """Take what a waiting connection sent; hand it to a worker once its head is whole."""
        try:
            chunk = request.recv(4096, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        head = self._heads.setdefault(request, bytearray())
        head += chunk
        if not chunk or len(head) > MAX_HEAD_BYTES:  # gone, or not a scrape
            self._close_waiting(request)
            return
        if b"\r\n\r\n" not in head and b"\n\n" not in head:
            return  # more to come, before the deadline set when it was accepted
        address, _ = self._waiting.pop(request)
        self._selector.unregister(request)
        with self._lock:
            self._working[request] = time.monotonic() + self.idle_timeout_s
        self._jobs.put((request, address))

    def take_head(self, request: socket.socket) -> bytes:
        """The request head gathered for a worker's connection."""
        return bytes(self._heads.pop(request, b""))

    def _cut_overdue(self, now: float) -> None:
        """Shut down the connections workers hold past their deadline (a client that does not
        read its answer): the worker's blocked write fails and the worker is free."""
        with self._lock:
            for request, deadline in list(self._working.items()):
                if deadline <= now:
                    del self._working[request]
                    try:
                        request.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass  # closed by its client already

    def _close_waiting(self, request: socket.socket) -> None:
        del self._waiting[request]
        self._heads.pop(request, None)
        self._selector.unregister(request)
        self._done(request)

    def _done(self, request: socket.socket) -> None:
        with self._lock:  # before the close: `_cut_overdue` never shuts down a closed socket
            self._working.pop(request, None)
        self.shutdown_request(request)
        with self._lock:
            self._open -= 1

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            request, address = job
            try:
                self.finish_request(request, address)
            except Exception:
                self.handle_error(request, address)
            finally:
                self._done(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-request is no news for the training log."""
        log.debug("trainguard: a Prometheus scrape from %s failed", client_address,
                  exc_info=True)

    def server_close(self) -> None:
        super().server_close()
        if not self._active:
            return  # the bind failed: no thread was started
        with self._lock:
            self._stopping = True
        self._wake()
        for _ in range(SCRAPE_THREADS):
            self._jobs.put(None)
        self._threads[0].join(timeout=5)
        for request in list(self._waiting):
            self._close_waiting(request)
        for request, _ in self._new:
            self._done(request)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()


class _Server6(_Server):
    address_family = socket.AF_INET6


class _HeadFirst(io.RawIOBase):
    """A connection's bytes: the head the selector gathered, then the socket's."""

    def __init__(self, head: bytes, connection: socket.socket) -> None:
        self._head = memoryview(head)
        self._connection = connection

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            size = min(len(buffer), len(self._head))
            buffer[:size] = self._head[:size]
            self._head = self._head[size:]
            return size
        return self._connection.recv_into(buffer)


class _QuietHandler(WSGIRequestHandler):
    def setup(self) -> None:
        super().setup()
        server = cast(_Server, self.server)
        # A client that stops reading mid-answer frees its thread after this long at most.
        self.connection.settimeout(server.idle_timeout_s)
        self.rfile = io.BufferedReader(_HeadFirst(server.take_head(self.connection),
                                                  self.connection))

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged."""


class PrometheusSink(Sink):
    """Serves the run's metrics for Prometheus; see the module's docstring for the names."""

    def __init__(self, port: int | None = 9464, addr: str = "127.0.0.1", top_k: int = 10,
                 all_params: bool = False, pushgateway: str | None = None,
                 job: str = "trainguard", *, linger_s: float = 15.0,
                 push_timeout: float = 10.0, idle_timeout_s: float = 10.0,
                 max_connections: int = 64) -> None:
        client = _client()  # a missing extra fails here, loudly
        if top_k < 1:
            raise ValueError(f"PrometheusSink top_k must be at least 1, got {top_k}")
        if port is not None and not (isinstance(port, int) and not isinstance(port, bool)
                                     and 0 <= port <= 65535):
            raise ConfigError(f"PrometheusSink port must be a whole number from 0 to 65535 (0: "
                              f"any free port) or None, got {port!r}")
        if not isinstance(addr, str) or not addr:
            raise ConfigError(f"PrometheusSink addr must be a host name or address, got {addr!r}")
        if not (isinstance(idle_timeout_s, (int, float)) and not isinstance(idle_timeout_s, bool)
                and 0 < idle_timeout_s < math.inf):
            raise ConfigError(f"PrometheusSink idle_timeout_s must be a positive number of "
                              f"seconds, got {idle_timeout_s!r}")
        if not (isinstance(max_connections, int) and not isinstance(max_connections, bool)
                and max_connections >= 1):
            raise ConfigError(f"PrometheusSink max_connections must be at least 1, got "
                              f"{max_connections!r}")
        self._client = client
        self.requested_port = port
        """The port asked for; None serves nothing (push only)."""
        self.addr = addr
        self.top_k = top_k
        self.all_params = all_params
        self.pushgateway = pushgateway
        self.job = job
        self.push_timeout = push_timeout
        self.linger_s = linger_s
        """How long the endpoint stays up after the run closed, so that a scrape sees the final
        status and the verdict (a daemon thread: it never delays the end of the process)."""
        self.idle_timeout_s = float(idle_timeout_s)
        """A connection whose request head is not whole this long after it was accepted is
        closed; one whose answer is not taken this long after its request is shut down."""
        self.max_connections = max_connections
        """Connections open at once; the longest-waiting one is closed for a new one."""
        self.port: int | None = None
        """The port the endpoint listens on once the run started (the free one for port 0)."""
        self.active = True
        """False once the sink disabled itself (its port was taken and there is no push)."""
        self.registry = client.CollectorRegistry(auto_describe=True)
        self._server: _Server | None = None
        self._closed = False
        self._names: list[str] = []
        self._build_metrics()

    # -- metrics ---------------------------------------------------------------------------------
    def _build_metrics(self) -> None:
        client, registry = self._client, self.registry

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            return client.Gauge(f"trainguard_{name}", doc, labels, registry=registry)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            return client.Counter(f"trainguard_{name}", doc, labels, registry=registry)

        self.step = gauge("step", "the last optimizer step reported")
        self.loss = gauge("loss", "the loss of the last step (NaN when non-finite or none)")
        self.loss_curvature = gauge("loss_curvature",
                                    "smoothed second difference of the log loss")
        self.grad_norm = gauge("grad_norm", "global gradient norm before clipping")
        self.clip_coefficient = gauge("clip_coefficient",
                                      "factor the gradients were multiplied by (1: not clipped)")
        self.learning_rate = gauge("learning_rate", "learning rate per parameter group",
                                   ("group",))
        self.loss_scale = gauge("loss_scale", "the AMP GradScaler's loss scale")
        self.last_step_time = gauge("last_step_timestamp_seconds",
                                    "Unix time of the last step reported")
        self.eval_metric = gauge("eval_metric", "the last evaluation metrics", ("metric",))
        self.run_status = gauge("run_status", "1 for the run's current status", ("status",))
        self.verdict = gauge("verdict", "1 for the run's verdict, set when it closes",
                             ("verdict",))
        self.param_grad_norm = gauge("param_grad_norm",
                                     "gradient norm of a parameter (top_k parameters)",
                                     ("param",))
        self.param_update_ratio = gauge("param_update_ratio",
                                        "||dW|| / ||W|| of a parameter (sampled steps)",
                                        ("param",))
        self.activation_zero_ratio = gauge("activation_zero_ratio",
                                           "share of exact zeros in a module's output "
                                           "(sampled steps)", ("module",))
        self.steps = counter("steps", "optimizer steps reported")
        self.skipped_steps = counter("skipped_steps", "steps whose update was skipped")
        self.rollbacks = counter("rollbacks", "rollbacks to a good state")
        self.events = counter("events", "events raised", ("kind", "severity"))
        self.nonfinite = counter("nonfinite", "non-finite values seen", ("what",))

        for gauge_ in (self.loss, self.loss_curvature, self.grad_norm, self.loss_scale):
            gauge_.set(NAN)  # unknown until measured, not 0
        self.clip_coefficient.set(1.0)
        self._status = {s: self.run_status.labels(status=s) for s in STATUSES}
        self._nonfinite = {w: self.nonfinite.labels(what=w) for w in NONFINITE}
        self._events: dict[tuple[str, str], Any] = {}
        from trainguard.registry import event_kinds

        for kind in event_kinds():  # so that increase() sees the first event of each kind
            self._event_counter(kind.name, kind.severity)
        self._lrs: list[Any] = []
        self._params: list[tuple[int, Any, Any]] | None = None
        """(index, grad-norm gauge, update-ratio gauge) of each exported parameter."""
        self._chosen_norms: dict[str, float] = {}
        self._modules: dict[str, Any] | None = None
        self._evals: dict[str, Any] = {}

    def _event_counter(self, kind: str, severity: str) -> Any:
        counter = self._events.get((kind, severity))
        if counter is None:
            counter = self._events[(kind, severity)] = self.events.labels(kind=kind,
                                                                          severity=severity)
        return counter

    def _set_status(self, status: str) -> None:
        for name, gauge_ in self._status.items():
            gauge_.set(1.0 if name == status else 0.0)
        if status not in self._status:
            self.run_status.labels(status=status).set(1.0)

    # -- the endpoint ----------------------------------------------------------------------------
    def _serve(self) -> None:
        if self.requested_port is None:
            return
        base: type[_Server] = _Server6 if ":" in self.addr else _Server
        server_type: type[_Server] = type("_Server", (base,), {
            "idle_timeout_s": self.idle_timeout_s, "max_connections": self.max_connections})
        _release_lingering(self.addr, self.requested_port)
        try:
            server = make_server(self.addr, self.requested_port,
                                 self._client.make_wsgi_app(self.registry), server_type,
                                 handler_class=_QuietHandler)
        except OSError as exc:  # the port is taken, or the address is not this machine's
            self.active = self.pushgateway is not None
            then = ("the metrics are kept for the push to the Pushgateway" if self.active
                    else "the PrometheusSink is disabled")
            log.warning("trainguard: cannot serve Prometheus metrics on %s:%s (%s); %s, "
                        "training goes on", self.addr, self.requested_port, exc, then)
            return
        self._server = server
        self.port = int(server.server_address[1])
        threading.Thread(target=server.serve_forever, name="trainguard-prometheus",
                         daemon=True).start()

    def _linger(self) -> None:
        """Keep serving the final values for `linger_s`; a new sink on the same port takes the
        port over at once."""
        server, self._server = self._server, None
        if server is None:
            return
        if self.linger_s <= 0:
            _stop_server(server)
            return
        with _LINGER_LOCK:
            _LINGERING[(self.addr, self.port)] = server
        timer = threading.Timer(self.linger_s, _release_lingering, (self.addr, self.port, server))
        timer.daemon = True
        timer.start()

    def _push(self) -> None:
        if self.pushgateway is None:
            return
        try:
            self._client.push_to_gateway(self.pushgateway, job=self.job, registry=self.registry,
                                         timeout=self.push_timeout)
        except Exception as exc:  # the run is over; a lost push must not turn it into a crash
            log.warning("trainguard: could not push the metrics to the Pushgateway %s (%s: %s)",
                        self.pushgateway, type(exc).__name__, exc)

    # -- per-layer label sets --------------------------------------------------------------------
    def _choose_params(self, norms: np.ndarray, names: list[str]) -> None:
        if self._params is not None and not (self.all_params and len(self._params) < len(names)):
            return
        if self.all_params:
            chosen = list(range(len(names)))
        else:
            finite = np.isfinite(norms)
            if not finite.any():
                return  # wait for a step that says which layers carry the gradient
            order = np.argsort(np.where(finite, -norms, np.inf), kind="stable")
            chosen = [int(i) for i in order[: self.top_k] if finite[i]]
            self._chosen_norms = {}
            for name, norm in zip(names, norms.tolist(), strict=False):
                self._chosen_norms[name] = norm if math.isfinite(norm) else 0.0
        self._params = [(i, self.param_grad_norm.labels(param=names[i]),
                         self.param_update_ratio.labels(param=names[i])) for i in chosen]

    def _choose_modules(self, sample: SampledStats) -> None:
        names = sample.module_names
        if self._modules is not None and not (self.all_params
                                              and len(self._modules) < len(names)):
            return
        if self.all_params:
            chosen = list(names)
        else:
            owned = {name: 0.0 for name in names}
            for param, norm in self._chosen_norms.items():
                owner = param.rpartition(".")[0]
                if owner in owned:
                    owned[owner] += norm * norm
            zeros = np.asarray(sample.per_module.get("act_zero_frac", np.zeros(len(names))),
                               dtype=np.float64)
            sparsity = {name: float(z) if math.isfinite(z) else 0.0
                        for name, z in zip(names, zeros.tolist(), strict=False)}
            chosen = sorted(names, key=lambda n: (-owned[n], -sparsity.get(n, 0.0)))[: self.top_k]
        self._modules = {name: self.activation_zero_ratio.labels(module=name) for name in chosen}

    # -- the sink --------------------------------------------------------------------------------
    def on_run_start(self, run: RunInfo) -> None:
        self._names = list(run.param_names)
        self._set_status("running")
        self._serve()

    def on_event(self, event: Event) -> None:
        if self.active:
            self._event_counter(event.kind, event.severity).inc()

    def on_action(self, action: ActionRecord) -> None:
        if not self.active:
            return
        if action.kind == "rollback":
            self.rollbacks.inc()
        elif action.kind == "watch":  # parameters added mid-run
            self._names.extend(action.details.get("names", []))

    def on_step(self, report: StepReport) -> None:
        if not self.active:
            return
        self.step.set(report.step)
        self.last_step_time.set_to_current_time()
        self.steps.inc()
        if report.skipped:
            self.skipped_steps.inc()
        loss = report.loss
        self.loss.set(NAN if loss is None else loss)
        if loss is not None and not math.isfinite(loss):
            self._nonfinite["loss"].inc()
        self.grad_norm.set(report.grad_norm)
        if not math.isfinite(report.grad_norm):
            self._nonfinite["grad_norm"].inc()
        self.clip_coefficient.set(report.clip_coef)
        self.loss_curvature.set(NAN if report.loss_curvature is None else report.loss_curvature)
        if report.loss_scale is not None:
            self.loss_scale.set(report.loss_scale)
        signals = report.signals
        lrs = tuple(signals.group_lrs) if signals is not None and signals.group_lrs else (
            (report.lr,) if report.lr is not None else ())
        while len(self._lrs) < len(lrs):
            self._lrs.append(self.learning_rate.labels(group=str(len(self._lrs))))
        for gauge_, lr in zip(self._lrs, lrs, strict=False):
            gauge_.set(lr)
        if signals is None:
            return
        norms = np.asarray(signals.param_grad_norm, dtype=np.float64)
        bad = int((~np.isfinite(norms)).sum())
        if bad:
            self._nonfinite["grads"].inc(bad)
        self._choose_params(norms, signals.param_names)
        for index, gauge_, _ in self._params or ():
            if index < len(norms):
                gauge_.set(float(norms[index]))
        self.on_sampled(signals.sampled)

    def on_sampled(self, stats: list[SampledStats]) -> None:
        if not self.active:
            return
        for sample in stats:
            ratios = sample.per_param.get("update_ratio")
            if ratios is not None and self._params is not None:
                for index, _, gauge_ in self._params:
                    if index < len(ratios):
                        gauge_.set(float(ratios[index]))
            zeros = sample.per_module.get("act_zero_frac")
            if zeros is not None and sample.module_names:
                self._choose_modules(sample)
                modules = self._modules or {}
                for name, value in zip(sample.module_names, zeros.tolist(), strict=False):
                    gauge_ = modules.get(name)
                    if gauge_ is not None:
                        gauge_.set(value)

    def on_eval(self, step: int, metrics: dict[str, float]) -> None:
        if not self.active:
            return
        for name, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                gauge_ = self._evals.get(name)
                if gauge_ is None:
                    gauge_ = self._evals[name] = self.eval_metric.labels(metric=name)
                gauge_.set(float(value))

    def on_verdict(self, verdict: RunVerdict) -> None:
        if not self.active:
            return
        # no verdict (too short to judge): every verdict's gauge reads 0
        for name in vocabulary.VERDICTS:
            self.verdict.labels(verdict=name).set(1.0 if name == verdict.verdict else 0.0)

    def on_run_end(self, status: str) -> None:
        if self.active:
            self._set_status(status)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self.active:
                self._push()
        finally:
            self._linger()


_LINGERING: dict[tuple[str, int | None], _Server] = {}
"""Servers of closed sinks still serving their final values, by (addr, port)."""
_LINGER_LOCK = threading.Lock()


def _release_lingering(addr: str, port: int | None, server: _Server | None = None) -> None:
    """Stop the server lingering on (addr, port): any, or only `server`."""
    with _LINGER_LOCK:
        found = _LINGERING.get((addr, port))
        if found is None or (server is not None and found is not server):
            return
        del _LINGERING[(addr, port)]
    _stop_server(found)


def _stop_server(server: _Server) -> None:
    server.shutdown()
    server.server_close()
