"""Simulated power loss: a write recorder (``recorder.c``), crash states built from its recordings
(``crash.py``), the recorded writer (``writer.py``), the checker of each state (``check.py``) and
the exploration that ties them together (``explore.py``)."""
