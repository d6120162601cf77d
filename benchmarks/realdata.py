"""Score `trainguard analyze` on hand-labelled real logs: the shared evaluation set and this
repository's own corpus (benchmarks/realdata).

    python benchmarks/realdata.py [--data DIR ...] [--half tune|held-out] [--cases] [--json]

Each case folder of the evaluation set holds the original log file(s) of one run and a SOURCE.md;
`index.csv` holds the labels (README.md there explains them). Every log file of a case is
analysed (SOURCE.md aside; where the folder holds `incident_excerpt.txt`, the set's pure log of
the incident, it stands for the logbook it was cut from). A case is right when every one of its
files is; a file the analysis cannot read (`unreadable`) or fails on (`crashed`, with the
exception) is wrong. Scored per case:

    verdict   healthy / recovered / degraded / stalled, against the label (`diverged` yes:
              degraded; kind `spike-recovered`: recovered; a `collapse` label, a run that learns
              nothing, is `stalled`; the labels keep the words they were written in)
    kind      nan / explosion / slow-divergence, for the degraded cases
    onset     the first logged step the analysis names, against the label's (in the log's own
              units: a step, an iteration, `epoch E, batch B`); "exact" is the same logged row,
              "one row" the row before or after it
    false alarms   healthy cases judged otherwise

Each corpus is split in two halves by a hash of the case name (`half()`): thresholds are chosen
on the `tune` half and the `held-out` half is what the figures are reported on. Tables per half,
per format (the folder's prefix) and per label; the false-alarm rate on healthy runs apart.
Cases whose log is not kept (`kept` = no in index.csv: a licence that does not allow copying)
are counted, not scored. Where index.csv has a `batch` column, the cases of each later batch (2
to 8: collected and labelled after the thresholds were chosen, each labelled before trainguard
read it) get the summary rows once more on their own, by half, and all of them together
("batches 2+3+4+5+6+7+8"): the figure on never-seen logs.

Nothing here knows a case by its name: the labels come from index.csv, the files from the
folder. The shared set is read in place (it is not the project's to copy).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainguard.analyze.analysis import Analysis, analyze
from trainguard.analyze.log import Log, LogError
from trainguard.vocabulary import DEGRADED, HEALTHY, RECOVERED, STALLED, verdict_named

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "realdata"
OWN_DATA = Path(__file__).resolve().parent / "realdata"
EXCERPT = "incident_excerpt.txt"
# index.csv `batch`: the batches collected after the tuning, never looked at while tuning
NEW_BATCHES = ("2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
               "17", "18", "19", "20", "21", "22", "23", "24", "25", "26", "27", "28",
               "29", "30", "31", "32", "33", "34", "35", "36", "37", "38", "39", "40", "41")
HALVES = ("tune", "held-out")


def half(case: str) -> str:
    """`tune` or `held-out`, fixed by the case's name (the first byte of its SHA-256, even or
    odd): a case never moves between halves, and no one chooses where it lands."""
    return HALVES[hashlib.sha256(case.encode()).digest()[0] % 2]


@dataclass
class Label:
    case: str
    verdict: str
    kind: str | None
    onset: str
    kept: bool = True
    corpus: str = ""
    batch: str = "1"

    @property
    def half(self) -> str:
        return half(self.case)

    @property
    def fmt(self) -> str:
        return self.case.split("_", 1)[0]

    @property
    def expected(self) -> str:
        return self.kind if self.verdict == DEGRADED and self.kind else self.verdict


@dataclass
class Scored:
    file: str
    verdict: str
    kind: str | None
    onset: str | None
    onset_step: int | None
    verdict_ok: bool
    kind_ok: bool
    onset_ok: bool
    onset_near: bool
    seconds: float


@dataclass
class Case:
    label: Label
    files: list[Scored] = field(default_factory=list)

    def all(self, name: str) -> bool:
        return bool(self.files) and all(getattr(f, name) for f in self.files)


def labels(data: Path) -> list[Label]:
    out = []
    with (data / "index.csv").open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            kind = row["kind"].strip()
            if kind == "collapse" and row["diverged"].strip() == "yes":
                verdict = STALLED  # trains on, learns nothing: the live verdict's word
            elif row["diverged"].strip() == "yes":
                verdict = DEGRADED
            else:  # the label's kind says a spike the run recovered from
                verdict = RECOVERED if verdict_named(kind) == RECOVERED else HEALTHY
            kept = row.get("kept", "yes").strip() != "no"
            out.append(Label(row["case"], verdict, kind if verdict == DEGRADED else None,
                             row["onset"].strip(), kept, data.name if data != OWN_DATA
                             else "own", (row.get("batch") or "1").strip()))
    return out


def log_files(folder: Path) -> list[Path]:
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name != "SOURCE.md")
    if any(p.name == EXCERPT for p in files):
        return [p for p in files if p.name == EXCERPT or p.suffix not in (".md", ".txt")]
    return files


def names_no_onset(text: str) -> bool:
    """A label's onset that names no row: `none`, or `none (a note on why)`."""
    return re.fullmatch(r"(none\b.*)?", text.strip(), re.IGNORECASE | re.DOTALL) is not None


