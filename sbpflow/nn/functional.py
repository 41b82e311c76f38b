"""torch.nn.functional for sbpflow: re-exported from the framework's nn family."""
