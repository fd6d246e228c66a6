"""Hand-written Triton kernels for the denoise step (experimental: see each module)."""
