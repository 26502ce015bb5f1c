"""Small shapes of every kernel variant, for compute-sanitizer (memcheck, racecheck):
`compute-sanitizer --tool memcheck python3 tools/sanitize_cases.py [attention scan backward decode
conv]` (default: every group). Exits non-zero on a wrong result too, so a silent race that
corrupts output is caught as well."""

from __future__ import annotations

import itertools
import os
import sys

import torch

import flashscan


def attention_cases() -> int:
    bad = 0
    dtypes = [torch.float16, torch.bfloat16, torch.float32]
    for hd, dtype in itertools.product([32, 40, 64, 96, 128, 192, 256], dtypes):
        for causal, window, softcap in [
            (False, (-1, -1), 0.0),
            (True, (-1, -1), 0.0),
            (False, (9, 3), 5.0),
        ]:
            q = torch.randn(1, 65, 2, hd, device="cuda", dtype=dtype)
            k = torch.randn(1, 33, 1, hd, device="cuda", dtype=dtype)
            v = torch.randn_like(k)
            out = flashscan.flash_attn_func(
                q, k, v, causal=causal, window_size=window, softcap=softcap
            )
            ref = flashscan.reference.flash_attn_func(
                q.float().cpu().numpy(),
                k.float().cpu().numpy(),
                v.float().cpu().numpy(),
                causal=causal,
                window_size=window,
                softcap=softcap,
            )
            err = (out.float().cpu() - torch.from_numpy(ref)).abs().max().item()
            if not err < 0.05:
                print(f"attention hd={hd} {dtype} causal={causal} window={window}: err {err}")
                bad += 1
    return bad


def scan_cases() -> int:
    bad = 0
    for dtype, dstate, varying, (b, d, L) in itertools.product(
        [torch.float32, torch.bfloat16],
        [1, 16, 64],
        [False, True],
        # L <= 64 at dstate 16 takes the short-sequence tiles: 16 / 8 / 4 lanes a channel;
        # (2, 24, 67) the small-grid tiles, (8, 1024, 130) the default ones (both 32-bit at 16)
        [(2, 24, 67), (2, 24, 33), (1, 4100, 60), (2, 8200, 17), (8, 1024, 130)],
    ):
        u = torch.randn(b, d, L, device="cuda", dtype=dtype)
        delta = torch.rand(b, d, L, device="cuda", dtype=dtype)
        A = -torch.rand(d, dstate, device="cuda")
        if varying:
            B = torch.randn(b, 2, dstate, L, device="cuda", dtype=dtype)
        else:
            B = torch.randn(d, dstate, device="cuda")
        C = torch.randn_like(B)
        D = torch.randn(d, device="cuda")
        z = torch.randn_like(u)
        out, last = flashscan.selective_scan_fn(
            u, delta, A, B, C, D=D, z=z, delta_softplus=True, return_last_state=True
        )
        ref, ref_last = flashscan.reference.selective_scan_fn(
            *(t.float().cpu().numpy() for t in (u, delta, A, B, C)),
            D=D.cpu().numpy(),
            z=z.float().cpu().numpy(),
            delta_softplus=True,
            return_last_state=True,
        )
        err = (out.float().cpu() - torch.from_numpy(ref).float()).abs().max().item()
        scale = max(1.0, float(abs(ref).max()))
        if not err / scale < 0.05:
            print(f"scan {dtype} dstate={dstate} varying={varying}: err {err}")
            bad += 1
        state = torch.randn(b, d, dstate, device="cuda")
        x = torch.randn(b, d, device="cuda", dtype=dtype)
        dt = torch.rand(b, d, device="cuda", dtype=dtype)
        Bs, Cs = (
            torch.randn(b, dstate, device="cuda", dtype=dtype),
            torch.randn(b, dstate, device="cuda", dtype=dtype),
        )
        flashscan.selective_state_update(state, x, dt, A, Bs, Cs, D=D, z=x, dt_softplus=True)
    return bad


