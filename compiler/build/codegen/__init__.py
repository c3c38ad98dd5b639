"""Turning a lowered module into code: parallel CPU code generation, the external GPU tools (nvcc,
ld.lld, ROCm device libraries), and the device code an exported GPU artifact carries."""
