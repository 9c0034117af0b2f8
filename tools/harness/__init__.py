"""Fault harnesses: real writer processes killed (``crash_harness``, its child ``crash_writer``),
journal calls failed with ENOSPC/EIO (``io_faults``, ``iofaults``) and power cuts replayed from a
recording of a writer's file operations (``power_loss``, ``powerloss``). The tests import them as
``tools.harness.*`` and run them briefly; ``python -m tools.harness.NAME`` runs them long."""
