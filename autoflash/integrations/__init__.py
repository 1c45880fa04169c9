"""Where autoflash meets other libraries: torch.compile (torch_ops), SDPA (sdpa)."""
