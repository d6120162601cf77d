"""Tables of the run store.

Scalars are JSON (Python's encoder writes NaN and Infinity literally, so nothing is lost);
per-parameter and per-module vectors are float32 blobs, which keep NaN and inf bit for bit.
"""

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS steps (
    step INTEGER PRIMARY KEY, time REAL NOT NULL, data TEXT NOT NULL, grad_norms BLOB);
CREATE TABLE IF NOT EXISTS param_metrics (
    step INTEGER NOT NULL, metric TEXT NOT NULL, data BLOB NOT NULL, PRIMARY KEY (step, metric));
CREATE TABLE IF NOT EXISTS module_metrics (
    step INTEGER NOT NULL, metric TEXT NOT NULL, names TEXT NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (step, metric));
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, step INTEGER NOT NULL, kind TEXT NOT NULL,
    severity TEXT NOT NULL, param TEXT, value TEXT, message TEXT NOT NULL, details TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_step ON events (step);
"""
SCHEMA_VERSION = 1
