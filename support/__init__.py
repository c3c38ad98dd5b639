"""The bottom layer of relaxc: errors, targets, threads, versions and fingerprints, file writes, the
reporting-pass contract, and the one module that touches TVM's private names.

``passes``, ``schedules`` and ``compiler`` import from here; nothing here imports them
(docs/design.md, "Layers").
"""
