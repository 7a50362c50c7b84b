"""Tools the model can call, how they are described, validated and run."""

__all__: list[str] = []
