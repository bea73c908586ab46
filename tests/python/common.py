"""Paths and helpers shared by the Python module's tests.

ctest sets PYTHONPATH to build/python and KIVI_SHARED_DIR / KIVI_CLI / KIVI_SOURCE_DIR; run by
hand from the repository root they default to ../shared and build/bin/kivi:
    PYTHONPATH=build/python /usr/bin/python3 tests/python/test_codec.py
"""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("KIVI_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
SHARED = os.environ.get("KIVI_SHARED_DIR", os.path.join(SOURCE, "..", "shared"))
CLI = os.environ.get("KIVI_CLI", os.path.join(SOURCE, "build", "bin", "kivi"))
MODEL = os.path.join(SHARED, "models", "stories260K.bin")
TOKENIZER = os.path.join(SHARED, "models", "tok512.bin")
TEXT = os.path.join(SHARED, "data", "tinytales.txt")

# ctest reports a test that exits with this code as skipped (SKIP_RETURN_CODE).
SKIP_CODE = 77


def skip_without_torch():
    """Exits with the skip code when PyTorch is not installed (call before importing it)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        print("skipped: PyTorch (Debian's python3-torch) is not installed")
        sys.exit(SKIP_CODE)
