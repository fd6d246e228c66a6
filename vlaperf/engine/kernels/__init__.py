"""Hand-written Triton kernels for the denoise step, tuned on an H200 (see each module):
`triton_kernels` (small_m_matmul.py, suffix_attention.py) and `megakernel` (expert_step.py)."""
