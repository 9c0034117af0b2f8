"""Read-only views of a store for operators and auditors (`durable-log stats --watch`; more to come)."""
