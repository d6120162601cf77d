"""`trainguard show` on a terminal: the same summary as the plain lines, its lists as `rich`
tables (events, likely causes, preflight findings, worst parameters).

Every string from the run goes in as a `Text` with control characters escaped, never as markup,
so a module named `[bold red]x` prints as written. Pipes and files get the plain lines
(`trainguard show ... | grep`), as does `--plain`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import IO, Any


def render(head: list[str], summary: dict[str, Any], events: int, visible: Callable[[str], str],
           fmt: Callable[[Any], str], file: IO[str] | None = None, width: int | None = None,
           force_terminal: bool | None = None) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(file=file, width=width, force_terminal=force_terminal, highlight=False,
                      soft_wrap=False)

    def text(value: Any, style: str = "") -> Text:
        return Text(visible(str(value)), style=style)

    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold")
    grid.add_column()
    for line in head:  # "label      value": the label is padded to 10 characters
        grid.add_row(text(line[:10].rstrip()), text(line[11:]))
    console.print(grid)
    severity_style = {"critical": "bold red", "error": "red", "warning": "yellow",
                      "info": "dim"}
    shown = summary["events"][:events]
    if shown:
        table = Table(title=f"events ({len(summary['events'])})", box=box.SIMPLE_HEAD,
                      title_justify="left")
        for column in ("step", "severity", "kind", "message"):
            table.add_column(column, justify="right" if column == "step" else "left",
                             overflow="fold")
        for event in shown:
            table.add_row(text(event["step"]),
                          text(event["severity"], severity_style.get(event["severity"], "")),
                          text(event["kind"]), text(event["message"]))
        console.print(table)
        if len(summary["events"]) > events:
            console.print(text(f"... {len(summary['events']) - events} more (use --events N)",
                               "dim"))
    if summary.get("diagnosis"):
        table = Table(title="likely causes", box=box.SIMPLE_HEAD, title_justify="left")
        for column in ("cause", "confidence", "evidence", "fix"):
            table.add_column(column, overflow="fold")
        for cause in summary["diagnosis"][:3]:
            table.add_row(text(cause["code"], "bold"),
                          text(f"{float(cause.get('confidence', 0)):.0%}"),
                          text("; ".join(cause.get("evidence", [])[:2])), text(cause["fix"]))
        console.print(table)
    serious = [f for f in summary.get("preflight", []) if f["severity"] != "info"]
    if serious:
        table = Table(title="preflight", box=box.SIMPLE_HEAD, title_justify="left")
        for column in ("severity", "check", "finding"):
            table.add_column(column, overflow="fold")
        for finding in serious:
            table.add_row(text(finding["severity"],
                               severity_style.get(finding["severity"], "")),
                          text(finding["check"]), text(finding["message"]))
        console.print(table)
    if summary["worst_params"]:
        table = Table(title="worst parameters", box=box.SIMPLE_HEAD, title_justify="left")
        table.add_column("parameter", overflow="fold")
        table.add_column("non-finite steps", justify="right")
        table.add_column("max gradient norm", justify="right")
        for worst in summary["worst_params"]:
            table.add_row(text(worst["param"]), text(worst["nonfinite_steps"]),
                          text(fmt(worst["max_grad_norm"])))
        console.print(table)
