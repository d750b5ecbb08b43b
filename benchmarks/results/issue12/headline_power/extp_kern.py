# Prototype: plain-prefill extend attention (no prefix), TMA tiles, with the next tile's QK^T
# issued before this tile's softmax (PIPE=1) so the wgmma can run under the exponentials.
import triton
import triton.language as tl


@triton.jit
def _fold(acc, m_i, l_i, qk, scale, v):
    m_new = tl.maximum(m_i, tl.max(qk, 1) * scale)
    p = tl.exp2(qk * scale - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, m_new, l_i


@triton.jit
def _kern(Q, K, V, Out, qo_indptr, sm_scale_log2, stride_ot, stride_oh,
          GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PIPE: tl.constexpr, WS: tl.constexpr):
    head = tl.program_id(0)
    m_block = tl.num_programs(1) - 1 - tl.program_id(1)
    b = tl.program_id(2)
    kv_head = head // GROUP
    qo_start = tl.load(qo_indptr + b)
    ext_len = tl.load(qo_indptr + b + 1) - qo_start
    block_lo = m_block * BLOCK_M
    if block_lo < ext_len:
        offs_m = block_lo + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, HEAD_DIM)
        m_mask = offs_m < ext_len
        q = Q.load([qo_start + block_lo, head * HEAD_DIM])
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        col = kv_head * HEAD_DIM
        if PIPE == 1:
            # QK^T of tile j+1 is issued before tile j's softmax.
            n_full = block_lo // BLOCK_N
            if n_full > 0:
                k = K.load([qo_start, col])
                qk = tl.dot(q, tl.trans(k))
                for j in range(1, n_full):
                    k = K.load([qo_start + j * BLOCK_N, col])
                    qk_next = tl.dot(q, tl.trans(k))
                    v = V.load([qo_start + (j - 1) * BLOCK_N, col])
                    acc, m_i, l_i = _fold(acc, m_i, l_i, qk, sm_scale_log2, v)
                    qk = qk_next
                v = V.load([qo_start + (n_full - 1) * BLOCK_N, col])
                acc, m_i, l_i = _fold(acc, m_i, l_i, qk, sm_scale_log2, v)
        elif PIPE == 2:
            # two half tiles of keys per iteration, softmax of the first under the second's dot
            for start in range(0, block_lo, 2 * BLOCK_N):
                k0 = K.load([qo_start + start, col])
                k1 = K.load([qo_start + start + BLOCK_N, col])
                qk0 = tl.dot(q, tl.trans(k0))
                qk1 = tl.dot(q, tl.trans(k1))
                v0 = V.load([qo_start + start, col])
                acc, m_i, l_i = _fold(acc, m_i, l_i, qk0, sm_scale_log2, v0)
                v1 = V.load([qo_start + start + BLOCK_N, col])
                acc, m_i, l_i = _fold(acc, m_i, l_i, qk1, sm_scale_log2, v1)
        else:
            for start in tl.range(0, block_lo, BLOCK_N, warp_specialize=WS):
                k = K.load([qo_start + start, col])
                v = V.load([qo_start + start, col])
                qk = tl.dot(q, tl.trans(k))
                acc, m_i, l_i = _fold(acc, m_i, l_i, qk, sm_scale_log2, v)
        hi = tl.minimum(block_lo + BLOCK_M, ext_len)
        for start in range(block_lo, hi, BLOCK_N):
            pos = start + offs_n
            k = K.load([qo_start + start, col])
            v = V.load([qo_start + start, col])
            qk = tl.dot(q, tl.trans(k))
            visible = (pos[None, :] <= offs_m[:, None]) & (pos < ext_len)[None, :]
            qk = tl.where(visible, qk, float("-inf"))
            acc, m_i, l_i = _fold(acc, m_i, l_i, qk, sm_scale_log2, v)
        out = acc / l_i[:, None]
        tl.store(Out + (qo_start + offs_m)[:, None].to(tl.int64) * stride_ot + head * stride_oh
                 + offs_d[None, :], out.to(Out.dtype.element_ty), mask=m_mask[:, None])
