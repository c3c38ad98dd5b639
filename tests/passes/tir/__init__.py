"""Tests of the TIR passes (``passes/tir/``)."""
