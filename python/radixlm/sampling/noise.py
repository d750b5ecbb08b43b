"""Counter-based Gumbel noise for reproducible sampling.

Sampling uses the Gumbel-max trick: argmax(logits / T + g) with i.i.d. standard Gumbel noise g is
an exact draw from softmax(logits / T). Instead of a stateful RNG (whose stream depends on which
other requests share the batch, and differs between CPU and CUDA generators), the noise of one
(request, step, token) cell is a pure function of

    (seed of the request, number of tokens it has generated so far, token id)

computed by integer hashing, so a request with a fixed seed draws the same tokens alone or in any
batch, in any row, on any device. Definition (all values uint32, `mix` as below):

    row_key(seed, step) = mix(mix(mix(lo32(seed) ^ SEED_SALT) ^ hi32(seed)) ^ lo32(step))
    token_key(v)        = mix(v ^ TOKEN_SALT)
    bits(b, v)          = mix(row_key_b ^ token_key_v)
    u                   = ((bits >> 9) + 0.5) * 2**-23        # exact in float32, in (0, 1)
    g                   = -log(-log(u))

`mix` is the two-round xor-shift-multiply integer finaliser from Chris Wellons' hash-prospector
(shifts 16/15/15, multipliers 0x21f0aaad and 0x735a2d97). Both multipliers are below 2**31, so for
x < 2**32 the product fits in a signed int64 and `(x * c) & 0xFFFFFFFF` is exact: nothing relies on
overflow wrap-around, on CPU or GPU. Row keys are computed on the host (a few Python integer ops per
request per step, and no tiny kernel launches); the [B, V] part runs as whole-tensor torch ops.
This eager version is the reference: a fused GPU kernel may replace it if it yields the same bits.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
_MUL1 = 0x21F0AAAD
_MUL2 = 0x735A2D97
# Domain-separation salts (golden-ratio and murmur3 constants), so that seed and token id enter
# the hash differently and seed 0 / token 0 do not start from the fixed point mix(0) = 0.
_SEED_SALT = 0x9E3779B9
_TOKEN_SALT = 0x85EBCA6B

# The uniform variate keeps the top 23 bits of the hash: (k + 0.5) * 2**-23 is then exact in
# float32 and lies in [2**-24, 1 - 2**-24], so neither log can see 0 or 1. The cost is that a token
# more than ~19.4 nats below the best one can never win (true probability < 4e-9).
_UNIFORM_BITS = 23

# Bound on the elements of one [rows, V] noise chunk: the int64 temporaries of the hash would
# otherwise take several GB at a large batch times a 150k vocabulary.
MAX_NOISE_CHUNK_ELEMENTS = 1 << 23


def mix32_int(x: int) -> int:
    """The hash on one Python int (host side: row keys, and the tests' reference)."""
    x &= MASK32
    x ^= x >> 16
    x = (x * _MUL1) & MASK32
    x ^= x >> 15
    x = (x * _MUL2) & MASK32
    return x ^ (x >> 15)


def mix32(x: torch.Tensor) -> torch.Tensor:
    """The same hash, elementwise, on an int64 tensor of values in [0, 2**32); returns a new one."""
    x = x ^ (x >> 16)
    x.mul_(_MUL1).bitwise_and_(MASK32)  # x < 2**32 and c < 2**31: the product is < 2**63
    x.bitwise_xor_(x >> 15)
    x.mul_(_MUL2).bitwise_and_(MASK32)
    return x.bitwise_xor_(x >> 15)


def row_key(seed: int, step: int) -> int:
    """32-bit key of one request at one step; `seed` may be any Python int (its low 64 bits)."""
    s = seed & 0xFFFFFFFFFFFFFFFF
    key = mix32_int((s & MASK32) ^ _SEED_SALT)
    key = mix32_int(key ^ (s >> 32))
    return mix32_int(key ^ (step & MASK32))


def token_keys(vocab_size: int, device: torch.device) -> torch.Tensor:
    """[V] int64: the per-token half of the hash (callers may cache it per vocab and device)."""
    return mix32(torch.arange(vocab_size, dtype=torch.int64, device=device) ^ _TOKEN_SALT)


def hash_bits(row_keys: torch.Tensor, tok_keys: torch.Tensor) -> torch.Tensor:
    """[B, V] int64 of 32-bit hashes from [B] row keys and [V] token keys."""
    return mix32(row_keys.unsqueeze(1) ^ tok_keys.unsqueeze(0))


def gumbel_noise(row_keys: torch.Tensor, tok_keys: torch.Tensor) -> torch.Tensor:
    """[B, V] float32 standard Gumbel noise."""
    k = hash_bits(row_keys, tok_keys) >> (32 - _UNIFORM_BITS)
    u = k.to(torch.float32).add_(0.5).mul_(2.0 ** -_UNIFORM_BITS)
    return u.log_().neg_().log_().neg_()  # -log(-log(u)), in place: one float buffer


def gumbel_argmax(scores: torch.Tensor, row_keys: torch.Tensor,
                  tok_keys: torch.Tensor) -> torch.Tensor:
    """argmax(scores + gumbel) per row, in row chunks that bound the hash's temporaries."""
    rows, vocab = scores.shape
    chunk = max(1, MAX_NOISE_CHUNK_ELEMENTS // max(vocab, 1))
    if rows <= chunk:
        return torch.argmax(gumbel_noise(row_keys, tok_keys).add_(scores), dim=-1)
    out = torch.empty(rows, dtype=torch.int64, device=scores.device)
    for start in range(0, rows, chunk):  # a few chunks of rows, never one per request
        end = min(start + chunk, rows)
        noise = gumbel_noise(row_keys[start:end], tok_keys)
        out[start:end] = torch.argmax(noise.add_(scores[start:end]), dim=-1)
    return out
