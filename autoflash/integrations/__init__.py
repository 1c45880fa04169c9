"""Ways into autoflash from other libraries: torch.compile (torch_ops) and SDPA (sdpa), registered by `import
autoflash` and `autoflash.install_sdpa()`; Hugging Face transformers (transformers), imported on its own."""
