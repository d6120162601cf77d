"""The report page: one HTML file with plotly.js, the data and the tables inline.

It fetches nothing: a Content-Security-Policy of `default-src 'none'` (inline scripts and styles
only, images from data: and blob: URLs for plotly's PNG export) turns any attempt into a
violation, which the page counts as an error.

The page reports on itself for tests and scripts: when every plot is drawn, `#tg-status` gets
`data-state="done"`, `data-plots` (plots drawn), `data-expected`, `data-traces` and
`data-errors` (uncaught errors, rejected promises, policy violations, failed plots; their
messages are in the element's text) and `data-ms` (how long drawing took), and the document
title ends with "N/M plots". Until then `data-state` is "pending"; it is "failed" when plotly.js
could not run.
"""

from __future__ import annotations

from typing import Any

from trainguard.report.escape import script_json, text

CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
       "img-src data: blob:; font-src data:; base-uri 'none'; form-action 'none'")

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0;
       color: #222; background: #f4f5f7; }
header { background: #1f2933; color: #fff; padding: 14px 24px; }
header h1 { margin: 0 0 8px 0; font-size: 20px; }
header table.summary { border-collapse: collapse; font-size: 13px; width: auto; }
header table.summary th { text-align: left; color: #9aa5b1; font-weight: normal;
                          padding: 1px 14px 1px 0; }
header table.summary td { padding: 1px 0; border: 0; overflow-wrap: anywhere; }
header table.summary th { border: 0; }
nav { padding: 8px 24px; background: #e4e7eb; font-size: 13px; }
nav a { margin-right: 14px; color: #1f5fbf; }
main { padding: 8px 24px 40px 24px; }
section { background: #fff; border-radius: 6px; margin: 14px 0; padding: 10px 16px;
          box-shadow: 0 1px 2px rgba(0,0,0,.08); }
h2 { font-size: 16px; margin: 6px 0 10px 0; }
.plot { background: #fff; border-radius: 6px; margin: 14px 0; padding: 4px;
        box-shadow: 0 1px 2px rgba(0,0,0,.08); min-height: 200px; }
table { border-collapse: collapse; font-size: 13px; width: 100%; }
th, td { border-bottom: 1px solid #e4e7eb; padding: 4px 8px; text-align: left;
         vertical-align: top; }
td { overflow-wrap: break-word; }
table.compact { width: auto; margin-bottom: 10px; }
ul { margin: 0; padding-left: 18px; }
.note { color: #616e7c; font-size: 13px; }
img.samples { image-rendering: pixelated; height: 96px; }
.verdict { font-size: 15px; padding: 8px 12px; border-radius: 4px; background: #eef2f7; }
.verdict.ok { background: #e3f9e5; } .verdict.warn { background: #fff3c4; }
.verdict.bad { background: #ffe3e3; }
.sev { padding: 0 5px; border-radius: 3px; font-size: 12px; background: #e4e7eb; }
.sev.warning { background: #fff3c4; } .sev.error { background: #ffd8d8; }
.sev.critical { background: #222; color: #fff; }
#tg-status { font-size: 12px; color: #616e7c; padding: 0 24px 24px 24px; }
"""

WATCH_JS = """
window.tgErrors = [];
window.addEventListener('error', function (e) {
  window.tgErrors.push('error: ' + (e.message || (e.target && e.target.tagName) || 'unknown'));
}, true);
window.addEventListener('unhandledrejection', function (e) {
  window.tgErrors.push('unhandled rejection: ' + String(e.reason));
});
document.addEventListener('securitypolicyviolation', function (e) {
  window.tgErrors.push('blocked by the page policy: ' + e.violatedDirective + ' ' + e.blockedURI);
});
"""

BOOT_JS = """
(function () {
  'use strict';
  var status = document.getElementById('tg-status');
  var title = document.title;
  var began = performance.now();
  function finish(state, drawn, expected, traces) {
    var errors = window.tgErrors;
    status.setAttribute('data-state', state);
    status.setAttribute('data-plots', String(drawn));
    status.setAttribute('data-expected', String(expected));
    status.setAttribute('data-traces', String(traces));
    status.setAttribute('data-errors', String(errors.length));
    status.setAttribute('data-ms', String(Math.round(performance.now() - began)));
    status.textContent = drawn + ' of ' + expected + ' plots drawn' +
      (errors.length ? '; errors: ' + errors.join(' | ') : '');
    document.title = title + ' \\u2014 ' + drawn + '/' + expected + ' plots';
  }
  var payload = JSON.parse(document.getElementById('tg-data').textContent);
  var figures = payload.figures;
  if (typeof Plotly === 'undefined') {
    window.tgErrors.push('plotly.js did not load');
    finish('failed', 0, figures.length, 0);
    return;
  }
  function bytes(b64) {
    var bin = atob(b64), out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out.buffer;
  }
  function decode(spec) {
    var raw;
    if (spec.tg === 'f8') {
      raw = new Float64Array(bytes(spec.b64));
      var out = new Array(raw.length);
      for (var i = 0; i < raw.length; i++) out[i] = isFinite(raw[i]) ? raw[i] : null;
      return out;
    }
    if (spec.tg === 'i4') return Array.from(new Int32Array(bytes(spec.b64)));
    throw new Error('unknown array encoding ' + spec.tg);
  }
  function fmt(v) {
    if (v === 0) return '0';
    var a = Math.abs(v);
    return (a >= 1e-3 && a < 1e5) ? String(Number(v.toPrecision(4))) : v.toExponential(3);
  }
  var KINDS = {'-32767': 'NaN', '-32766': 'inf', '-32765': '-inf', '-32764': 'NaN and inf'};
  var grids = {};
  function grid(key) {
    if (grids[key]) return grids[key];
    var g = payload.arrays[key];
    var codes = new Int16Array(bytes(g.b64));
    var starts = decode(g.starts), ends = decode(g.ends);
    var span = starts.map(function (s, c) {
      return s === ends[c] ? 'step ' + s : 'steps ' + s + '\\u2013' + ends[c];
    });
    var vz = [], vt = [], fz = [], ft = [];
    for (var r = 0; r < g.rows; r++) {
      var zr = new Array(g.cols), tr = new Array(g.cols);
      var fr = new Array(g.cols), gr = new Array(g.cols);
      for (var c = 0; c < g.cols; c++) {
        var code = codes[r * g.cols + c];
        zr[c] = null; tr[c] = ''; fr[c] = null; gr[c] = '';
        if (code >= -30000) {
          var u = g.lo + (code + 30000) * g.scale;
          zr[c] = u;
          tr[c] = span[c] + ': ' + (starts[c] === ends[c] ? '' : 'max ') +
            fmt(g.log ? Math.pow(10, u) : u);
        } else if (code === -32763) {
          zr[c] = g.lo;
          tr[c] = span[c] + ': 0';
        } else if (KINDS[code]) {
          fr[c] = 1;
          gr[c] = KINDS[code] + (starts[c] === ends[c] ? ' at ' : ' in ') + span[c];
        }
      }
      vz.push(zr); vt.push(tr); fz.push(fr); ft.push(gr);
    }
    grids[key] = {x: starts, values: [vz, vt], flags: [fz, ft]};
    return grids[key];
  }
  function prepare(trace) {
    Object.keys(trace).forEach(function (k) {
      var v = trace[k];
      if (v && typeof v === 'object' && !Array.isArray(v) && v.tg) trace[k] = decode(v);
    });
    if (trace.tggrid) {
      var g = grid(trace.tggrid.array), part = g[trace.tggrid.part];
      trace.x = g.x; trace.z = part[0]; trace.text = part[1];
      delete trace.tggrid;
    }
    return trace;
  }
  var config = {responsive: true, displaylogo: false, scrollZoom: false};
  var drawn = 0, traces = 0;
  var jobs = figures.map(function (fig) {
    var div = document.getElementById('plot-' + fig.id);
    try {
      var data = fig.data.map(prepare);
      return Plotly.newPlot(div, data, fig.layout, config).then(function (gd) {
        if (gd && gd._fullLayout && gd.querySelector('.main-svg')) {
          drawn += 1;
          traces += gd._fullData.length;
        } else {
          window.tgErrors.push('plot ' + fig.id + ' drew nothing');
        }
      }, function (err) {
        window.tgErrors.push('plot ' + fig.id + ': ' + err);
      });
    } catch (err) {
      window.tgErrors.push('plot ' + fig.id + ': ' + err);
      return Promise.resolve();
    }
  });
  Promise.all(jobs).then(function () {
    finish('done', drawn, figures.length, traces);
  });
})();
"""


def page(*, title: str, header: str, nav: list[tuple[str, str]], sections: list[str],
         figures: list[dict[str, Any]], arrays: dict[str, Any], plotly_js: str) -> str:
    """The whole page. `header` and `sections` are HTML already escaped; `title` and the nav
    labels are escaped here; `figures` and `arrays` are embedded as script-safe JSON."""
    links = "".join(f'<a href="#{text(anchor)}">{text(label)}</a>' for anchor, label in nav)
    payload = script_json({"figures": figures, "arrays": arrays})
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta name="generator" content="trainguard report">',
        f"<title>{text(title)}</title><style>{CSS}</style>",
        f"<script>{WATCH_JS}</script></head><body>",
        header, f"<nav>{links}</nav><main>", *sections, "</main>",
        f'<div id="tg-status" data-state="pending" data-expected="{len(figures)}" '
        f'data-plots="0" data-errors="0"></div>',
        f"<script>{plotly_js}</script>",
        f'<script type="application/json" id="tg-data">{payload}</script>',
        f"<script>{BOOT_JS}</script></body></html>\n",
    ])