def onset_row(log: Log, text: str) -> int | None:
    """The row of `log` a label's onset names (None for "none", or a row the log lacks).

    Labels name a row in the log's own terms: a step (`3010`, `step 41`, `iter 1152`, a boosting
    `round 180`, `epoch 0 (step 198, ...)`), `epoch E, batch B`, `epoch 3451` (a log counted in
    epochs, MLPerf's `epoch_num` too), the log's own counter by its name (`samples_count
    1022976`), or for lines without a step counter the n-th logged value (`row 1`, `2nd printed
    value`, `line 6`) or the first row at an epoch (`epoch 0.01`)."""
    text = text.strip()
    if names_no_onset(text):
        return None
    nth = re.search(r"\brow\s+(\d+)|(\d+)(?:st|nd|rd|th) printed value|^line\s+(\d+)", text)
    if nth:
        return int(next(g for g in nth.groups() if g)) - 1
    main = text.split(" (")[0].strip()
    named = re.fullmatch(r"epoch\s+(\d+),\s*(?:batch|iteration|iter|step|it)\s+(\d+)",
                         main)
    if named:
        want = f"epoch {named.group(1)}, batch {named.group(2)}"
        found = next((i for i in range(len(log)) if log.label(i) == want), None)
        if found is None:  # a log that counts its rows across epochs names the step alone
            found = next((i for i, s in enumerate(log.steps) if s == int(named.group(2))), None)
        return found
    inner = re.search(r"\((?:step|global batch)\s+(\d+)", text)
    own = re.search(rf"\b{re.escape(log.step_unit)}\s+(\d+)", main)
    if own and not inner and log.step_unit not in ("step", "epoch"):  # the log's own counter
        return next((i for i, s in enumerate(log.steps) if s == int(own.group(1))), None)
    step = re.fullmatch(
        r"(?:(?:global[\s_]+)?steps?|iter|iteration|num_updates|update|round)?\s*(\d+)", main,
        re.IGNORECASE)
    epoch = re.fullmatch(r"epoch\s+([\d.]+)", main)
    if inner or step:
        wanted = int((inner or step).group(1))  # type: ignore[union-attr]
        return next((i for i, s in enumerate(log.steps) if s == wanted), None)
    if epoch:
        value = float(epoch.group(1))
        if log.step_unit in ("epoch", "epoch_num"):
            return next((i for i, s in enumerate(log.steps) if s == value), None)
        pattern = re.compile(r"\bepoch\s+([\d.]+)")
        for i in range(len(log)):
            found = pattern.search(log.label(i))
            if found and float(found.group(1)) == value:
                return i
    return None


def score(label: Label, path: Path) -> Scored:
    start = time.perf_counter()
    try:
        result: Analysis = analyze(path)
    except Exception as exc:  # a file the analysis fails on is a wrong case, not the end of the run
        verdict = "unreadable" if isinstance(exc, LogError) else "crashed"
        what = str(exc) if isinstance(exc, LogError) else f"{type(exc).__name__}: {exc}"
        return Scored(file=path.name, verdict=verdict, kind=None, onset=what[:60],
                      onset_step=None, verdict_ok=False, kind_ok=False, onset_ok=False,
                      onset_near=False, seconds=time.perf_counter() - start)
    seconds = time.perf_counter() - start
    assert result.log is not None
    got = result.judgement.onset_row if result.judgement is not None else None
    if names_no_onset(label.onset):
        onset_ok = near = got is None
    else:
        want = onset_row(result.log, label.onset)
        onset_ok = want is not None and got == want
        near = want is not None and got is not None and abs(got - want) <= 1
    return Scored(file=path.name, verdict=result.verdict, kind=result.kind, onset=result.onset,
                  onset_step=result.onset_step, verdict_ok=result.verdict == label.verdict,
                  kind_ok=label.kind is None or result.kind == label.kind,
                  onset_ok=onset_ok, onset_near=near, seconds=seconds)