def backward_cases() -> int:
    """Small backward calls (attention incl. deterministic mode; the scan with and without
    saved states), checked against the NumPy reference backward."""
    import flashscan.torch as fst

    bad = 0
    for hd, dtype, causal, det in [
        (64, torch.bfloat16, True, False),
        (72, torch.float16, False, True),
        (40, torch.float32, False, False),
        (256, torch.bfloat16, True, True),
    ]:
        q = torch.randn(1, 70, 4, hd, device="cuda", dtype=dtype, requires_grad=True)
        k = torch.randn(1, 45, 2, hd, device="cuda", dtype=dtype, requires_grad=True)
        v = torch.randn(1, 45, 2, hd, device="cuda", dtype=dtype, requires_grad=True)
        dout = torch.randn_like(q)
        out, lse = fst.flash_attn_func(q, k, v, causal=causal, return_lse=True, deterministic=det)
        got = torch.autograd.grad(out, (q, k, v), dout)
        host = [t.detach().float().cpu().numpy() for t in (dout, q, k, v, out, lse)]
        ref = flashscan.reference_bwd.flash_attn_bwd(*host, causal=causal)
        for g, r in zip(got, ref):
            err = (g.float().cpu() - torch.from_numpy(r)).abs().max().item()
            if not err < 0.05 * max(1.0, float(abs(r).max())):
                print(f"attention bwd hd={hd} {dtype} causal={causal} det={det}: err {err}")
                bad += 1
    # L 60 / 33 at dstate 16: the short-sequence forward plans and the 16-lane backward
    for dtype, L in [
        (torch.bfloat16, 300),
        (torch.float32, 67),
        (torch.bfloat16, 60),
        (torch.float16, 33),
    ]:
        b, d, n = 2, 24, 16
        args = [
            torch.randn(b, d, L, device="cuda", dtype=dtype),
            torch.rand(b, d, L, device="cuda", dtype=dtype),
            -torch.rand(d, n, device="cuda"),
            torch.randn(b, n, L, device="cuda", dtype=dtype),
            torch.randn(b, n, L, device="cuda", dtype=dtype),
            torch.randn(d, device="cuda"),
            torch.randn(b, d, L, device="cuda", dtype=dtype),
            torch.rand(d, device="cuda"),
        ]
        leaves = [t.requires_grad_() for t in args]
        y = fst.selective_scan_fn(*leaves, delta_softplus=True)
        dout = torch.randn_like(y)
        got = torch.autograd.grad(y, leaves, dout)
        host = [t.detach().float().cpu().numpy() for t in args]
        ref = flashscan.reference_bwd.selective_scan_bwd(
            dout.float().cpu().numpy(),
            *host[:5],
            D=host[5],
            z=host[6],
            delta_bias=host[7],
            delta_softplus=True,
        )
        for g, r in zip(got, ref):
            err = (g.float().cpu() - torch.from_numpy(r)).abs().max().item()
            if not err < 0.05 * max(1.0, float(abs(r).max())):
                print(f"scan bwd {dtype} L={L}: err {err}")
                bad += 1
    return bad


