"""Runs of bad batches: consecutive inspected batches with the same finding on the same field.

One odd batch can be an outlier; the same fault batch after batch comes from the data source
itself: a bad shard (the run ends) or a pipeline that changed for good (it lasts to the last
batch inspected). The batch watcher feeds each inspected batch's findings to a `RunTracker`;
the runs reach the diagnosis as `batch_run` findings that name the steps and data ids they hold,
and the cause ranking weighs them against the learning rate.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from trainguard.finding import Finding
from trainguard.recovery.data import flatten_ids

MIN_RUN = 3
"""Consecutive batches with the same finding that make a run: one odd batch can be an outlier,
three in a row come from the data source itself (a bad shard, a changed pipeline)."""
RUN_IDS_KEPT = 50
"""Data ids a run keeps to name (the first ones)."""
RUNS_KEPT = 20
"""Runs remembered (the latest ones); shorter ones are forgotten as soon as they end."""


@dataclass(slots=True)
class BatchRun:
    """Consecutive inspected batches that had the same finding on the same field."""

    check: str
    field: str | None
    cause: str | None
    first: int
    last: int
    count: int = 0
    data_ids: list[Any] = dataclasses.field(default_factory=list)
    ids_cut: bool = False
    """More data ids than RUN_IDS_KEPT: only the first are kept."""
    ongoing: bool = True
    """The last batch inspected still had it."""

    def finding(self) -> Finding:
        ids = (f", data ids {compact_ids(self.data_ids)}" + (" and more" if self.ids_cut else "")
               if self.data_ids else "")
        where = f" on '{self.field}'" if self.field else ""
        until = ", and still in the last batch inspected" if self.ongoing else ""
        return Finding(
            "batch_run", "warning",
            f"{self.count} consecutive batches (steps {self.first}-{self.last}{ids}) had "
            f"{self.check}{where}{until}",
            "find the shard or the source these batches come from; clean, drop or re-normalise "
            "it.", cause=self.cause,
            evidence={"finding": self.check, "field": self.field, "first_step": self.first,
                      "last_step": self.last, "batches": self.count,
                      "data_ids": list(self.data_ids), "ongoing": self.ongoing})


class RunTracker:
    def __init__(self) -> None:
        self._runs: list[BatchRun] = []
        self._last_inspected: int | None = None

    def observe(self, findings: list[Finding], step: int, data_ids: Any) -> None:
        """One inspected batch's findings: extend the runs it has again, end the others (a
        batch not inspected in between ends them too: the run is of consecutive batches)."""
        found = {(f.check, f.evidence.get("field")): f for f in findings if f.cause}
        follows = self._last_inspected is not None and step == self._last_inspected + 1
        self._last_inspected = step
        for run in self._runs:
            if run.ongoing and (not follows or (run.check, run.field) not in found):
                run.ongoing = False
        for key, finding in found.items():
            current = self._ongoing(key)
            if current is None:
                current = BatchRun(check=key[0], field=key[1], cause=finding.cause, first=step,
                                   last=step)
                self._runs.append(current)
            current.last, current.count = step, current.count + 1
            ids = flatten_ids(data_ids)
            room = RUN_IDS_KEPT - len(current.data_ids)
            current.data_ids.extend(ids[:max(room, 0)])
            current.ids_cut = current.ids_cut or len(ids) > room
        self._runs = [r for r in self._runs if r.ongoing or r.count >= MIN_RUN][-RUNS_KEPT:]

    def _ongoing(self, key: tuple[str, str | None]) -> BatchRun | None:
        return next((r for r in self._runs if r.ongoing and (r.check, r.field) == key), None)

    def findings(self) -> list[Finding]:
        """The runs of at least MIN_RUN batches, as `batch_run` findings."""
        return [r.finding() for r in self._runs if r.count >= MIN_RUN]

    def state_dict(self) -> dict[str, Any]:
        return {"runs": [dataclasses.asdict(r) for r in self._runs],
                "last_inspected": self._last_inspected}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fields = {f.name for f in dataclasses.fields(BatchRun)}
        self._runs = [BatchRun(**{k: v for k, v in dict(r).items() if k in fields})
                      for r in state.get("runs", [])]
        last = state.get("last_inspected")
        self._last_inspected = None if last is None else int(last)


def compact_ids(ids: list[Any], shown: int = 12) -> str:
    """"100-109" for consecutive integers, else the first `shown` ids and a count."""
    if all(isinstance(i, int) and not isinstance(i, bool) for i in ids) and len(ids) > 1 \
            and ids == list(range(ids[0], ids[0] + len(ids))):
        return f"{ids[0]}-{ids[-1]}"
    head = ", ".join(map(str, ids[:shown]))
    return head + (f" and {len(ids) - shown} more" if len(ids) > shown else "")
