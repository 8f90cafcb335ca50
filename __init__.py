"""hbmserve: a Ray-based LLM serving cluster that treats HBM as the scarce resource.

The repository root is the `hbmserve` package (see pyproject's package-dir); the
top-level folders are its subpackages, imported as `hbmserve.cluster`, `hbmserve.placement`, ...
"""

__version__ = "0.1.0"
