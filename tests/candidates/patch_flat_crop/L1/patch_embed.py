# WRONG: the pixels past the last whole patch cut off the flat image buffer (its first
# Hp*p x Wp*p values per channel) instead of off each row: right when the width is a multiple of
# the patch, rows sheared when it is not (SigLIP's 384 px at patch 14).
from kernels_reference.L1.patch_embed import PatchEmbed as _Ref


class PatchEmbed(_Ref):
    def forward(self, x):
        b, (hp, wp), (ph, pw) = x.shape[0], self.output_grid(x), self.patch_size
        flat = x.float().contiguous().reshape(b, self.in_chans, -1)[:, :, :hp * ph * wp * pw]
        patches = flat.reshape(b, self.in_chans, hp, ph, wp, pw).permute(0, 2, 4, 1, 3, 5).reshape(b, hp * wp, -1)
        out = patches @ self.proj.weight.float().reshape(self.embed_dim, -1).t() + self.proj.bias.float()
        return out.to(x.dtype)
