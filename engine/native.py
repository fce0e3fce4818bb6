"""The compiled C/OpenMP extensions (setup.py builds them with the package): one way to load
them, so every caller degrades the same way where the install had no C compiler."""

from __future__ import annotations

import importlib
import logging
from types import ModuleType

logger = logging.getLogger(__name__)


def load_extension(module: str, instead: str) -> ModuleType | None:
    """The extension `module`, or None where it was not built; then logs a warning that says
    how to build it and what runs `instead`. Callers cache the result."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        logger.warning("%s is not built (%s); reinstall with a C compiler (pip install -e .) to "
                       "use it. %s", module, exc, instead)
        return None
