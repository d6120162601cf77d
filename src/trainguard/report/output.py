"""Building the report of one run and writing it in one piece.

The page is built whole in memory first, so a store that cannot be read writes nothing. It is
then written to a hidden temporary file beside `out` and renamed over it: a reader of `out`
sees the old report or the new one, never half of one, and a failure leaves no temporary file
behind. A path that is one of the run store's own files is refused.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trainguard.errors import UsageError
from trainguard.report import page, tables
from trainguard.report.data import RunData, read_run
from trainguard.report.escape import text
from trainguard.report.figures import Figures, build_figures
from trainguard.report.sample_grid import samples_html
from trainguard.store.files import DB_NAME, LOCK_NAME

INSTALL_HINT = "pip install 'trainguard[report]'"


@dataclass(frozen=True, slots=True)
class Written:
    path: Path
    bytes: int
    plots: int
    """Plots in the page."""
    absent: list[str]
    """Panels left out because the run recorded nothing for them."""


def plotly_js() -> str:
    """plotly.js from the `plotly` package (the `report` extra), for inlining."""
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise UsageError(f"the HTML report needs the plotly package ({INSTALL_HINT})") from None
    source = get_plotlyjs()
    # never the case in plotly's bundles, but an inline script must not contain its end tag
    return source.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")


def render(data: RunData, figures: Figures, script: str) -> str:
    header = (f"<header><h1>trainguard report</h1>{tables.summary_html(data)}</header>")
    plots = "".join(f'<div class="plot" id="plot-{text(f["id"])}"></div>'
                    for f in figures.figures)
    absent = ""
    if figures.absent:
        items = "".join(f"<li>{text(title)}: {text(why)}</li>" for title, why in figures.absent)
        absent = f'<p class="note">not drawn:</p><ul class="note">{items}</ul>'
    sections = [tables.verdict_html(data), tables.diagnosis_html(data),
                f'<section id="plots"><h2>Plots</h2>{plots}{absent}</section>',
                tables.preflight_html(data), tables.actions_html(data),
                tables.events_html(data)]
    nav = [("verdict", "verdict"), ("diagnosis", "likely causes"), ("plots", "plots"),
           ("preflight", "preflight"), ("actions", "actions"), ("events", "events")]
    samples = samples_html(data)
    if samples is not None:  # a generative model's samples over steps, after the plots
        sections.insert(3, samples)
        nav.insert(3, ("samples", "samples"))
    return page.page(title=f"trainguard report: {data.run_dir} (run {data.run_id})",
                     header=header, nav=nav, sections=sections, figures=figures.figures,
                     arrays=figures.arrays, plotly_js=script)


def build_report(run_dir: str | Path, run: int | None = None) -> tuple[str, Figures]:
    """The report page of a run (the latest unless `run` names another) and its figures.
    Raises `StoreError` for a missing or damaged store, `UsageError` without plotly."""
    script = plotly_js()
    data = read_run(run_dir, run)
    figures = build_figures(data)
    return render(data, figures, script), figures


def _check_out(out: Path, run_dir: Path) -> None:
    if out.is_dir():
        raise UsageError(f"--out {out} is a directory; name the HTML file to write")
    parent = out.parent
    if not parent.exists():
        raise UsageError(f"cannot write {out}: the directory {parent} does not exist")
    if not parent.is_dir():
        raise UsageError(f"cannot write {out}: {parent} is not a directory")
    store_files = {run_dir / name for name in (DB_NAME, f"{DB_NAME}-wal", f"{DB_NAME}-shm",
                                               LOCK_NAME)}
    try:
        resolved = out.resolve()
        if any(resolved == path.resolve() for path in store_files):
            raise UsageError(f"--out {out} is one of the run store's own files; write the "
                             f"report elsewhere")
    except OSError:
        pass


def _mode(out: Path) -> int:
    try:
        return out.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_atomically(out: Path, content: bytes) -> None:
    """Write `content` to `out` through a temporary file in its directory and a rename."""
    try:
        handle, temp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    except OSError as exc:
        raise UsageError(f"cannot write {out} ({exc.strerror or exc})") from None
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(content)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temp, _mode(out))
        os.replace(temp, out)
    except OSError as exc:
        Path(temp).unlink(missing_ok=True)
        raise UsageError(f"cannot write {out} ({exc.strerror or exc})") from None
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def write_report(run_dir: str | Path, out: str | Path, run: int | None = None) -> Written:
    """Write the report of a run to `out` (an HTML file). Raises `StoreError` for a missing or
    damaged store and `UsageError` for a path that cannot be written; nothing is written then."""
    out = Path(out)
    _check_out(out, Path(run_dir))
    html, figures = build_report(run_dir, run)
    return _write(out, html, figures)


def write_data_report(data: RunData, out: str | Path) -> Written:
    """Write the report of run data made elsewhere (an analysed log) to `out`."""
    out = Path(out)
    _check_out(out, Path(data.run_dir).parent)
    script = plotly_js()
    figures = build_figures(data)
    return _write(out, render(data, figures, script), figures)


def _write(out: Path, html: str, figures: Figures) -> Written:
    content = html.encode("utf-8")
    write_atomically(out, content)
    return Written(out, len(content), len(figures.figures), [t for t, _ in figures.absent])
