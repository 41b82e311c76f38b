"""Bottom layer: dtypes, errors and frozen metadata shared by every other layer."""
