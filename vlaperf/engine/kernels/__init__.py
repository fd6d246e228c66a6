"""Hand-written Triton kernels for the denoise step (the `triton_kernels` lever; tuned on an H200: see each module)."""