def varlen_cases() -> int:
    """Packed sequences (lengths 0, 1, odd, one past a tile), forward and backward, against the
    NumPy references; one call with out-of-range cu_seqlens values on the device, which the
    kernels must clamp (memcheck sees any out-of-bounds row)."""
    import flashscan.torch as fst

    bad = 0
    lens_q, lens_k = [65, 0, 1, 130, 7], [33, 5, 0, 129, 70]
    cq = torch.tensor([0, *itertools.accumulate(lens_q)], dtype=torch.int32, device="cuda")
    ck = torch.tensor([0, *itertools.accumulate(lens_k)], dtype=torch.int32, device="cuda")
    for hd, dtype, causal, window in [
        (64, torch.bfloat16, True, (-1, -1)),
        (128, torch.float16, False, (9, 3)),
        (40, torch.float32, True, (-1, -1)),
    ]:
        q = torch.randn(sum(lens_q), 4, hd, device="cuda", dtype=dtype, requires_grad=True)
        k = torch.randn(sum(lens_k), 2, hd, device="cuda", dtype=dtype, requires_grad=True)
        v = torch.randn(sum(lens_k), 2, hd, device="cuda", dtype=dtype, requires_grad=True)
        out, lse = fst.flash_attn_varlen_func(
            q, k, v, cq, ck, 130, 129, causal=causal, window_size=window, return_lse=True
        )
        dout = torch.randn_like(out)
        got = torch.autograd.grad(out, (q, k, v), dout)
        host = [t.detach().float().cpu().numpy() for t in (dout, q, k, v)]
        cu_h = (cq.cpu().numpy(), ck.cpu().numpy())
        ro = flashscan.reference_varlen.flash_attn_varlen_func(
            *host[1:], *cu_h, causal=causal, window_size=window
        )
        rg = flashscan.reference_varlen.flash_attn_varlen_bwd(
            host[0],
            *host[1:],
            out.detach().float().cpu().numpy(),
            lse.cpu().numpy(),
            *cu_h,
            causal=causal,
            window_size=window,
        )
        for name, g, r in zip(("out", "dq", "dk", "dv"), (out, *got), (ro, *rg)):
            err = (g.detach().float().cpu() - torch.from_numpy(r)).abs().max().item()
            if not err < 0.05 * max(1.0, float(abs(r).max())):
                print(f"varlen {name} hd={hd} {dtype} causal={causal}: err {err}")
                bad += 1
    # bad device values (not checked on the host): clamped, never out of bounds
    q = torch.randn(20, 2, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(10, 2, 64, device="cuda", dtype=torch.bfloat16)
    wild = torch.tensor([-5, 30, 7, 1 << 30], dtype=torch.int32, device="cuda")
    flashscan.flash_attn_varlen_func(q, k, k, wild, wild, 64, 64)
    torch.cuda.synchronize()
    return bad


def decode_cases() -> int:
    """The KV-cache core (`_native.kvcache_append` + `_native.flash_attn_kvcache`): every decode
    tile (16 / 64 rows) and head-dim tile, both dtypes, softcap, contiguous and paged caches, one
    and several splits (the combine), rotary in both layouts; a float32 torch reference."""
    import math

    from flashscan import _native

    names = {
        torch.float16: "float16",
        torch.bfloat16: "bfloat16",
        torch.float32: "float32",  # lse
        torch.int32: "int32",
    }

    def d(t):  # descriptor tuple
        if t is None:
            return None
        return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), names[t.dtype], 2, t.get_device())

    bad = 0
    st = torch.cuda.current_stream().cuda_stream
    cases = [
        # hd, dtype, seqlen_q, nheads, nheads_k, page, splits, softcap, interleaved
        (64, torch.bfloat16, 1, 8, 2, None, 1, 0.0, True),
        (80, torch.float16, 4, 8, 1, 16, 3, 0.0, False),
        (128, torch.bfloat16, 1, 4, 4, 64, 2, 20.0, True),
        (128, torch.float16, 13, 8, 2, None, 3, 0.0, False),
        (192, torch.bfloat16, 5, 16, 2, 16, 1, 5.0, True),
        (256, torch.float16, 1, 2, 1, 256, 4, 0.0, False),
        (256, torch.bfloat16, 9, 8, 4, None, 2, 30.0, True),
        (32, torch.float16, 2, 4, 2, 64, 5, 0.0, True),
    ]
    for hd, dtype, sq, h, hk, page, splits, cap_, il in cases:
        b, cap = 3, 300
        if page is None:
            kc = torch.randn(b, cap, hk, hd, device="cuda", dtype=dtype)
            table, capacity = None, cap
        else:
            nb = -(-cap // page)
            kc = torch.randn(b * nb + 2, page, hk, hd, device="cuda", dtype=dtype)
            table = torch.randperm(b * nb + 2, device="cuda")[: b * nb].reshape(b, nb).int()
            capacity = nb * page
        vc = torch.randn_like(kc)
        seqlens = torch.tensor([0, 1, 250], dtype=torch.int32, device="cuda")
        k_new = torch.randn(b, sq, hk, hd, device="cuda", dtype=dtype)
        v_new = torch.randn_like(k_new)
        q = torch.randn(b, sq, h, hd, device="cuda", dtype=dtype)
        rd = hd // 2 if il else hd
        ang = torch.rand(capacity + sq, rd // 2, device="cuda")
        cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
        q_rot = torch.empty_like(q)
        _native.kvcache_append(
            d(k_new),
            d(v_new),
            d(kc),
            d(vc),
            d(seqlens),
            None,
            None,
            d(table),
            d(cos),
            d(sin),
            il,
            d(q),
            d(q_rot),
            st,
        )
        seqlens_k = seqlens + sq
        out = torch.full_like(q, float("nan"))
        lse = torch.empty(b, h, sq, device="cuda")
        scale = 1.0 / math.sqrt(hd)
        _native.flash_attn_kvcache(
            d(q_rot),
            d(kc),
            d(vc),
            d(out),
            d(lse),
            d(seqlens),  # the keys after the append: seqlens + sq, added in the kernel
            None,
            None,
            d(table),
            scale,
            -1,
            0,
            cap_,
            splits,
            st,
            sq,
        )
        # reference: float32 over the logical cache
        if table is None:
            kl, vl = kc.float(), vc.float()
        else:
            kl = kc[table.long()].reshape(b, -1, hk, hd).float()
            vl = vc[table.long()].reshape(b, -1, hk, hd).float()
        kl = kl.repeat_interleave(h // hk, dim=2)
        vl = vl.repeat_interleave(h // hk, dim=2)
        s = torch.einsum("bqhd,bkhd->bhqk", q_rot.float(), kl) * scale
        if cap_ > 0:
            s = cap_ * torch.tanh(s / cap_)
        j = torch.arange(kl.shape[1], device="cuda")[None, None, :]
        qpos = seqlens_k.long()[:, None, None] - sq + torch.arange(sq, device="cuda")[None, :, None]
        vis = (j < seqlens_k.long()[:, None, None]) & (j <= qpos)
        s = s.masked_fill(~vis[:, None], float("-inf"))
        p = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)
        ref = torch.einsum("bhqk,bkhd->bqhd", p, vl)
        err = (out.float() - ref).abs().max().item()
        if not err < 0.05:
            print(f"decode hd={hd} {dtype} sq={sq} page={page} splits={splits}: err {err}")
            bad += 1
    return bad


def conv_cases() -> int:
    """The causal conv1d: forward / backward in both layouts (initial and final states, seq_idx)
    and the decode update (shift and ring), odd sizes, against the float64 reference."""
    import flashscan.torch as fst
    from flashscan import reference_conv as rc

    def h(t: torch.Tensor | None) -> object:
        return None if t is None else t.detach().double().cpu().numpy()

    bad = 0
    # d 70, L 1031: channel-last rows not 8 / 16-byte aligned (the synchronous path), channel-first
    # rows not 16-byte aligned; d 72, L 1032: cp.async rows, channel-first rows aligned; d 640,
    # L 60 (b 32, the real-time shape): channel-first rows sharing blocks, channel-last warps of 4
    # positions; d 1032 (16-bit, no seq_idx): a batch whose grid keeps the channel-last full walks
    # (src/ops/conv1d.rs `cl_rows`), so interior warps take the lean walks
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    # 9 lane groups, L 1032: more blocks than a wave at half the walks (16 / 32 positions a warp)
    full = max(sms * 4 // (9 * 17) + 1, sms * 3 // (9 * 9) + 1)
    # d 136, L 1024: channel-first rows of whole 2 x 16-byte slices (causal_conv1d_fwd_cf_fast);
    # states "none" (no initial states, so no dinitial_states) at d 640 / 136: the channel-last
    # short-walk backward (causal_conv1d_bwd_cl_short), which calls with dinitial_states leave
    shapes = {70: (2, 1031), 72: (2, 1032), 640: (32, 60), 1032: (full, 1032), 136: (2, 1024)}
    for dtype, width, layout, states, d in itertools.product(
        [torch.float32, torch.bfloat16], [2, 4], ["cf", "cl"], ["init", "seq", "none"], list(shapes)
    ):
        seq = states == "seq"
        if d == 1032 and (seq or dtype == torch.float32):
            continue
        if states == "none" and d not in (640, 136):
            continue
        b, L = shapes[d]
        x = torch.randn(b, L, d, device="cuda", dtype=dtype).transpose(1, 2)
        if layout == "cf":
            x = x.contiguous()
        x.requires_grad_()
        w = torch.randn(d, width, device="cuda", requires_grad=True)
        bias = torch.randn(d, device="cuda", requires_grad=True)
        init = None
        if states == "init":
            init = torch.randn(b, d, width - 1, device="cuda", dtype=dtype)
        sidx = None
        if seq:
            sidx = torch.zeros(b, L, device="cuda", dtype=torch.int32)
            sidx[:, 400:] = 1
        if init is not None:
            init.requires_grad_()
        out = fst.causal_conv1d_fn(x, w, bias, init, activation="silu", seq_idx=sidx)
        dout = torch.randn_like(out)
        out.backward(dout)
        ref = rc.causal_conv1d_fn(h(x), h(w), h(bias), h(init), activation="silu", seq_idx=h(sidx))
        dref = rc.causal_conv1d_bwd(h(dout), h(x), h(w), h(bias), h(init), None, "silu", h(sidx))
        # relative to the largest |out|: bf16 rounds an output of 16 by 0.06 (an absolute 0.05
        # bound failed on such draws, whatever the kernel)
        oscale = max(float(abs(ref).max()), 1.0)
        errs = [(out.double().cpu() - torch.from_numpy(ref)).abs().max().item() / oscale]
        for g, t in zip(dref, (x, w, bias, init)):
            if g is not None and t is not None and t.grad is not None:
                scale = max(float(abs(g).max()), 1.0)
                errs.append(
                    (t.grad.double().cpu() - torch.from_numpy(g)).abs().max().item() / scale
                )
        if not max(errs) < 0.05:
            print(f"conv {dtype} width={width} {layout} {states} d={d}: errs {errs}")
            bad += 1
    # one and two new inputs, shift and ring; conv_state (3, 130, 5), or the first 130 channels
    # of a (3, 136, 3) buffer
    for dtype, ring, padded, n in itertools.product(
        [torch.float16, torch.float32], [False, True], [False, True], [1, 2]
    ):
        x = torch.randn(3, 130, n, device="cuda", dtype=dtype)
        if padded:
            state = torch.randn(3, 136, 3, device="cuda", dtype=dtype)[:, :130]
        else:
            state = torch.randn(3, 130, 5, device="cuda", dtype=dtype)
        w = torch.randn(130, 4, device="cuda")
        lens = torch.tensor([0, 7, 3], device="cuda", dtype=torch.int32) if ring else None
        want, want_state = rc.causal_conv1d_update(h(x), h(state), h(w), None, "silu", h(lens))
        out = flashscan.causal_conv1d_update(x, state, w, activation="silu", cache_seqlens=lens)
        err = (out.double().cpu() - torch.from_numpy(want)).abs().max().item()
        err_s = (state.double().cpu() - torch.from_numpy(want_state)).abs().max().item()
        if not (err < 0.05 and err_s == 0):
            print(
                f"conv update {dtype} ring={ring} padded={padded} n={n}: "
                f"err {err}, state err {err_s}"
            )
            bad += 1
    return bad


def ssd_cases() -> int:
    """mamba_chunk_scan_combined forward and backward: every chunk size, each dtype, tail
    chunks, seq_idx, odd headdim / dstate (partial tiles); bf16 without z (the second backward
    path then runs no chunk_out2)."""
    bad = 0
    for dtype, chunk in itertools.product(
        [torch.float32, torch.bfloat16, torch.float16], [64, 128, 256]
    ):
        # dstate 24: one partial 32-state step (ssd_bwd_chunk_dx16's state term) and tile; 72 at
        # the longer chunks: three steps through both stages, the last partial
        b, L, h, p, g, n = 2, 2 * chunk + 37, 4, 40, 2, 24 if chunk == 64 else 72
        x = torch.randn(b, L, h, p, device="cuda", dtype=dtype)
        dt = torch.rand(b, L, h, device="cuda") - 1.5
        A = -torch.rand(h, device="cuda") - 0.2
        B = (torch.randn(b, L, g, n, device="cuda") * 0.5).to(dtype)
        C = (torch.randn(b, L, g, n, device="cuda") * 0.5).to(dtype)
        D = torch.randn(h, p, device="cuda")
        z = None if dtype == torch.bfloat16 else torch.randn_like(x)
        init = torch.randn(b, h, p, n, device="cuda")
        seq_idx = (torch.arange(L, device="cuda") >= chunk + 5).to(torch.int32)[None].repeat(b, 1)
        args = (x, dt, A, B, C, chunk)
        kw = dict(D=D, z=z, initial_states=init, seq_idx=seq_idx, dt_softplus=True)
        out, fin = flashscan.mamba_chunk_scan_combined(*args, **kw, return_final_states=True)
        host = [t.float().cpu().numpy() for t in args[:5]]
        tensors = {k: v for k, v in kw.items() if k != "dt_softplus" and v is not None}
        hkw = {
            k: (v.float() if v.is_floating_point() else v).cpu().numpy() for k, v in tensors.items()
        }
        ref, ref_fin = flashscan.reference_ssd.mamba_chunk_scan_combined(
            *host, chunk, **hkw, dt_softplus=True, return_final_states=True
        )
        checks = [("out", out, ref), ("final", fin, ref_fin)]
        # backward (the forward recomputed inside): every gradient, dout and dfinal given
        given = {"x": x, "dt": dt, "A": A, "B": B, "C": C, "D": D, "z": z, "initial_states": init}
        names = tuple(k for k, v in given.items() if v is not None)
        leaves = [given[k].detach().clone().requires_grad_(True) for k in names]
        lv = dict(zip(names, leaves))
        kw_g = {k: lv.get(k) for k in ("D", "z", "initial_states")}
        o, f = flashscan.mamba_chunk_scan_combined(
            lv["x"], lv["dt"], lv["A"], lv["B"], lv["C"], chunk, **kw_g, seq_idx=seq_idx,
            dt_softplus=True, return_final_states=True,
        )  # fmt: skip
        dout, dfin = torch.randn_like(o), torch.randn_like(f)
        grads = torch.autograd.grad((o, f), leaves, (dout, dfin))
        want_g = flashscan.reference_ssd.mamba_chunk_scan_combined_bwd(
            dout.float().cpu().numpy(), *host, chunk, D=hkw["D"], z=hkw.get("z"),
            initial_states=hkw["initial_states"], seq_idx=hkw["seq_idx"], dt_softplus=True,
            dfinal_states=dfin.cpu().numpy(),
        )  # fmt: skip
        want_g = [w for w in want_g if w is not None]  # no dt_bias given
        checks += [("d" + n, gv, w) for n, gv, w in zip(names, grads, want_g)]
        for name, got, want in checks:
            err = (got.float().cpu() - torch.from_numpy(want).float()).abs().max().item()
            if not err / max(1.0, float(abs(want).max())) < 0.05:
                print(f"ssd {dtype} chunk={chunk} {name}: err {err}")
                bad += 1
    return bad


def ssd_fwd2_cases() -> int:
    """The second SSD forward path (FLASHSCAN_SSD_FWD=2, cuda/ssd_fwd2.cu; 16-bit data): every
    chunk size, tail chunks, seq_idx, initial states, partial tiles on its cp.async path
    (headdim 40, dstate 24) and on its element path (headdim 33, dstate 20: rows not 16-byte
    aligned), and headdim 64 / dstate 200 (four C.H^T steps through both stages). With and without
    seq_idx: blocks below the diagonal of a call without it skip the mask; chunk 256 without seq_idx
    also without z, on sm_90a (bf16) through the warp-specialised chunk outputs
    (ssd2_chunk_scan_ws, and its pipelined form ssd2_chunk_scan_ws_pipe); without seq_idx on
    sm_90a, rows TMA can address (headdim 40 / 64), the chunk states through ssd2_chunk_state_pass
    (TMA boxes past the tile's ends, dstate 24's one-block B; bf16 with one group of four heads,
    fp16 with two groups)."""
    bad = 0
    os.environ["FLASHSCAN_SSD_FWD"] = "2"
    try:
        for dtype, chunk, (p, n), cut in itertools.product(
            [torch.bfloat16, torch.float16],
            [64, 128, 256],
            [(40, 24), (33, 20), (64, 200)],
            [True, False],
        ):
            b, L, h, g = 2, 2 * chunk + 37, 4, 1 if dtype == torch.bfloat16 else 2
            x = torch.randn(b, L, h, p, device="cuda", dtype=dtype)
            dt = torch.rand(b, L, h, device="cuda") - 1.5
            A = -torch.rand(h, device="cuda") - 0.2
            B = (torch.randn(b, L, g, n, device="cuda") * 0.5).to(dtype)
            C = (torch.randn(b, L, g, n, device="cuda") * 0.5).to(dtype)
            D = torch.randn(h, p, device="cuda")
            # chunk 256 without seq_idx and z: on sm_90a (bf16) the warp-specialised chunk
            # outputs (the default; FLASHSCAN_SSD_SCAN_WS=0 elsewhere, read on every call)
            ws = chunk == 256 and not cut
            z = None if ws else torch.randn_like(x)
            os.environ["FLASHSCAN_SSD_SCAN_WS"] = "1" if ws else "0"
            init = torch.randn(b, h, p, n, device="cuda")
            seq_idx = (torch.arange(L, device="cuda") >= chunk + 5).to(torch.int32)[None]
            seq_idx = seq_idx.repeat(b, 1)
            kw = dict(D=D, z=z, initial_states=init, seq_idx=seq_idx, dt_softplus=True)
            if not cut:
                del kw["seq_idx"]
            host = [t.float().cpu().numpy() for t in (x, dt, A, B, C)]
            hkw = {
                k: (v.float() if v.is_floating_point() else v).cpu().numpy()
                for k, v in kw.items()
                if k != "dt_softplus" and v is not None
            }
            ref, ref_fin = flashscan.reference_ssd.mamba_chunk_scan_combined(
                *host, chunk, **hkw, dt_softplus=True, return_final_states=True
            )
            # the warp-specialised chunk outputs in both forms (FLASHSCAN_SSD_SCAN_WS_PIPE)
            for pipe in ("0", "1") if ws else ("0",):
                os.environ["FLASHSCAN_SSD_SCAN_WS_PIPE"] = pipe
                out, fin = flashscan.mamba_chunk_scan_combined(
                    x, dt, A, B, C, chunk, **kw, return_final_states=True
                )
                for name, got, want in (("out", out, ref), ("final", fin, ref_fin)):
                    err = (got.float().cpu() - torch.from_numpy(want).float()).abs().max().item()
                    if not err / max(1.0, float(abs(want).max())) < 0.05:
                        where = f"{dtype} chunk={chunk} p={p} n={n} seq_idx={cut} pipe={pipe}"
                        print(f"ssd fwd2 {where} {name}: err {err}")
                        bad += 1
    finally:
        os.environ.pop("FLASHSCAN_SSD_FWD", None)
        os.environ.pop("FLASHSCAN_SSD_SCAN_WS", None)
        os.environ.pop("FLASHSCAN_SSD_SCAN_WS_PIPE", None)
    return bad


def ssd_bwd_pass_cases() -> int:
    """The 16-bit backward's L_c and reverse state passing in one kernel (ssd_bwd_dstate_pass,
    sm_90a: flashscan's 16-bit calls without z or seq_idx, the forward's H_c kept): every chunk
    size (bf16 at 64 and 256, fp16 at 128: twelve backward calls, few enough for the sanitizers'
    slowdown), initial and final states, TMA boxes past the tile's ends (headdim 40 / 136,
    dstate 24's one-box C and H_c, 200's two state tiles) and a last chunk of one step (visited
    first). Every gradient against float64. (The default since 2026-12-05; set here so that the
    group runs it whatever the environment says.)"""
    bad = 0
    os.environ["FLASHSCAN_SSD_BWD_STATE_PASS"] = "1"
    try:
        bad += _ssd_bwd_pass_cases()
    finally:
        os.environ.pop("FLASHSCAN_SSD_BWD_STATE_PASS", None)
    return bad


def _ssd_bwd_pass_cases() -> int:
    bad = 0
    for (dtype, chunk), (p, n), tail in itertools.product(
        [(torch.bfloat16, 64), (torch.float16, 128), (torch.bfloat16, 256)],
        [(40, 24), (136, 200)],
        [37, 5],
    ):
        b, L, h, g = 2, 2 * chunk + tail, 4, 2
        given = {
            "x": torch.randn(b, L, h, p, device="cuda", dtype=dtype),
            "dt": torch.rand(b, L, h, device="cuda") - 1.5,
            "A": -torch.rand(h, device="cuda") - 0.2,
            "B": (torch.randn(b, L, g, n, device="cuda") * 0.5).to(dtype),
            "C": (torch.randn(b, L, g, n, device="cuda") * 0.5).to(dtype),
            "D": torch.randn(h, p, device="cuda"),
            "initial_states": torch.randn(b, h, p, n, device="cuda"),
        }
        names = tuple(given)
        leaves = [v.detach().clone().requires_grad_(True) for v in given.values()]
        lv = dict(zip(names, leaves))
        o, f = flashscan.mamba_chunk_scan_combined(
            lv["x"], lv["dt"], lv["A"], lv["B"], lv["C"], chunk, D=lv["D"],
            initial_states=lv["initial_states"], dt_softplus=True, return_final_states=True,
        )  # fmt: skip
        dout, dfin = torch.randn_like(o), torch.randn_like(f)
        grads = torch.autograd.grad((o, f), leaves, (dout, dfin))
        host = {k: v.float().cpu().numpy() for k, v in given.items()}
        want_g = flashscan.reference_ssd.mamba_chunk_scan_combined_bwd(
            dout.float().cpu().numpy(), host["x"], host["dt"], host["A"], host["B"], host["C"],
            chunk, D=host["D"], initial_states=host["initial_states"], dt_softplus=True,
            dfinal_states=dfin.cpu().numpy(),
        )  # fmt: skip
        want_g = [w for w in want_g if w is not None]  # no z, no dt_bias given
        for name, got, want in zip(names, grads, want_g):
            err = (got.float().cpu() - torch.from_numpy(want).float()).abs().max().item()
            if not err / max(1.0, float(abs(want).max())) < 0.05:
                where = f"{dtype} chunk={chunk} p={p} n={n} L={L}"
                print(f"ssd bwd pass {where} d{name}: err {err}")
                bad += 1
    return bad


GROUPS = {
    "attention": attention_cases,
    "scan": scan_cases,
    "backward": backward_cases,
    "decode": decode_cases,
    "varlen": varlen_cases,
    "conv": conv_cases,
    "ssd": ssd_cases,
    "ssd_fwd2": ssd_fwd2_cases,
    "ssd_bwd_pass": ssd_bwd_pass_cases,
}

if __name__ == "__main__":
    # `sanitize_cases.py [GROUP ...]`: only those groups (default: all)
    assert flashscan.available(), flashscan.info()
    names = sys.argv[1:] or list(GROUPS)
    unknown = [g for g in names if g not in GROUPS]
    assert not unknown, f"unknown groups {unknown}; known: {list(GROUPS)}"
    n = sum(GROUPS[g]() for g in names)
    torch.cuda.synchronize()
    print("sanitize cases done, wrong results:", n)
    sys.exit(1 if n else 0)
