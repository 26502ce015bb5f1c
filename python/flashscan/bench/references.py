"""Torch references of the operations under test: float64 for the correctness guards, float32 as
the "plain torch" peers. Written for clarity, not speed (the scan is sequential over time)."""

from __future__ import annotations

import math
from typing import Any


def _bc_time_major(torch: Any, m: Any, dim: int, acc: Any) -> Any:
    """B or C -> broadcastable against (seqlen, batch, dim, dstate)."""
    if m.dim() == 2:  # (dim, dstate), fixed over time
        return m.to(acc)[None, None]
    if m.dim() == 3:  # (batch, dstate, seqlen)
        return m.to(acc).permute(2, 0, 1)[:, :, None, :]
    g = m.shape[1]  # (batch, ngroups, dstate, seqlen): channel c uses group c // (dim // g)
    return m.to(acc).repeat_interleave(dim // g, dim=1).permute(3, 0, 1, 2)


def torch_selective_scan(
    torch: Any,
    u: Any,
    delta: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any = None,
    z: Any = None,
    delta_bias: Any = None,
    delta_softplus: bool = False,
    initial_state: Any = None,
    acc: Any = None,
) -> tuple[Any, Any]:
    """mamba_ssm's selective scan in plain torch, sequential over time (one addcmul per step,
    everything else vectorised). Returns (out (batch, dim, seqlen) in `acc`, last state)."""
    acc = torch.float32 if acc is None else acc
    F = torch.nn.functional
    batch, dim, seqlen = u.shape
    uf = u.to(acc)
    dt = delta.to(acc)
    if delta_bias is not None:
        dt = dt + delta_bias.to(acc)[:, None]
    if delta_softplus:
        dt = F.softplus(dt)
    dt_t = dt.permute(2, 0, 1)[..., None]  # (seqlen, batch, dim, 1)
    d_a = torch.exp(dt_t * A.to(acc))  # (seqlen, batch, dim, dstate)
    d_bu = (dt_t * uf.permute(2, 0, 1)[..., None]) * _bc_time_major(torch, B, dim, acc)
    d_bu = d_bu.expand_as(d_a).contiguous()
    if initial_state is not None:
        prev = initial_state.to(acc)
    else:
        prev = torch.zeros(d_a.shape[1:], dtype=acc, device=u.device)
    if torch.is_grad_enabled() and (d_a.requires_grad or d_bu.requires_grad):
        # autograd (the training guard's gradients): out= does not differentiate
        steps = []
        for t in range(seqlen):
            prev = torch.addcmul(d_bu[t], d_a[t], prev)
            steps.append(prev)
        xs = torch.stack(steps)
    else:
        xs = torch.empty_like(d_a)
        for t in range(seqlen):
            torch.addcmul(d_bu[t], d_a[t], prev, out=xs[t])
            prev = xs[t]
    y = (xs * _bc_time_major(torch, C, dim, acc)).sum(-1).permute(1, 2, 0)  # (batch, dim, L)
    if D is not None:
        y = y + D.to(acc)[:, None] * uf
    if z is not None:
        y = y * F.silu(z.to(acc))
    return y, prev


def torch_state_update(
    torch: Any,
    state: Any,
    x: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any = None,
    z: Any = None,
    dt_bias: Any = None,
    dt_softplus: bool = False,
    acc: Any = None,
    inplace: bool = False,
) -> tuple[Any, Any]:
    """mamba_ssm's selective_state_update for state (batch, dim, dstate), B, C
    (batch, dstate), in plain torch. Returns (out in `acc`, new state); with inplace=True the
    new state is also copied into `state`."""
    acc = torch.float32 if acc is None else acc
    F = torch.nn.functional
    xf = x.to(acc)
    dtf = dt.to(acc)
    if dt_bias is not None:
        dtf = dtf + dt_bias.to(acc)
    if dt_softplus:
        dtf = F.softplus(dtf)
    d_a = torch.exp(dtf[..., None] * A.to(acc))  # (batch, dim, dstate)
    d_bx = (dtf * xf)[..., None] * B.to(acc)[:, None, :]
    new = state.to(acc) * d_a + d_bx
    out = (new * C.to(acc)[:, None, :]).sum(-1)
    if D is not None:
        out = out + D.to(acc) * xf
    if z is not None:
        out = out * F.silu(z.to(acc))
    if inplace:
        state.copy_(new)
    return out, new


def attention_rows_reference(
    torch: Any, q: Any, k: Any, v: Any, causal: bool, bidx: list[int], rows: Any
) -> Any:
    """float64 attention output at query rows `rows` of batches `bidx`: (nb, nrows, h, d).
    Causal masks are aligned bottom-right (flash-attn >= 2.1)."""
    qs = q[bidx][:, rows].double()
    ks = k[bidx].double()
    vs = v[bidx].double()
    h, hk, d = q.shape[2], k.shape[2], q.shape[3]
    if hk != h:
        ks = ks.repeat_interleave(h // hk, dim=2)
        vs = vs.repeat_interleave(h // hk, dim=2)
    scores = torch.einsum("brhd,bshd->bhrs", qs, ks) * (1.0 / math.sqrt(d))
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        cols = torch.arange(sk, device=scores.device)
        mask = cols[None, :] > (rows.to(scores.device)[:, None] + (sk - sq))
        scores = scores.masked_fill(mask, float("-inf"))
    p = torch.softmax(scores, dim=-1)
    return torch.einsum("bhrs,bshd->brhd", p, vs)


def attention_grads_reference(
    torch: Any,
    q: Any,
    k: Any,
    v: Any,
    dout: Any,
    causal: bool,
    bidx: list[int],
    hidx: list[int],
    block: int = 1024,
) -> tuple[Any, Any, Any, Any]:
    """float64 (out, dq, dk, dv) of attention for the (batch, head) pairs bidx x hidx, each
    (len(bidx), seqlen, len(hidx), headdim). Heads of one batch are independent, so the subset
    is exact; query rows go `block` at a time, so memory is block x seqlen_k per pair, and a
    long sequence still gets its float64 reference. Causal aligned bottom-right."""
    if q.shape[2] != k.shape[2]:  # dk, dv of a shared head would sum over unselected heads
        raise ValueError("attention_grads_reference: nheads == nheads_k only")
    qs = q[bidx][:, :, hidx].double().permute(0, 2, 1, 3)  # (nb, nh, sq, d)
    ks = k[bidx][:, :, hidx].double().permute(0, 2, 1, 3)
    vs = v[bidx][:, :, hidx].double().permute(0, 2, 1, 3)
    dos = dout[bidx][:, :, hidx].double().permute(0, 2, 1, 3)
    sq, sk, d = qs.shape[2], ks.shape[2], qs.shape[3]
    scale = 1.0 / math.sqrt(d)
    out, dq = torch.empty_like(qs), torch.empty_like(qs)
    dk, dv = torch.zeros_like(ks), torch.zeros_like(vs)
    cols = torch.arange(sk, device=q.device)
    for r0 in range(0, sq, block):
        r1 = min(sq, r0 + block)
        s = torch.einsum("bhrd,bhsd->bhrs", qs[:, :, r0:r1], ks) * scale
        if causal:
            rows = torch.arange(r0, r1, device=q.device)
            s = s.masked_fill(cols[None, :] > rows[:, None] + (sk - sq), float("-inf"))
        p = torch.softmax(s, dim=-1)
        del s
        p = torch.nan_to_num(p)  # a fully masked row (seqlen_q > seqlen_k) has no keys
        o = torch.einsum("bhrs,bhsd->bhrd", p, vs)
        do = dos[:, :, r0:r1]
        dv += torch.einsum("bhrs,bhrd->bhsd", p, do)
        dp = torch.einsum("bhrd,bhsd->bhrs", do, vs)
        ds = p * (dp - (do * o).sum(-1, keepdim=True))
        del dp, p
        dq[:, :, r0:r1] = torch.einsum("bhrs,bhsd->bhrd", ds, ks) * scale
        dk += torch.einsum("bhrs,bhrd->bhsd", ds, qs[:, :, r0:r1]) * scale
        out[:, :, r0:r1] = o

    def back(t: Any) -> Any:
        return t.permute(0, 2, 1, 3)

    return back(out), back(dq), back(dk), back(dv)
