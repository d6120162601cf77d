"""Score `trainguard analyze` on the hand-labelled real logs of ../shared/realdata.

    python benchmarks/realdata.py [--data DIR] [--json]

Each case folder of the evaluation set holds the original log file(s) of one run and a SOURCE.md;
`index.csv` holds the labels (README.md there explains them). Every log file of a case is
analysed (SOURCE.md aside; where the folder holds `incident_excerpt.txt`, the set's pure log of
the incident, it stands for the logbook it was cut from). A case is right when every one of its
files is. Scored per case:

    verdict   healthy / spike-recovered / diverged, against the label (`diverged`, `kind`)
    kind      nan / explosion / slow-divergence, for the diverged cases
    onset     the first logged step the analysis names, against the label's (in the log's own
              units: a step, an iteration, `epoch E, batch B`); "exact" is the same logged row,
              "one row" the row before or after it
    false alarms   healthy cases judged otherwise

Nothing here knows a case by its name: the labels come from index.csv, the files from the
folder. The data is read in place (it is not the project's to copy).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainguard.analyze.analysis import Analysis, analyze

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "realdata"
EXCERPT = "incident_excerpt.txt"


@dataclass
class Label:
    case: str
    verdict: str
    kind: str | None
    onset: str


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
            if row["diverged"].strip() == "yes":
                verdict = "diverged"
            else:
                verdict = "spike-recovered" if kind == "spike-recovered" else "healthy"
            out.append(Label(row["case"], verdict, kind if verdict == "diverged" else None,
                             row["onset"].strip()))
    return out


def log_files(folder: Path) -> list[Path]:
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name != "SOURCE.md")
    if any(p.name == EXCERPT for p in files):
        return [p for p in files if p.name == EXCERPT or p.suffix not in (".md", ".txt")]
    return files


def parse_onset(text: str) -> tuple[int | None, str | None]:
    """(step, the log's own name of the row) of a label's onset; (None, None) for none."""
    if text.lower() in ("none", ""):
        return None, None
    inner = re.search(r"\((?:step|global batch)\s+(\d+)", text)
    epoch = re.match(r"epoch\s+(\d+),\s*batch\s+(\d+)", text)
    name = f"epoch {epoch.group(1)}, batch {epoch.group(2)}" if epoch else None
    if inner:
        return int(inner.group(1)), name
    leading = re.match(r"(\d+)\b", text)
    if leading:
        return int(leading.group(1)), None
    return None, name


def score(label: Label, path: Path) -> Scored:
    start = time.perf_counter()
    result: Analysis = analyze(path)
    seconds = time.perf_counter() - start
    want_step, want_name = parse_onset(label.onset)
    if want_step is None and want_name is None:
        onset_ok = result.onset_step is None
        near = onset_ok
    else:
        onset_ok = (result.onset_step == want_step) if want_step is not None else (
            result.onset == want_name)
        near = onset_ok or _within_a_row(result, want_step, want_name)
    return Scored(file=path.name, verdict=result.verdict, kind=result.kind, onset=result.onset,
                  onset_step=result.onset_step, verdict_ok=result.verdict == label.verdict,
                  kind_ok=label.kind is None or result.kind == label.kind,
                  onset_ok=onset_ok, onset_near=near, seconds=seconds)


def _within_a_row(result: Analysis, step: int | None, name: str | None) -> bool:
    log = result.log
    if log is None or result.onset_step is None:
        return False
    rows = {s: i for i, s in enumerate(log.steps)}
    want = rows.get(step) if step is not None else next(
        (i for i in range(len(log.steps)) if log.label(i) == name), None)
    got = rows.get(result.onset_step)
    return want is not None and got is not None and abs(want - got) <= 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help=f"the evaluation set (default: {DEFAULT_DATA})")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if not (args.data / "index.csv").is_file():
        print(f"realdata: no index.csv in {args.data}", file=sys.stderr)
        return 2
    cases = []
    for label in labels(args.data):
        case = Case(label)
        for path in log_files(args.data / label.case):
            case.files.append(score(label, path))
        cases.append(case)
    totals = _totals(cases)
    if args.json:
        print(json.dumps({"cases": [{"case": c.label.case, "label": vars(c.label),
                                     "files": [vars(f) for f in c.files]} for c in cases],
                          "totals": totals}, indent=2))
    else:
        _print(cases, totals)
    return 0 if totals["all_right"] else 1


def _totals(cases: list[Case]) -> dict[str, object]:
    diverged = [c for c in cases if c.label.verdict == "diverged"]
    healthy = [c for c in cases if c.label.verdict == "healthy"]
    with_onset = [c for c in cases if parse_onset(c.label.onset) != (None, None)]
    right = [c for c in cases if c.all("verdict_ok") and c.all("kind_ok") and c.all("onset_ok")]
    return {
        "cases": len(cases),
        "files": sum(len(c.files) for c in cases),
        "verdict": sum(c.all("verdict_ok") for c in cases),
        "kind": sum(c.all("kind_ok") for c in diverged), "kind_of": len(diverged),
        "onset_exact": sum(c.all("onset_ok") for c in with_onset), "onset_of": len(with_onset),
        "onset_one_row": sum(c.all("onset_near") for c in with_onset),
        "false_alarms": sum(not c.all("verdict_ok") for c in healthy),
        "healthy": len(healthy),
        "right": len(right), "all_right": len(right) == len(cases),
        "seconds": round(sum(f.seconds for c in cases for f in c.files), 3),
    }


def _print(cases: list[Case], totals: dict[str, object]) -> None:
    rows = [("case", "file", "label", "verdict", "kind", "onset (label)", "ok")]
    for case in cases:
        label = case.label
        expected = label.verdict + (f"/{label.kind}" if label.kind else "")
        for f in case.files:
            ok = "ok" if f.verdict_ok and f.kind_ok and f.onset_ok else "WRONG"
            rows.append((label.case, f.file[:28], expected, f.verdict, f.kind or "-",
                         f"{f.onset or '-'} ({label.onset.split(' (')[0]})", ok))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    t = totals
    print()
    print(f"cases {t['cases']} ({t['files']} files), all right: {t['right']}/{t['cases']}")
    print(f"verdict accuracy     {t['verdict']}/{t['cases']}")
    print(f"kind (diverged)      {t['kind']}/{t['kind_of']}")
    print(f"onset, exact row     {t['onset_exact']}/{t['onset_of']}  "
          f"(within one row: {t['onset_one_row']}/{t['onset_of']})")
    print(f"false alarms         {t['false_alarms']}/{t['healthy']} healthy cases")
    print(f"analysis time        {t['seconds']} s in all")


if __name__ == "__main__":
    raise SystemExit(main())
