"""A small numpy quantizer to GGUF's Q4_K and Q6_K blocks (the gguf package dequantizes them but
does not write them), for tests: min/max scales per sub-block, no search, so the bytes are valid
GGUF blocks though less accurate than llama.cpp's.  Blocks of 256 along a row; the layouts are
docs/FORMAT.md's (and gguf.quants' dequantizers)."""
import numpy as np
from gguf import GGMLQuantizationType

QK = 256


def _f16(x):
    """(f16 bytes, the f16 value back as f32)"""
    h = np.asarray(x, np.float32).astype(np.float16)
    return h.view(np.uint8).reshape(*h.shape[:-1], 2), h.astype(np.float32)


def _safe(q, scale):
    """round(q / scale) where scale != 0, else 0"""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(scale != 0, np.rint(q / np.where(scale != 0, scale, 1)), 0)


def q4_k(x):
    """x (n, 256) f32 -> (n, 144) uint8: 8 sub-blocks of 32, value = d*sc*q - dmin*mn, sc and mn
    6 bits, q 4 bits."""
    n = x.shape[0]
    sub = x.reshape(n, 8, 32)
    lo = np.minimum(sub.min(-1), 0)                      # (n, 8) the min the block subtracts, <= 0
    scale, mins = (sub.max(-1) - lo) / 15, -lo
    d_bytes, d = _f16(scale.max(-1, keepdims=True) / 63)
    m_bytes, dmin = _f16(mins.max(-1, keepdims=True) / 63)
    sc = np.clip(_safe(scale, d), 0, 63).astype(np.uint8)
    mn = np.clip(_safe(mins, dmin), 0, 63).astype(np.uint8)
    step = (d * sc)[..., None]
    q = np.clip(_safe(sub + (dmin * mn)[..., None], step), 0, 15).astype(np.uint8)
    scales = np.concatenate([sc[:, :4] | (sc[:, 4:] >> 4) << 6, mn[:, :4] | (mn[:, 4:] >> 4) << 6,
                             (sc[:, 4:] & 15) | (mn[:, 4:] & 15) << 4], axis=-1)
    qs = (q[:, 0::2] | q[:, 1::2] << 4).reshape(n, 128)   # 32 bytes: sub-block 2j low, 2j+1 high
    return np.concatenate([d_bytes, m_bytes, scales, qs], axis=-1)


def q6_k(x):
    """x (n, 256) f32 -> (n, 210) uint8: 16 sub-blocks of 16, value = d*sc*(q - 32), sc int8,
    q 6 bits (low 4 in ql, high 2 in qh)."""
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    scale = np.abs(sub).max(-1) / 31                     # (n, 16)
    d_bytes, d = _f16(scale.max(-1, keepdims=True) / 127)
    sc = np.clip(_safe(scale, d), -128, 127).astype(np.int8)
    q = (np.clip(_safe(sub, (d * sc)[..., None]), -32, 31) + 32).astype(np.uint8).reshape(n, 256)
    low = q.reshape(n, 2, 2, 64) & 15                    # (half, nibble, byte)
    ql = (low[:, :, 0] | low[:, :, 1] << 4).reshape(n, 128)
    high = (q.reshape(n, 2, 4, 32) >> 4) << np.array([0, 2, 4, 6], np.uint8)[:, None]   # (half, bit pair, byte)
    qh = np.bitwise_or.reduce(high, axis=2).reshape(n, 64)
    return np.concatenate([ql, qh, sc.view(np.uint8), d_bytes], axis=-1)


QUANTIZERS = {GGMLQuantizationType.Q4_K: (q4_k, 144), GGMLQuantizationType.Q6_K: (q6_k, 210)}


def quantize(x, kind):
    """x (..., K) f32 with K a multiple of 256 -> (..., K / 256 * block bytes) uint8 in GGUF layout"""
    fn, size = QUANTIZERS[kind]
    *lead, k = x.shape
    blocks = fn(np.ascontiguousarray(x, np.float32).reshape(-1, QK))
    return blocks.reshape(*lead, k // QK * size)
