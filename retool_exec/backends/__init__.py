"""Where code runs: one module per backend, one config model per backend."""
