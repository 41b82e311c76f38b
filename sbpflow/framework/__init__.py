"""The framework layer: Tensor, factories, the interpreter."""
