"""What a model's input or output is, as the front end, the artifact and the runtime all name it."""

Dim = int | str  # a size, or the name of a dynamic dim (an output's: an expression of input dims' names)
TensorSpec = tuple[str, tuple[Dim, ...], str]  # (name, shape, dtype)


def is_static(shape: tuple[Dim, ...]) -> bool:
    return all(isinstance(d, int) for d in shape)
