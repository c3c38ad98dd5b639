"""What a model's input or output is, as the front end, the artifact and the runtime all name it."""

TensorSpec = tuple[str, tuple[int, ...], str]  # (name, shape, dtype)
