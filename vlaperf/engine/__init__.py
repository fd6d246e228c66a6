"""The engine: every speed lever as a named switch over the reference pi0 model."""

from vlaperf.engine.engine import Engine
from vlaperf.engine.levers import COMPILE_MODES, LEVERS, LeverError, Levers

__all__ = ["Engine", "Levers", "LEVERS", "COMPILE_MODES", "LeverError"]
