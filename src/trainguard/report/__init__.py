"""`trainguard report`: one self-contained HTML file that shows a recorded run.

    from trainguard.report import write_report
    write_report("runs/exp1", "exp1.html")            # the latest run of the directory
    write_report("runs/exp1", "exp1-run2.html", run=2)

The page opens offline (plotly.js is inline; it fetches nothing) and stays a few MB for a
100k-step run with 500 parameters: long series are downsampled to the min and max of each
bucket, so every spike and every non-finite value stays visible, and events are never dropped.
It needs the `plotly` package (`pip install 'trainguard[report]'`).

    data.py        the run read into arrays and records (RunReader)
    downsample.py  min/max buckets for lines, max per cell for heat maps, non-finite marks
    encode.py      compact base64 arrays for the page
    figures.py     the plots as plotly figure specs
    tables.py      verdict, diagnosis, preflight, actions and events as HTML tables
    escape.py      HTML escaping and script-safe JSON for every string from the run
    page.py        the page: CSS, the content policy, the script that draws the plots
    output.py      building the page and writing it in one piece (temp file and rename)
"""

from trainguard.report.output import Written, build_report, write_report

__all__ = ["Written", "build_report", "write_report"]
