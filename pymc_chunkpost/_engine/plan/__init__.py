"""Policy: the loop kind, the chunk size, the devices, the output memory, the retry."""
