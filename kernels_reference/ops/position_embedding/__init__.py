"""Learned position embeddings resampled to an image's patch grid (DINOv2, ``L1/dinov2_embeddings.py``):
the bicubic resampling fused with the add into the patch tokens, in Triton (bicubic_add.py)."""