def score_corpus(folder: Path, which: str | None = None) -> tuple[list[Case], list[Label]]:
    """Every kept case of the corpus in `folder` (of one half, when `which` names it) analysed
    and scored, and the labels of the cases whose log is not kept (counted, not scored)."""
    cases, not_kept = [], []
    for label in labels(folder):
        if which and label.half != which:
            continue
        if not label.kept:
            not_kept.append(label)
            continue
        case = Case(label)
        for path in log_files(folder / label.case):
            case.files.append(score(label, path))
        cases.append(case)
    return cases, not_kept


def main(argv: list[str] | None = None) -> int:
    # the docstring's first paragraph, whole: its first line stops mid-sentence
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--data", type=Path, action="append",
                        help=f"a corpus folder with index.csv (default: {SHARED_DATA.name} "
                             f"beside the repository, and {OWN_DATA.name} here)")
    parser.add_argument("--half", choices=HALVES, help="score one half only")
    parser.add_argument("--cases", action="store_true", help="print every case's line")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    folders = args.data or [d for d in (SHARED_DATA, OWN_DATA) if (d / "index.csv").is_file()]
    for folder in folders:
        if not (folder / "index.csv").is_file():
            print(f"realdata: no index.csv in {folder}", file=sys.stderr)
            return 2
    corpora: dict[str, list[Case]] = {}
    skipped: dict[str, int] = {}
    skipped_new: dict[str, dict[str, int]] = {}
    for folder in folders:
        name = "own" if folder.resolve() == OWN_DATA.resolve() else folder.name
        corpora[name], not_kept = score_corpus(folder, args.half)
        if not_kept:
            skipped[name] = len(not_kept)
        for label in not_kept:
            if label.batch in NEW_BATCHES:
                counts = skipped_new.setdefault(name, {})
                counts[label.batch] = counts.get(label.batch, 0) + 1
    if args.json:
        print(json.dumps({name: {"cases": [{"case": c.label.case, "half": c.label.half,
                                            "label": vars(c.label),
                                            "files": [vars(f) for f in c.files]}
                                           for c in cases],
                                 "totals": totals(cases),
                                 "halves": {h: totals([c for c in cases if c.label.half == h])
                                            for h in HALVES},
                                 "not_kept": skipped.get(name, 0),
                                 "new_batches": {
                                     "+".join(batches): {
                                         h: totals([c for c in cases
                                                     if c.label.batch in batches
                                                     and (h == "all" or c.label.half == h)])
                                         for h in ("all", *HALVES)}
                                     for batches in _new_groups()}}
                          for name, cases in corpora.items()}, indent=2))
        return 0
    for name, cases in corpora.items():
        _print(name, cases, skipped.get(name, 0), every=args.cases)
        _print_new_batches(cases, skipped_new.get(name, {}))
    return 0


def right(case: Case) -> bool:
    return case.all("verdict_ok") and case.all("kind_ok") and case.all("onset_ok")


def totals(cases: list[Case]) -> dict[str, object]:
    diverged = [c for c in cases if c.label.verdict == DEGRADED]
    healthy = [c for c in cases if c.label.verdict == "healthy"]
    with_onset = [c for c in cases if c.label.onset.lower() not in ("none", "")]
    return {
        "cases": len(cases),
        "files": sum(len(c.files) for c in cases),
        "read": sum(all(f.verdict not in ("unreadable", "crashed") for f in c.files)
                    for c in cases),
        "crashed": sum(any(f.verdict == "crashed" for f in c.files) for c in cases),
        "verdict": sum(c.all("verdict_ok") for c in cases),
        "kind": sum(c.all("kind_ok") for c in diverged), "kind_of": len(diverged),
        "onset_exact": sum(c.all("onset_ok") for c in with_onset), "onset_of": len(with_onset),
        "onset_one_row": sum(c.all("onset_near") for c in with_onset),
        "false_alarms": sum(not c.all("verdict_ok") for c in healthy),
        "healthy": len(healthy),
        "right": sum(right(c) for c in cases),
        "seconds": round(sum(f.seconds for c in cases for f in c.files), 3),
    }


