"""Read-only views of a store for operators and auditors: `durable-log serve` (the web view, its
health and metrics endpoints) and `durable-log stats --watch`."""

__all__: list[str] = []  # the package offers its modules
