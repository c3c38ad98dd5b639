"""Relax passes written for relaxc (constant folding, layout, memory planning, dispatch); the kernel
(TIR) passes are in ``passes/tir/``."""