def _row(title: str, group: list[Case]) -> tuple[str, ...]:
    t = totals(group)
    return (title, str(t["cases"]), _pct(t["read"], t["cases"]), _pct(t["verdict"], t["cases"]),
            _pct(t["kind"], t["kind_of"]), _pct(t["onset_exact"], t["onset_of"]),
            _pct(t["false_alarms"], t["healthy"]), _pct(t["right"], t["cases"]))


def _table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())


HEADER = ("", "cases", "read", "verdict", "kind (degraded)", "onset exact", "false alarms",
          "all right")


def _new_groups() -> list[tuple[str, ...]]:
    """Each later batch on its own, then all of them together."""
    groups = [(b,) for b in NEW_BATCHES]
    return [*groups, NEW_BATCHES] if len(NEW_BATCHES) > 1 else groups


def _print_new_batches(cases: list[Case], not_kept: dict[str, int]) -> None:
    """The summary rows again, for the cases of each batch collected after the tuning, then for
    all of them together: the figure on logs no threshold was ever chosen on (their misses are
    among the lines above)."""
    for batches in _new_groups():
        new = [c for c in cases if c.label.batch in batches]
        skipped = sum(not_kept.get(b, 0) for b in batches)
        if not new and not skipped:
            continue
        title = ("batch " if len(batches) == 1 else "batches ") + "+".join(batches)
        print(f"-- {title}, never seen while tuning ({len(new)} cases scored"
              + (f", {skipped} not kept, not scored" if skipped else "") + ")")
        rows = [HEADER, _row(f"{title} all", new)]
        rows += [_row(f"{title} {h}", [c for c in new if c.label.half == h]) for h in HALVES]
        _table(rows)
        print()


def _pct(a: object, b: object) -> str:
    return f"{a}/{b}" + (f" ({100 * int(a) / int(b):.0f}%)" if int(b) else "")  # type: ignore[call-overload]


def _print(name: str, cases: list[Case], not_kept: int, *, every: bool) -> None:
    print(f"== corpus: {name} ({len(cases)} cases scored"
          + (f", {not_kept} not kept, not scored" if not_kept else "") + ")")
    rows = [("case", "half", "file", "label", "verdict", "kind", "onset (label)", "ok")]
    for case in cases:
        label = case.label
        expected = label.verdict + (f"/{label.kind}" if label.kind else "")
        for f in case.files:
            ok = "ok" if f.verdict_ok and f.kind_ok and f.onset_ok else "WRONG"
            if every or ok != "ok":
                rows.append((label.case, label.half, f.file[:28], expected, f.verdict,
                             f.kind or "-", f"{f.onset or '-'} ({label.onset.split(' (')[0]})",
                             ok))
    if len(rows) > 1:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        print()
    table = [("", "cases", "read", "verdict", "kind (degraded)", "onset exact", "false alarms",
              "all right")]
    groups = [("all", cases)] + [(h, [c for c in cases if c.label.half == h]) for h in HALVES]
    groups += [(f"format {p}", [c for c in cases if c.label.fmt == p])
               for p in sorted({c.label.fmt for c in cases})]
    groups += [(f"label {k}", [c for c in cases if c.label.expected == k])
               for k in sorted({c.label.expected for c in cases})]
    for title, group in groups:
        t = totals(group)
        table.append((title, str(t["cases"]), _pct(t["read"], t["cases"]),
                      _pct(t["verdict"], t["cases"]), _pct(t["kind"], t["kind_of"]),
                      _pct(t["onset_exact"], t["onset_of"]),
                      _pct(t["false_alarms"], t["healthy"]), _pct(t["right"], t["cases"])))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    t = totals(cases)
    print(f"analysis time {t['seconds']} s in all ({t['files']} files)")
    print()


if __name__ == "__main__":
    raise SystemExit(main())
