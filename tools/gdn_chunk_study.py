#!/usr/bin/env python3
"""Precision study for a chunked Gated DeltaNet prefill (issue 22): how far a chunk-parallel form of the delta
rule, with its matrix products in fp32, TF32 or bf16, lands from the token-by-token recurrence in float64.

Not part of the build or the tests (needs numpy: `pip install numpy`). Usage:
    python3 tools/gdn_chunk_study.py [--seed N] [--tokens T] [--attribute]

One value head, Dk = Dv = 128, chunks of 64 tokens. Inputs mimic a layer's: q, k bf16 with a shared direction
(real keys are far from isotropic), l2-normalized, q scaled by 1/sqrt(Dk); v bf16 ~ N(0, 1); beta = sigmoid(N(0, 1))
rounded to bf16; g = -A softplus(a + dt_bias) with A ~ U(1, 16) and dt ~ logU(1e-3, 1e-1), as Qwen3.5's init.

The recurrence (docs/QWEN35.md "Gated DeltaNet layer"), per token t:
    S = exp(g_t) S;  u_t = beta_t (v_t - S^T k_t);  S += k_t u_t^T;  o_t = S^T q_t
The chunk form, per chunk of n tokens with S0 the state before it (derivation: unroll the recurrence inside the
chunk; G_t = g_0 + ... + g_t, gamma_t = exp(G_t), D_ti = exp(G_t - G_i) <= 1 for i <= t):
    A = strictly_lower(beta_t D_ti (k_t . k_i));  Tm = (I + A)^-1 (forward substitution)
    W = Tm diag(beta gamma) K;  Uv = Tm diag(beta) V;  U = Uv - W S0
    O = diag(gamma) Q S0 + lower(D o (Q K^T)) U
    S = gamma_last S0 + (diag(exp(G_last - G)) K)^T U
"""
import argparse

import numpy as np

DK = DV = 128
CHUNK = 64


def round_bits(x, drop):
    """Rounds float32 values to nearest-even, keeping 23 - drop mantissa bits (drop 16: bf16, 13: TF32)."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    half = (1 << (drop - 1)) - 1
    b = ((b + half + ((b >> drop) & 1)) >> drop) << drop
    return b.astype(np.uint32).view(np.float32)


ROUNDINGS = {"fp32": lambda x: np.asarray(x, np.float32), "tf32": lambda x: round_bits(x, 13),
             "bf16": lambda x: round_bits(x, 16)}


def make_inputs(rng, n):
    bf16 = ROUNDINGS["bf16"]
    shared = rng.standard_normal(DK).astype(np.float32)
    k = bf16(rng.standard_normal((n, DK)) + 2.0 * shared)
    q = bf16(rng.standard_normal((n, DK)) + 1.0 * shared)
    k = (k / np.sqrt((k * k).sum(1, keepdims=True) + 1e-6)).astype(np.float32)
    q = (q / np.sqrt((q * q).sum(1, keepdims=True) + 1e-6) / np.sqrt(DK)).astype(np.float32)
    v = bf16(rng.standard_normal((n, DV)))
    beta = bf16(1.0 / (1.0 + np.exp(-rng.standard_normal(n)))).astype(np.float32)
    A = rng.uniform(1, 16)
    dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1)))
    g = (-A * np.log1p(np.exp(0.5 * rng.standard_normal(n) + np.log(np.expm1(dt))))).astype(np.float32)
    return q, k, v, beta, g


def recurrence(inp, dtype):
    q, k, v, beta, g = inp
    S = np.zeros((DK, DV), dtype)
    O = np.zeros((len(q), DV), dtype)
    for t in range(len(q)):
        S *= dtype(np.exp(g[t]))
        u = dtype(beta[t]) * (v[t].astype(dtype) - S.T @ k[t].astype(dtype))
        S += np.outer(k[t].astype(dtype), u)
        O[t] = S.T @ q[t].astype(dtype)
    return O, S


def chunked(inp, rounding):
    """rounding: product name -> rounding of that product's inputs (products: KK, QK, W, Uv, WS, QS, PU, KU)."""
    q, k, v, beta, g = inp
    S = np.zeros((DK, DV), np.float32)
    O = np.zeros((len(q), DV), np.float32)

    def mm(name, x, y):
        r = ROUNDINGS[rounding.get(name, "fp32")]
        return (r(x) @ r(y)).astype(np.float32)

    for c0 in range(0, len(q), CHUNK):
        K, Q, V, b = k[c0:c0 + CHUNK], q[c0:c0 + CHUNK], v[c0:c0 + CHUNK], beta[c0:c0 + CHUNK]
        n = len(K)
        G = np.cumsum(g[c0:c0 + CHUNK]).astype(np.float32)
        gamma = np.exp(G).astype(np.float32)
        D = np.exp(np.minimum(G[:, None] - G[None, :], 0.0)).astype(np.float32)
        A = np.tril(b[:, None] * D * mm("KK", K, K.T), -1).astype(np.float32)
        Tm = np.eye(n, dtype=np.float32)
        for t in range(1, n):
            Tm[t, :t] = -A[t, :t] @ Tm[:t, :t]
        W = mm("W", Tm, (b * gamma)[:, None] * K)
        U = mm("Uv", Tm, b[:, None] * V) - mm("WS", W, S)
        P = np.tril(D * mm("QK", Q, K.T)).astype(np.float32)
        O[c0:c0 + n] = mm("QS", gamma[:, None] * Q, S) + mm("PU", P, U)
        Kd = np.exp(G[-1] - G).astype(np.float32)[:, None] * K
        S = (gamma[-1] * S + mm("KU", Kd.T, U)).astype(np.float32)
    return O, S


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--attribute", action="store_true", help="bf16 inputs for one product at a time")
    a = ap.parse_args()
    inp = make_inputs(np.random.default_rng(a.seed), a.tokens)
    O64, S64 = recurrence(inp, np.float64)

    def report(name, O, S):
        nrm = np.linalg.norm(O64, axis=1) + 1e-30
        e = np.linalg.norm(O - O64, axis=1) / nrm
        eb = np.linalg.norm(ROUNDINGS["bf16"](O) - O64, axis=1) / nrm
        es = np.linalg.norm(S - S64) / np.linalg.norm(S64)
        print(f"{name:36s} o: mean {e.mean():.2e} max {e.max():.2e} (o as bf16 {eb.mean():.2e}); state {es:.2e}")

    print(f"{a.tokens} tokens, mean g {inp[4].mean():.4f}; relative errors against the float64 recurrence")
    report("recurrence, fp32", *recurrence(inp, np.float32))
    products = ["KK", "QK", "W", "Uv", "WS", "QS", "PU", "KU"]
    if a.attribute:
        for p in products:
            report(f"chunked, bf16 {p} only", *chunked(inp, {p: "bf16"}))
        return
    report("chunked, fp32", *chunked(inp, {}))
    for r in ["tf32", "bf16"]:
        report(f"chunked, {r} everywhere", *chunked(inp, {p: r for p in products}))
        report(f"chunked, {r} except the state products", *chunked(inp, {p: r for p in products[:4] + ["PU"]}))


if __name__ == "__main__":
    main()
