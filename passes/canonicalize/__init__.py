"""Importer idioms rewritten into the plain operators later passes understand (the simplify phase),
a module for each kind of idiom:

- ``elementwise.py``: ONNX ``Sum`` as adds, ``Dropout`` as the identity, a division by a constant as
  a multiplication, ``Clip`` lowered to TIR back to ``maximum`` and ``minimum``;
- ``channels.py``: splits along C and channel shuffles as slices and takes, which the layout pass
  keeps blocked;
- ``convolutions.py``: 1-D convolutions as 2-D ones, depthwise 1x1 convolutions as multiplications;
- ``reductions.py``: group norms as row reductions, whole-tensor reductions in parallel slabs;
- ``matmuls.py``: matmuls of rows flattened from dynamic dims on the unflattened rows.
"""
