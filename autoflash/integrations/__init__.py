"""Ways into autoflash from other libraries (each imported on its own, never by `import autoflash`)."""
