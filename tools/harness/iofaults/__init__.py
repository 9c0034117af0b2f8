"""I/O fault injection for the power writer's journal: fail the Nth os call of one kind with
ENOSPC or EIO (``inject.py``), in a writer process that is then killed (``child.py``), and check
what recovery gives back (``tools/harness/io_faults.py``)."""
