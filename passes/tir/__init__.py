"""TIR passes written for relaxc: rewrites of the kernels (PrimFuncs) and relaxc's TIR lowering
pipeline, where the Relax passes of ``relaxc.passes`` rewrite the graph."""
