"""MLA over a paged latent cache (``L1/mla_attention.py``): the latent store and the split-K
latent-space decode kernel (decode.py), merged by the paged_decode op's merge kernel.
"""
