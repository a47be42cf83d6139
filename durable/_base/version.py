"""The version of this package, in a module of its own so that a module inside it can name
the version without importing the package (which imports every module).
"""

from __future__ import annotations

__version__ = "0.1.0"
