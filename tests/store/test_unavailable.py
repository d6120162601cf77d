"""A run directory that cannot hold a store is refused at start with one StoreUnavailable
naming the path and the reason; nothing is created and an existing file is left untouched."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from trainguard.errors import StoreError, StoreUnavailable
from trainguard.store import DB_NAME, RunStore, schema

from .helpers import (
    listing,
    make_read_only,
    make_writable,
    python,
    readonly_python,
    world_readable_dir,
)


def test_a_file_where_the_run_directory_should_be(tmp_path: Path) -> None:
    path = tmp_path / "run"
    path.write_text("not a directory")
    with pytest.raises(StoreUnavailable, match="not a directory") as info:
        RunStore(path)
    assert str(path) in str(info.value) and isinstance(info.value, StoreError)
    assert path.read_text() == "not a directory"
    with pytest.raises(StoreUnavailable, match="cannot be created") as info:
        RunStore(path / "below")
    assert str(path / "below") in str(info.value)
    assert listing(tmp_path) == {"run"}


@pytest.mark.parametrize("content", [b"garbage " * 300, b"x", b"PK\x03\x04 a zip, perhaps"])
def test_a_garbage_store_file_is_left_untouched(tmp_path: Path, content: bytes) -> None:
    (tmp_path / DB_NAME).write_bytes(content)
    with pytest.raises(StoreUnavailable, match="not a trainguard store") as info:
        RunStore(tmp_path)
    assert str(tmp_path) in str(info.value) and "left untouched" in str(info.value)
    assert (tmp_path / DB_NAME).read_bytes() == content
    assert listing(tmp_path) == {DB_NAME}


def test_another_sqlite_database_is_left_untouched(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / DB_NAME)
    conn.execute("CREATE TABLE invoices (id INTEGER)")
    conn.commit()
    conn.close()
    before = (tmp_path / DB_NAME).read_bytes()
    with pytest.raises(StoreUnavailable, match="holds other tables"):
        RunStore(tmp_path)
    assert (tmp_path / DB_NAME).read_bytes() == before


def test_a_store_from_a_newer_trainguard_is_refused(tmp_path: Path) -> None:
    RunStore(tmp_path).close()
    conn = sqlite3.connect(tmp_path / DB_NAME)
    conn.execute(f"PRAGMA user_version = {schema.SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    with pytest.raises(StoreUnavailable, match="newer trainguard"):
        RunStore(tmp_path)


def test_a_failure_while_creating_the_store_removes_what_it_created(tmp_path: Path,
                                                                      monkeypatch) -> None:
    def broken(conn: sqlite3.Connection) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(schema, "create", broken)
    with pytest.raises(StoreUnavailable, match="disk is full") as info:
        RunStore(tmp_path / "new" / "run")
    assert str(tmp_path / "new" / "run") in str(info.value)
    assert listing(tmp_path) == set(), "no directory, lock or database left behind"


def test_a_read_only_directory(tmp_path: Path) -> None:
    root = world_readable_dir("tg-ro-start-")
    try:
        (root / "run").mkdir()
        make_read_only(root)
        result = readonly_python("""
            import sys
            from trainguard.errors import StoreUnavailable
            from trainguard.store import RunStore
            for path in (sys.argv[1] + "/run", sys.argv[1] + "/new/run"):
                try:
                    RunStore(path)
                except StoreUnavailable as exc:
                    print("refused:", exc)
        """, str(root))
        assert result.returncode == 0, result.stderr
        refusals = result.stdout.splitlines()
        assert len(refusals) == 2, result.stdout
        assert f"{root}/run" in refusals[0] and "not writable" in refusals[0]
        assert f"{root}/new/run" in refusals[1] and "cannot be created" in refusals[1]
        assert listing(root) == {"run"}
    finally:
        make_writable(root)
        shutil.rmtree(root, ignore_errors=True)


def test_a_full_disk(tmp_path: Path) -> None:
    # A file size limit makes every write beyond it fail with EFBIG, as a full disk would.
    result = python("""
        import resource, signal, sys
        from trainguard.errors import StoreUnavailable
        from trainguard.store import RunStore
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))
        try:
            RunStore(sys.argv[1])
        except StoreUnavailable as exc:
            print("refused:", exc)
    """, str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("refused:") and str(tmp_path / "run") in result.stdout
    assert listing(tmp_path) == set(), "nothing created half-way"
