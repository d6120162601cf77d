"""A healthy store on read-only media is readable (and `show` works there)."""

from __future__ import annotations

import json
import shutil

from .helpers import listing, make_read_only, make_writable, readonly_python, world_readable_dir
from .test_runs import record


def test_a_store_on_read_only_media_is_readable() -> None:
    root = world_readable_dir("tg-ro-read-")
    run_dir = root / "run #1"
    try:
        record(run_dir, 4, loss=1.5, events=1)
        record(run_dir, 2, loss=0.5)
        make_read_only(root)
        before = listing(root)
        result = readonly_python("""
            import json, sys
            from trainguard.cli import main
            from trainguard.store import RunReader
            with RunReader(sys.argv[1]) as reader:
                print(json.dumps({"immutable": reader.immutable, "runs": reader.run_ids,
                                  "steps": len(reader.steps())}))
            with RunReader(sys.argv[1], run=1) as reader:
                print(json.dumps({"events": len(reader.events())}))
            sys.exit(main(["show", sys.argv[1]]))
        """, str(run_dir))
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert json.loads(lines[0]) == {"immutable": True, "runs": [1, 2], "steps": 2}
        assert json.loads(lines[1]) == {"events": 1}
        assert "steps      2 recorded" in result.stdout and "run 2 of 2" in result.stdout
        assert listing(root) == before
    finally:
        make_writable(root)
        shutil.rmtree(root, ignore_errors=True)
