"""How a run ended: the status a close gives it, from the exception that ended it, if any.

A run closed while an exception is under way did not finish: Ctrl-C (`KeyboardInterrupt`) or
the `SystemExit` trainguard's signal handler raises interrupted it, `TrainingDiverged` halted it,
a lost peer (`PeerLost`) failed it, and any other exception crashed it. A `with` block's exit and
a trainer's exception hook are handed the exception; a plain `close()` in a `finally:` clause is
not, and reads it from `sys.exc_info()`, which holds the exception a `finally:` clause is
propagating or an `except:` clause is handling, and nothing once the clause is over: a close
after an exception the loop caught and handled is `finished`. So is a clean `sys.exit()` (code 0
or None), which is no interruption.

Only the standard library, the errors, the events and the vocabulary here: the pipeline and the
integrations import it.
"""

from __future__ import annotations

import sys

from trainguard.errors import PeerLost, TrainingDiverged
from trainguard.events import RunError
from trainguard.vocabulary import Status

MAX_MESSAGE = 200
"""Characters of the exception's message that are kept (its first line)."""


def exit_status(exc: BaseException | None) -> Status:
    """The status a run ends with when `exc` (None: no exception) ends it."""
    if exc is None or (isinstance(exc, SystemExit) and exc.code in (None, 0)):
        return "finished"
    if isinstance(exc, TrainingDiverged):
        return "halted"
    if isinstance(exc, PeerLost):
        return "failed"
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return "interrupted"
    return "crashed"


def under_way() -> BaseException | None:
    """The exception a `finally:` clause is propagating (or an `except:` clause handling) where
    this is called; None outside them."""
    return sys.exc_info()[1]


def run_error(exc: BaseException | None) -> RunError | None:
    """What is kept of the exception that ended a run: its type and its message's first line
    (None when it ended none: no exception, or a clean exit)."""
    if exit_status(exc) == "finished" or exc is None:
        return None
    lines = str(exc).strip().splitlines()
    message = lines[0] if lines else ""
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    return RunError(type=type(exc).__name__, message=message)
