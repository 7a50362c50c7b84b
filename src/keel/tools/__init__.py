"""Tools the model can call, how they are described, validated and run."""
