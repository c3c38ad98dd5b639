"""Relax passes written for relaxc (constant folding, layout, memory planning, dispatch)."""
