"""Read models folded from the log: ``Projector`` writes them, ``ReadModel`` queries them.

Everything here can be dropped and rebuilt from the log (``tables`` lists the databases).
"""

from pi_durable.errors import StorageRequestError

from . import tables
from .projector import Plan, Projector
from .readmodel import ReadModel

__all__ = ["Plan", "Projector", "ReadModel", "StorageRequestError", "tables"]
