"""The benchmarks. ``python -m tools.bench`` is the report against pi-durable's memory, SQLite and
JSONL backends (``tools.bench.report``); ``python -m tools.bench.NAME`` runs one of the others,
each with its own ``--help``. Shared pieces: ``records`` (what is committed), ``workloads``
(what is timed), ``sample`` (a typical model message), ``report.Store`` (a fresh store of any backend)."""
