"""Sample content shared by the benchmarks, so they measure the same typical agent turn."""

MESSAGE = (
    "Here is the plan. First I will read the configuration file to see which storage backend is "
    "selected, then run the failing test with verbose output so we can see the exact assertion. "
    "If the failure comes from the map growing while a reader holds a snapshot, the fix is to "
    "adopt the new size on the next read transaction instead of keeping the old mapping. After "
    "that I will add a regression test that appends several megabytes from a tiny initial map "
    "and checks that a reader in another process still sees every record, in order, once."
)
"""About 500 bytes of ordinary model text."""
