# An honest RWKV-7 time mix in plain PyTorch, float32. Per token and head, with the [K, V] state S:
#   S <- exp(w) * S + b (a^T S) + k v^T   (a^T S taken from the state before this token's decay)
#   o = S^T (r * scale)
# i.e. S <- A S + k v^T with the transition A = diag(exp(w)) + b a^T. Walking the tokens one by one
# costs a few launches per token (32k tokens: over a second a call), so the tokens are cut into
# chunks of up to CHUNK tokens that never cross a sequence, and every chunk is worked on at once:
#   1. each chunk's transition M = A_L ... A_1 and its state from zero U (CHUNK steps, all chunks);
#   2. the states carried into each chunk, S_next = M S + U along each sequence (one step per chunk
#      rank, all sequences at once);
#   3. the tokens again from the carried states, writing the outputs (CHUNK steps, all chunks).
# A padding slot (a chunk shorter than CHUNK) is an identity step: exp(0) = 1, a = b = k = v = 0.
import torch
from torch import nn

CHUNK = 64


class ChunkRWKV7(nn.Module):
    def forward(self, r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state=False, cu_seqlens=None):
        out_shape, out_dtype = v.shape, v.dtype
        if cu_seqlens is None:  # B equal rows -> B packed sequences
            rows, t = r.shape[:2]
            cu_seqlens = torch.arange(rows + 1, device=r.device) * t
            r, w, k, v, a, b = (x.reshape(1, rows * t, *x.shape[2:]) for x in (r, w, k, v, a, b))
        scale = r.shape[-1] ** -0.5 if scale is None else scale
        r, w, k, v, a, b = (x[0].float() for x in (r, w, k, v, a, b))
        n_tok, h, dk, dv = v.shape[0], v.shape[1], k.shape[-1], v.shape[-1]
        bounds = cu_seqlens.tolist()
        n = len(bounds) - 1
        states = (initial_state.float().clone() if initial_state is not None else v.new_zeros(n, h, dk, dv))
        o = v.new_zeros(n_tok, h, dv)
        lengths = [e - s for s, e in zip(bounds[:-1], bounds[1:])]
        if n == 0 or max(lengths) == 0:
            return o.to(out_dtype).reshape(out_shape), (states if output_final_state else None)
        span = min(CHUNK, max(lengths))

        # Chunks: (sequence, first token, rank in the sequence); each a row of span token slots.
        chunks = [(i, start, rank) for i, (s, length) in enumerate(zip(bounds[:-1], lengths))
                  for rank, start in enumerate(range(s, s + length, span))]
        pad = n_tok  # the index of an appended identity token
        slots = torch.tensor([[t if t < bounds[i + 1] else pad for t in range(start, start + span)]
                              for i, start, _ in chunks], device=r.device)  # [chunks, span]
        ident = lambda x, fill: torch.cat([x, x.new_full((1, *x.shape[1:]), fill)])  # noqa: E731
        decay = ident(w.exp(), 1.0)[slots]  # [chunks, span, h, dk]
        rs, ks, vs, as_, bs = (ident(x, 0.0)[slots] for x in (r * scale, k, v, a, b))

        # 1. per chunk: the transition M and the state U reached from zero
        m = torch.eye(dk, device=r.device).expand(len(chunks), h, dk, dk).clone()
        u = v.new_zeros(len(chunks), h, dk, dv)
        for j in range(span):
            dj, bj = decay[:, j, :, :, None], bs[:, j, :, :, None]
            aj = as_[:, j, :, None, :]  # a row vector: a^T X is one batched matmul
            m = dj * m + bj * (aj @ m)
            u = dj * u + bj * (aj @ u) + ks[:, j, :, :, None] * vs[:, j, :, None, :]

        # 2. along each sequence: the state entering every chunk, and the final state
        entering = torch.empty_like(u)
        by_rank = {}
        for q, (i, _, rank) in enumerate(chunks):
            by_rank.setdefault(rank, []).append((q, i))
        for rank in range(len(by_rank)):
            ids, seqs = (torch.tensor(col, device=r.device) for col in zip(*by_rank[rank]))
            carried = states[seqs]
            entering[ids] = carried
            states[seqs] = m[ids] @ carried + u[ids]

        # 3. the tokens again from the entering states: the outputs
        s = entering
        out = v.new_empty(len(chunks), span, h, dv)
        for j in range(span):
            dj, bj = decay[:, j, :, :, None], bs[:, j, :, :, None]
            s = dj * s + bj * (as_[:, j, :, None, :] @ s) + ks[:, j, :, :, None] * vs[:, j, :, None, :]
            out[:, j] = (rs[:, j, :, None, :] @ s)[:, :, 0]
        real = slots < pad
        o[slots[real]] = out[real]
        return o.to(out_dtype).reshape(out_shape), (states if output_final_state else None)
