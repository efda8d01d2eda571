"""Shared test paths: the project root on sys.path, and ../shared (real data, references)."""

import os
import sys

import pytest

# TensorFlow's C++ start-up banners (oneDNN, CPU features) would bury test output; errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
requires_shared = pytest.mark.skipif(
    not os.path.isdir(SHARED),
    reason="../shared (real data and reference outputs) is not present beside the project")
