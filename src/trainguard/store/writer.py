"""Writes a run to its store from a background thread.

The training thread only enqueues records (a deque: no lock). The writer thread commits what is
queued in one transaction as soon as `COMMIT_AT_STEPS` steps are waiting or `COMMIT_INTERVAL_S`
has passed; SQLite's write-ahead log makes every committed step survive a SIGKILL of the process.
A writer that falls behind (it needs the GIL, which a busy training thread holds) is waited for:
a step never returns while more than `MAX_UNCOMMITTED_STEPS` steps, or a step older than
`MAX_UNCOMMITTED_S`, are uncommitted, so a SIGKILL loses at most that much. The wait is bounded
(`MAX_WAIT_S`): a stalled disk slows no step for longer, and a writer that cannot keep up is
reported once and no longer waited for. If the disk fails, the store reports it once and drops
records: monitoring must never stop training.

Every `RunStore` is one run of its directory (`run_id`): a new one by default, the latest one with
`resume=True`. While it is open it holds an exclusive `flock` on `trainguard.lock` in the
directory, so a second writer is refused (`RunDirInUse`) instead of interleaving its steps; the
operating system releases the lock when the process dies, however it dies. Readers never lock.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from trainguard.errors import RunDirInUse, StoreUnavailable
from trainguard.events import ActionRecord, Event
from trainguard.formatting import strict_json as strict_json  # re-exported for scripts
from trainguard.store import schema
from trainguard.store.files import DB_NAME as DB_NAME  # re-exported
from trainguard.store.files import LOCK_NAME as LOCK_NAME  # re-exported
from trainguard.store.files import SQLITE_HEADER, read_holder, read_note, write_note

log = logging.getLogger("trainguard")

_STOP = ("stop",)

COMMIT_AT_STEPS = 4
"""The writer is woken to commit once this many steps wait."""
COMMIT_INTERVAL_S = 0.05
"""...and commits whatever waits at least this often."""
MAX_UNCOMMITTED_STEPS = 8
"""A step returns only when at most this many steps (itself included) wait to be committed."""
MAX_UNCOMMITTED_S = 0.25
"""...and none of them was put longer ago than this."""
MAX_WAIT_S = 0.5
"""The longest one step waits for the writer; after such a wait the writer is no longer waited
for until it has caught up."""


def to_json(value: Any) -> str:
    return json.dumps(value, default=_json_default, allow_nan=True)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return repr(value)


def to_blob(values: np.ndarray) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


class RunStore:
    """Asynchronous writer of one run in a run directory.

    Raises `StoreUnavailable` when the directory cannot hold a store (nothing is created then,
    and an existing file that is not a trainguard store is left untouched) and `RunDirInUse` when
    another live writer holds the directory.
    """

    def __init__(self, run_dir: str | Path, *, resume: bool = False,
                 max_queue: int = 10_000) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / DB_NAME
        self.lock_path = self.run_dir / LOCK_NAME
        self.failed: str | None = None
        """Why the store stopped writing (None while it works)."""
        self.failed_step: int | None = None
        self.dropped = 0
        """Records lost: after a failure, or when the queue was full."""
        self.dropped_steps = 0
        """Of those, the steps."""
        self._status: tuple[str, float | None] | None = None
        """The last status set (the run's close status), written at close even if its record
        was dropped."""
        self.resumed = False
        """True when this store continues an earlier run (`resume=True` and there was one)."""
        self._earlier_error: str | None = None
        """What ended the process this one resumes from (an exception's type), when known."""
        self._last_stored: int | None = None
        """The last step the run held when this process resumed it (None: nothing stored)."""
        self.offset: int | None = 0
        """Added to every step this process records (None: decided by its first step). A
        resumed run continues after its last stored step: a process that counts from 0 (no
        `load_state_dict`), or from a checkpoint older than the last stored step, has its steps
        stored after it, so the earlier process's steps are never overwritten."""
        self._count_lock = threading.Lock()
        self._closed = False
        self._lock_fd = -1
        self._note: dict[str, Any] | None = None
        try:
            created_dirs = self._make_dir()
        except OSError as exc:  # e.g. a parent that cannot be searched
            raise self._unavailable("the directory cannot be used", _reason(exc)) from None
        created: list[Path] = []
        try:
            self._lock_fd = self._lock(created)
            self._conn, self.run_id = self._open(resume, created)
        except BaseException as exc:
            # nothing half-way: remove what this attempt created, newest first
            if self._lock_fd >= 0:
                for path in created:
                    path.unlink(missing_ok=True)
                os.close(self._lock_fd)
                self._lock_fd = -1
            for directory in reversed(created_dirs):
                try:
                    directory.rmdir()
                except OSError:
                    break
            if isinstance(exc, OSError):
                raise self._unavailable("the directory cannot be used", _reason(exc)) from None
            raise
        self._max_queue = max_queue
        if self._last_stored is not None:
            self.offset = None
        self._queue: deque[tuple] = deque()
        """Records for the writer: appended by the training thread, taken by the writer."""
        self._wake = threading.Event()
        self._commit_cond = threading.Condition()
        self._steps_put = 0
        """Step records enqueued (training thread)."""
        self._steps_done = 0
        """Step records committed, or dropped by a failed store (writer thread)."""
        self._put_times: deque[float] = deque()
        """When each step not yet known to be done was enqueued (training thread)."""
        self._lagging = False
        """The writer did not keep up within `MAX_WAIT_S`: not waited for until it catches up."""
        self._thread = threading.Thread(target=self._run, name="trainguard-store", daemon=True)
        self._thread.start()

    # -- opening -------------------------------------------------------------------------------
    def _unavailable(self, what: str, reason: str) -> StoreUnavailable:
        return StoreUnavailable(f"cannot record the run in {self.run_dir}: {what} ({reason})")

    def _make_dir(self) -> list[Path]:
        """Create the run directory (and missing parents); returns what was created."""
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise self._unavailable("the path exists and is not a directory", "use another "
                                    "run_dir")
        missing: list[Path] = []
        probe = self.run_dir
        while not probe.exists() and probe != probe.parent:
            missing.append(probe)
            probe = probe.parent
        created: list[Path] = []
        try:
            for directory in reversed(missing):
                try:
                    directory.mkdir()
                except FileExistsError:  # another process made it meanwhile: not ours
                    if not directory.is_dir():
                        raise
                    continue
                created.append(directory)
        except OSError as exc:
            for directory in reversed(created):
                try:
                    directory.rmdir()
                except OSError:
                    break
            raise self._unavailable("the directory cannot be created", _reason(exc)) from None
        return created

    def _lock(self, created: list[Path]) -> int:
        flags = os.O_RDWR | os.O_CLOEXEC
        try:
            try:
                fd = os.open(self.lock_path, flags | os.O_CREAT | os.O_EXCL, 0o644)
                created.append(self.lock_path)
            except FileExistsError:
                fd = os.open(self.lock_path, flags)
        except OSError as exc:
            raise self._unavailable("the directory is not writable",
                                    f"cannot open {LOCK_NAME}: {_reason(exc)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if created:  # never ours to remove while another writer may hold it
                created.clear()
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise self._unavailable("the directory cannot be locked", _reason(exc)) from None
            raise self._in_use() from None
        self._note = read_note(self.lock_path)  # an earlier writer's, applied in `_prepare`
        try:  # who holds the directory, for the message a second writer gets
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        except OSError:
            pass
        return fd

    def _in_use(self) -> RunDirInUse:
        pid = read_holder(self.lock_path)
        if pid == os.getpid():
            message = (f"the run directory {self.run_dir} is already being written by this "
                       f"process (pid {pid}): close the Guard or store that writes it first "
                       "(one no longer at hand, as after re-running a notebook cell: "
                       "trainguard.close_open_runs()), or use another run_dir")
        else:
            holder = f"process {pid}" if pid is not None else "another process"
            message = (f"the run directory {self.run_dir} is in use by {holder}: use another "
                       f"run_dir, or stop that process first")
        return RunDirInUse(message, run_dir=str(self.run_dir), pid=pid)

    def _open(self, resume: bool, created: list[Path]) -> tuple[sqlite3.Connection, int]:
        if self.path.exists():
            self._check_existing_file()
        else:
            created.extend([self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm")])
        try:
            conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                                   timeout=10)
        except sqlite3.Error as exc:
            raise self._unavailable("the store cannot be opened", str(exc)) from None
        try:
            run_id = self._prepare(conn, resume)
        except StoreUnavailable:
            conn.close()
            raise
        except (sqlite3.Error, OSError) as exc:
            try:
                conn.close()
            except sqlite3.Error:
                pass
            raise self._unavailable("the store cannot be written", _reason(exc)) from None
        return conn, run_id

    def _check_existing_file(self) -> None:
        """Refuse a file that is not SQLite before SQLite writes anything into it."""
        if not self.path.is_file():
            raise self._unavailable(f"{self.path} is not a file", "move it away")
        try:
            with open(self.path, "rb") as handle:
                header = handle.read(len(SQLITE_HEADER))
        except OSError as exc:
            raise self._unavailable(f"{self.path} cannot be read", _reason(exc)) from None
        if header and header != SQLITE_HEADER:
            raise self._unavailable(f"{self.path} is not a trainguard store",
                                    "not an SQLite database; it was left untouched")

    def _prepare(self, conn: sqlite3.Connection, resume: bool) -> int:
        try:
            version = schema.store_version(conn)
        except sqlite3.DatabaseError as exc:
            raise self._unavailable(f"{self.path} is not a trainguard store",
                                    f"{exc}; it was left untouched") from None
        if version is None:
            raise self._unavailable(f"{self.path} is not a trainguard store",
                                    "it holds other tables; it was left untouched")
        if version > schema.SCHEMA_VERSION:
            raise self._unavailable(f"{self.path} was written by a newer trainguard",
                                    f"store version {version}, this one writes "
                                    f"{schema.SCHEMA_VERSION}")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        with transaction(conn, "BEGIN IMMEDIATE"):
            if version == 0:
                schema.create(conn)
            elif version == 1:
                schema.migrate_v1(conn)
            schema.add_columns(conn)
            self._apply_note(conn)
            return self._start_run(conn, resume)

    def _apply_note(self, conn: sqlite3.Connection) -> None:
        """An earlier writer that could not record its failure or close status (a full disk)
        left them in the lock file: into its runs row now, before the note is overwritten."""
        note = self._note
        if note is None or not isinstance(note.get("run_id"), int):
            return
        row = conn.execute("SELECT status, pid FROM runs WHERE id = ?",
                           (note["run_id"],)).fetchone()
        if row is None or row[1] != note.get("pid"):
            return
        conn.execute("UPDATE runs SET store_failed = coalesce(?, store_failed), "
                     "failed_step = coalesce(?, failed_step), dropped = max(dropped, ?), "
                     "dropped_steps = max(dropped_steps, ?) WHERE id = ?",
                     (note.get("store_failed"), note.get("failed_step"),
                      int(note.get("dropped") or 0), int(note.get("dropped_steps") or 0),
                      note["run_id"]))
        if row[0] == "running" and isinstance(note.get("status"), str):
            conn.execute("UPDATE runs SET status = ?, ended = ? WHERE id = ?",
                         (note["status"], note.get("ended"), note["run_id"]))
            conn.execute("INSERT OR REPLACE INTO meta VALUES (?, 'status', ?)",
                         (note["run_id"], to_json(note["status"])))

    def _start_run(self, conn: sqlite3.Connection, resume: bool) -> int:
        host, pid = socket.gethostname(), os.getpid()
        latest = conn.execute("SELECT max(id) FROM runs").fetchone()[0]
        if resume and latest is not None:
            conn.execute("UPDATE runs SET status = 'running', ended = NULL, pid = ?, "
                         "hostname = ?, resumed = resumed + 1 WHERE id = ?", (pid, host, latest))
            self.resumed = True
            run_id = int(latest)
            self._last_stored = max(
                (row[0] for table in ("steps", "param_metrics", "module_metrics", "events",
                                      "actions")
                 for row in conn.execute(f"SELECT max(step) FROM {table} WHERE run_id = ?",
                                         (run_id,)) if row[0] is not None), default=None)
            # what ended the process before (Ctrl-C, a crash) ended that process, not the run
            # this one continues: kept with this resume, no longer the run's own end
            ended = conn.execute("SELECT value FROM meta WHERE run_id = ? AND key = 'error'",
                                 (run_id,)).fetchone()
            if ended is not None:
                try:
                    earlier = json.loads(ended[0])
                except ValueError:
                    earlier = None
                self._earlier_error = (earlier.get("type") if isinstance(earlier, dict)
                                       and isinstance(earlier.get("type"), str) else None)
                conn.execute("DELETE FROM meta WHERE run_id = ? AND key = 'error'", (run_id,))
        else:
            cursor = conn.execute("INSERT INTO runs (started, status, pid, hostname) "
                                  "VALUES (?, 'running', ?, ?)", (time.time(), pid, host))
            run_id = int(cursor.lastrowid)  # type: ignore[arg-type]
        conn.execute("INSERT OR REPLACE INTO meta VALUES (?, 'status', ?)",
                     (run_id, to_json("running")))
        return run_id

    # -- enqueueing (training thread) ---------------------------------------------------------
    def _drop(self, records: list[tuple] | tuple) -> None:
        batch = records if isinstance(records, list) else [records]
        steps = sum(1 for record in batch if record[0] == "step")
        with self._count_lock:
            self.dropped += len(batch)
            self.dropped_steps += steps

    def _put(self, record: tuple) -> bool:
        """Enqueue a record; False when it was dropped (or the store is closed)."""
        if self._closed:
            return False
        if self.failed is not None or len(self._queue) >= self._max_queue:
            self._drop(record)
            return False
        self._queue.append(record)  # deque.append is atomic: no lock a signal could catch held
        return True

    def put_meta(self, key: str, value: Any) -> None:
        if key == "status":  # the runs row holds the status; meta mirrors it
            self.set_status(str(value))
            return
        self._put(("meta", key, to_json(value)))

    def set_status(self, status: str) -> None:
        """Set the run's status; any status but "running" also records when the run ended."""
        ended = None if status == "running" else time.time()
        self._status = (status, ended)
        self._put(("status", status, ended))

    def put_step(self, step: int, scalars: dict[str, Any], grad_norms: np.ndarray | None) -> None:
        if self._put(("step", step, time.time(), scalars,
                      None if grad_norms is None else to_blob(grad_norms))):
            self._steps_put += 1
            self._put_times.append(time.monotonic())
            self._pace()

    def _pace(self) -> None:
        """Wake the writer when steps wait; wait for it (bounded) when too many, or too old."""
        times = self._put_times
        while len(times) > self._steps_put - self._steps_done:
            times.popleft()  # committed meanwhile
        waiting = len(times)
        if waiting >= COMMIT_AT_STEPS and not self._wake.is_set():
            self._wake.set()
        now = time.monotonic()
        if waiting <= MAX_UNCOMMITTED_STEPS and (not waiting
                                                 or now - times[0] <= MAX_UNCOMMITTED_S):
            self._lagging = False
            return
        if self._lagging or self.failed is not None or not self._thread.is_alive():
            return
        self._wake.set()
        deadline = now + MAX_WAIT_S
        with self._commit_cond:  # until every step put so far is committed
            while self._steps_done < self._steps_put:
                left = deadline - time.monotonic()
                if left <= 0 or self.failed is not None:
                    break
                self._commit_cond.wait(left)
            else:
                return
        if self.failed is None:
            self._lagging = True
            log.warning("trainguard: the run store at %s cannot keep up with the steps (no commit "
                        "within %.1f s); training goes on without waiting for it, and a kill "
                        "may lose more than the last %d steps", self.path, MAX_WAIT_S,
                        MAX_UNCOMMITTED_STEPS)

    def put_param_metrics(self, step: int, metrics: dict[str, np.ndarray]) -> None:
        self._put(("param", step, {k: to_blob(v) for k, v in metrics.items()}))

    def put_module_metrics(self, step: int, names: list[str],
                           metrics: dict[str, np.ndarray]) -> None:
        self._put(("module", step, to_json(names), {k: to_blob(v) for k, v in metrics.items()}))

    def put_event(self, event: Event) -> None:
        self._put(("event", event))

    def put_action(self, action: ActionRecord) -> None:
        self._put(("action", action.step, str(action.kind), action.message,
                   to_json(action.details)))

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until everything enqueued so far is committed."""
        if self._closed or self.failed is not None or not self._thread.is_alive():
            return
        done = threading.Event()
        self._queue.append(("flush", done))
        self._wake.set()
        done.wait(timeout)

    def close(self) -> None:
        """Commit what is queued, close the database and release the run directory."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            self._queue.append(_STOP)
            self._wake.set()
            self._thread.join(timeout=30)
        if self.failed is not None or self.dropped:
            self._note_failure(closing=True)
            self._report_loss()
        try:
            self._conn.close()
        except sqlite3.Error:
            pass
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1

    @property
    def closed(self) -> bool:
        return self._closed

    # -- writing (store thread) ---------------------------------------------------------------
    def _run(self) -> None:
        stop = False
        while not stop:
            self._wake.wait(COMMIT_INTERVAL_S)
            self._wake.clear()  # before taking records: a later wake-up is not lost
            records: list[tuple] = []
            while len(records) < 5000:
                try:
                    records.append(self._queue.popleft())
                except IndexError:
                    break
            if len(records) == 5000:
                self._wake.set()  # more wait: go on at once
            flushes = []
            batch = []
            for record in records:
                if record is _STOP:
                    stop = True
                elif record[0] == "flush":
                    flushes.append(record[1])
                else:
                    batch.append(record)
            if batch and self.failed is None:
                try:
                    self._write(batch)
                except Exception as exc:  # disk errors, and any bug: never stop training
                    self._fail(exc, batch)
            elif batch:
                self._drop(batch)
            steps = sum(1 for record in batch if record[0] == "step")
            if steps:
                with self._commit_cond:
                    self._steps_done += steps
                    self._commit_cond.notify_all()
            for done in flushes:
                done.set()

    def _fail(self, exc: BaseException, batch: list[tuple]) -> None:
        self.failed = f"{type(exc).__name__}: {exc}"
        step = next((r[1] for r in batch if r[0] in ("step", "param", "module")), None)
        self.failed_step = None if step is None else step + (self.offset or 0)
        self._drop(batch)
        log.error("trainguard: the run store at %s stopped writing (%s); training goes on "
                  "without it", self.path, self.failed)
        self._note_failure()  # best effort: a store that recovers briefly still says why

    def _note_failure(self, *, closing: bool = False) -> None:
        """Record the failure, what was dropped and (at close) the run's status in the runs row.
        A full disk may refuse that too: the note then goes into the lock file, whose first
        block is already on disk, and the reader takes it from there."""
        status, ended = self._status if closing and self._status is not None else (None, None)
        try:
            with transaction(self._conn):
                self._conn.execute(
                    "UPDATE runs SET store_failed = ?, failed_step = ?, dropped = ?, "
                    "dropped_steps = ? WHERE id = ?",
                    (self.failed, self.failed_step, self.dropped, self.dropped_steps,
                     self.run_id))
                if status is not None:
                    self._conn.execute("UPDATE runs SET status = ?, ended = ? WHERE id = ?",
                                       (status, ended, self.run_id))
                    self._conn.execute("INSERT OR REPLACE INTO meta VALUES (?, 'status', ?)",
                                       (self.run_id, to_json(status)))
            return
        except sqlite3.Error:
            pass
        note: dict[str, Any] = {
            "run_id": self.run_id, "pid": os.getpid(), "store_failed": self.failed,
            "failed_step": self.failed_step, "dropped": self.dropped,
            "dropped_steps": self.dropped_steps}
        if status is not None:
            note.update(status=status, ended=ended)
        write_note(self._lock_fd, note)

    def _report_loss(self) -> None:
        """At close, once: how much of the run the store lost (the failure itself was reported
        when it happened)."""
        where = (f"after step {self.failed_step}" if self.failed_step is not None
                 else "of this run")
        why = f" ({self.failed})" if self.failed else " (the writer fell behind)"
        log.error("trainguard: run store %s: %d steps %s were not recorded, %d records in all%s",
                  self.path, self.dropped_steps, where, self.dropped, why)

    def _stored_step(self, conn: sqlite3.Connection, step: int) -> int:
        """The step number `step` of this process is stored under (see `offset`)."""
        if self.offset is None:
            last = self._last_stored if self._last_stored is not None else -1
            self.offset = max(0, last + 1 - step)
            resumes = conn.execute("SELECT value FROM meta WHERE run_id = ? AND key = 'resumes'",
                                   (self.run_id,)).fetchone()
            try:
                listing = json.loads(resumes[0]) if resumes is not None else []
            except ValueError:
                listing = []
            listing = listing if isinstance(listing, list) else []
            listing.append({"at": step + self.offset, "counted_from": step,
                            "offset": self.offset, "pid": os.getpid(), "time": time.time(),
                            "after": self._earlier_error})
            conn.execute("INSERT OR REPLACE INTO meta VALUES (?, 'resumes', ?)",
                         (self.run_id, to_json(listing)))
        return step + self.offset

    def _write(self, batch: list[tuple]) -> None:
        conn, run = self._conn, self.run_id
        with transaction(conn):
            for record in batch:
                tag = record[0]
                if tag == "step":
                    _, step, at, scalars, blob = record
                    step = self._stored_step(conn, step)
                    conn.execute("INSERT OR REPLACE INTO steps VALUES (?, ?, ?, ?, ?)",
                                 (run, step, at, to_json(scalars), blob))
                elif tag == "param":
                    _, step, metrics = record
                    step = self._stored_step(conn, step)
                    conn.executemany("INSERT OR REPLACE INTO param_metrics VALUES (?, ?, ?, ?)",
                                     [(run, step, k, v) for k, v in metrics.items()])
                elif tag == "module":
                    _, step, names, metrics = record
                    step = self._stored_step(conn, step)
                    conn.executemany(
                        "INSERT OR REPLACE INTO module_metrics VALUES (?, ?, ?, ?, ?)",
                        [(run, step, k, names, v) for k, v in metrics.items()])
                elif tag == "event":
                    event: Event = record[1]
                    conn.execute(
                        "INSERT INTO events (run_id, step, kind, severity, param, value, message,"
                        " details) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (run, self._stored_step(conn, event.step), event.kind, event.severity,
                         event.param, to_json(event.value), event.message,
                         to_json(event.details)))
                elif tag == "action":
                    _, step, kind, message, details = record
                    step = self._stored_step(conn, step)
                    conn.execute("INSERT INTO actions (run_id, step, kind, message, details) "
                                 "VALUES (?, ?, ?, ?, ?)", (run, step, kind, message, details))
                elif tag == "meta":
                    _, key, value = record
                    conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?, ?)", (run, key, value))
                elif tag == "status":
                    _, status, ended = record
                    conn.execute("UPDATE runs SET status = ?, ended = ? WHERE id = ?",
                                 (status, ended, run))
                    conn.execute("INSERT OR REPLACE INTO meta VALUES (?, 'status', ?)",
                                 (run, to_json(status)))


@contextmanager
def transaction(conn: sqlite3.Connection, begin: str = "BEGIN") -> Iterator[None]:
    """Commit what the block wrote, or roll all of it back if the block raises."""
    conn.execute(begin)
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        raise
