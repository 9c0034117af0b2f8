"""Shared non-test modules of the suite: real nats-servers, comparisons, workloads, child processes."""
