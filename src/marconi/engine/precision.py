"""Float64-preserving scans for transformers' pure-PyTorch SSM fallbacks, which cast to float32:
:func:`float64_scans` swaps in copies computing in the input's dtype for float64 inputs only (bitwise
upstream otherwise), within a ``with`` block, reference-counted and thread-safe. Nothing in
site-packages is edited. Why: docs/engine.md ("Float64 scans")."""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

__all__ = [
    "PATCHED_MODULES",
    "chunk_gated_delta_rule",
    "chunk_scan",
    "float64_scans",
    "recurrent_gated_delta_rule",
    "selective_state_update",
]

# model_type -> modeling module holding the functions we swap.
PATCHED_MODULES: dict[str, str] = {
    "bamba": "transformers.models.bamba.modeling_bamba",
    "nemotron_h": "transformers.models.nemotron_h.modeling_nemotron_h",
    "falcon_h1": "transformers.models.falcon_h1.modeling_falcon_h1",
    "zamba2": "transformers.models.zamba2.modeling_zamba2",
    "granitemoehybrid": "transformers.models.granitemoehybrid.modeling_granitemoehybrid",
    "qwen3_next": "transformers.models.qwen3_next.modeling_qwen3_next",
    "olmo_hybrid": "transformers.models.olmo_hybrid.modeling_olmo_hybrid",
}


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float64 stays float64; everything else computes in float32 as upstream does."""
    return torch.promote_types(x.dtype, torch.float32)


# ============================================================================ Mamba-2 (SSD)
def _pad_seq(x: torch.Tensor, pad_size: int) -> torch.Tensor:
    """Pad dim 1 (sequence) of a 3-D or 4-D tensor with zeros at the end."""
    pad_shape = (0, 0, 0, 0, 0, pad_size, 0, 0) if x.dim() == 4 else (0, 0, 0, pad_size, 0, 0)
    return F.pad(x, pad_shape, mode="constant", value=0)


def _into_chunks(x: torch.Tensor, pad_size: int, chunk_size: int) -> torch.Tensor:
    """[b, L, ...] -> [b, L/chunk, chunk, ...] after padding L to a multiple of ``chunk_size``."""
    x = _pad_seq(x, pad_size)
    return x.reshape(x.shape[0], -1, chunk_size, *x.shape[2:])


def _segment_sum(x: torch.Tensor) -> torch.Tensor:
    """[..., T] -> [..., T, T]: out[..., i, j] = sum(x[..., j+1 : i+1]) for j <= i, else -inf."""
    t = x.size(-1)
    x = x[..., None].expand(*x.size(), t)
    mask = torch.tril(torch.ones(t, t, device=x.device, dtype=torch.bool), diagonal=-1)
    x = x.masked_fill(~mask, 0)
    segsum = torch.cumsum(x, dim=-2)
    mask = torch.tril(torch.ones(t, t, device=x.device, dtype=torch.bool), diagonal=0)
    return segsum.masked_fill(~mask, -torch.inf)


def _chunk_scan(hidden_states, dt, A, B, C, chunk_size, D=None, dt_bias=None, initial_states=None,
                dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False, *,
                compute_dtype: torch.dtype):
    """transformers' ``mamba2_chunk_scan`` in ``compute_dtype``. Shapes: hidden_states [b, L, h, p];
    dt [b, L, h]; A [h]; B, C [b, L, g, n]; states [b, h, p, n]."""
    batch_size, sequence_length, num_heads, head_dim = hidden_states.shape
    num_groups = B.shape[2]
    cd = compute_dtype

    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = torch.clamp(dt, min=dt_limit[0], max=dt_limit[1])

    hidden_states = hidden_states.to(cd)
    B = B.to(cd).repeat_interleave(num_heads // num_groups, dim=2, output_size=num_heads)
    C = C.to(cd).repeat_interleave(num_heads // num_groups, dim=2, output_size=num_heads)

    pad_size = (chunk_size - sequence_length % chunk_size) % chunk_size
    D_residual = None
    if D is not None:
        D_residual = D[..., None] * _pad_seq(hidden_states, pad_size)

    # Discretize x and A
    hidden_states = hidden_states * dt[..., None].to(cd)
    A = A.to(hidden_states.dtype) * dt.to(cd)

    # (b, c, l, h, p) and (b, c, l, h, n): c = chunk index, l = position within the chunk
    hidden_states, A, B, C = [_into_chunks(t, pad_size, chunk_size) for t in (hidden_states, A, B, C)]
    A = A.permute(0, 3, 1, 2)
    A_cumsum = torch.cumsum(A, dim=-1)

    # 1. intra-chunk (diagonal blocks)
    L = torch.exp(_segment_sum(A))
    G = torch.einsum("bclhn,bcshn->bclsh", C, B)
    M = G * L.permute(0, 2, 3, 4, 1)
    Y_diag = torch.einsum("bclsh,bcshp->bclhp", M, hidden_states)

    # 2. state at the end of each chunk, from that chunk's inputs only
    decay_states = torch.exp(A_cumsum[:, :, :, -1:] - A_cumsum)
    B_decay = B * decay_states.permute(0, -2, -1, 1)[..., None]
    states = torch.einsum("bclhn,bclhp->bchpn", B_decay, hidden_states)

    # 3. inter-chunk recurrence: the state at every chunk boundary
    previous_states = (initial_states[:, None].to(dtype=states.dtype, device=states.device)
                       if initial_states is not None else torch.zeros_like(states[:, :1]))
    states = torch.cat([previous_states, states], dim=1)
    decay_chunk = torch.exp(_segment_sum(F.pad(A_cumsum[:, :, :, -1], (1, 0)))).transpose(1, 3)
    new_states = torch.einsum("bzch,bzhpn->bchpn", decay_chunk, states)
    states, final_state = new_states[:, :-1], new_states[:, -1]

    # 4. state -> output per chunk (off-diagonal blocks)
    state_decay_out = torch.exp(A_cumsum)
    C_times_states = torch.einsum("bclhn,bchpn->bclhp", C, states)
    Y_off = C_times_states * state_decay_out.permute(0, 2, 3, 1)[..., None]

    output = (Y_diag + Y_off).contiguous()
    output = output.reshape(batch_size, -1, num_heads, head_dim)
    if D_residual is not None:
        output = output + D_residual
    if pad_size > 0:
        output = output[:, :sequence_length]
    if return_final_states:
        return output, final_state
    return output


def _selective_state_update(state, hidden_states, dt, A, B, C, D=None, dt_bias=None, dt_softplus=False,
                            z=None, *, compute_dtype: torch.dtype):
    """transformers' ``mamba2_selective_state_update`` (one decode step, ``state`` updated in place).
    Shapes: state [b, h, p, n]; hidden_states [b, h, p]; dt [b, h, p]; A [h, p, n]; B, C [b, g, n]."""
    batch_size, num_heads, head_dim = hidden_states.shape
    num_groups = B.shape[1]
    state_size = B.shape[-1]
    cd = compute_dtype

    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = dt[..., None]

    dA = torch.exp(dt.to(cd) * A.to(cd)).to(device=state.device)
    B = B.reshape(batch_size, num_groups, 1, state_size)
    B = B.expand(batch_size, num_groups, num_heads // num_groups, state_size).contiguous()
    B = B.reshape(batch_size, num_heads, 1, state_size)
    dB = dt * B
    dBx = (dB * hidden_states[..., None]).to(device=state.device)

    ssm_states = state * dA + dBx
    state.copy_(ssm_states.to(state.dtype))

    C = C.reshape(batch_size, num_groups, 1, state_size)
    C = C.expand(batch_size, num_groups, num_heads // num_groups, state_size).contiguous()
    C = C.reshape(batch_size, num_heads, state_size)
    ssm_states = ssm_states.to(device=C.device, dtype=C.dtype)
    out = torch.bmm(ssm_states.view(batch_size * num_heads, head_dim, state_size),
                    C.view(batch_size * num_heads, state_size, 1))
    out = out.view(batch_size, num_heads, head_dim)
    if D is not None:
        out = (out + hidden_states * D).to(out.dtype)
    if z is not None:
        out = out * F.silu(z)
    return out.to(hidden_states.dtype)


# ============================================================================ gated DeltaNet
def _l2norm(x: torch.Tensor, dim: int = -1, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=dim, keepdim=True) + eps)


def _delta_inputs(query, key, value, beta, decay, num_k_heads: int, num_v_heads: int, use_qk_l2norm: bool,
                  compute_dtype: torch.dtype):
    """Both gated-delta-rule scans' first steps as upstream: GQA key repeat, heads before time, optional L2
    norm."""
    if num_k_heads != num_v_heads:
        query = query.repeat_interleave(num_v_heads // num_k_heads, dim=2)
        key = key.repeat_interleave(num_v_heads // num_k_heads, dim=2)
    query, key, value, beta, decay = [x.transpose(1, 2).to(compute_dtype, memory_format=torch.contiguous_format)
                                      for x in (query, key, value, beta, decay)]
    if use_qk_l2norm:
        query = _l2norm(query, dim=-1, eps=1e-6)
        key = _l2norm(key, dim=-1, eps=1e-6)
    return query, key, value, beta, decay


def _chunk_gated_delta_rule(query, key, value, g, beta, chunk_size=64, initial_state=None,
                            output_final_state=False, use_qk_l2norm_in_kernel=False, *,
                            compute_dtype: torch.dtype):
    """transformers' ``torch_chunk_gated_delta_rule`` in ``compute_dtype``. Shapes: query, key
    [b, L, hk, dk]; value [b, L, hv, dv]; g, beta [b, L, hv]; state [b, hv, dk, dv]."""
    initial_dtype = query.dtype
    batch_size, sequence_length, num_k_heads, k_head_dim = key.shape
    num_v_heads, v_head_dim = value.shape[-2:]
    recurrent_state_shape = (batch_size, num_v_heads, k_head_dim, v_head_dim)
    padded_output_shape = (batch_size, num_v_heads, -1, v_head_dim)
    decay = g

    query, key, value, beta, decay = _delta_inputs(query, key, value, beta, decay, num_k_heads, num_v_heads,
                                                   use_qk_l2norm_in_kernel, compute_dtype)
    query = query * query.shape[-1] ** -0.5

    pad_size = (chunk_size - sequence_length % chunk_size) % chunk_size
    query, key, value = (F.pad(x, (0, 0, 0, pad_size)) for x in (query, key, value))
    beta, decay = (F.pad(x, (0, pad_size)) for x in (beta, decay))
    num_chunks = (sequence_length + pad_size) // chunk_size

    v_beta = value * beta.unsqueeze(-1)
    k_beta = key * beta.unsqueeze(-1)
    query, key, k_beta, v_beta = [x.reshape(x.shape[0], x.shape[1], -1, chunk_size, x.shape[-1])
                                  for x in (query, key, k_beta, v_beta)]
    decay = decay.reshape(decay.shape[0], decay.shape[1], -1, chunk_size)
    strictly_upper_mask = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=query.device).triu(1)
    cum_decay = decay.cumsum(dim=3)

    pairwise_decay = cum_decay.unsqueeze(4) - cum_decay.unsqueeze(3)
    pairwise_decay = pairwise_decay.masked_fill(strictly_upper_mask, float("-inf")).exp()
    ut_system = (k_beta @ key.transpose(-1, -2)) * pairwise_decay
    intra_chunk_attn = (query @ key.transpose(-1, -2)) * pairwise_decay
    decayed_k_beta = k_beta * cum_decay.exp().unsqueeze(-1)
    new_values = torch.linalg.solve_triangular(ut_system, v_beta, upper=False, unitriangular=True)
    k_cumdecay = torch.linalg.solve_triangular(ut_system, decayed_k_beta, upper=False, unitriangular=True)

    if initial_state is None:
        last_recurrent_state = torch.zeros(recurrent_state_shape, dtype=new_values.dtype, device=new_values.device)
    else:
        last_recurrent_state = initial_state.to(new_values)
    core_attn_out = torch.zeros_like(new_values)

    query = query * cum_decay.exp().unsqueeze(-1)
    key = key * (cum_decay[..., -1:] - cum_decay).exp().unsqueeze(-1)
    chunk_decay = cum_decay[..., -1].exp()[..., None, None]
    for i in range(num_chunks):
        v_new = new_values[:, :, i] - k_cumdecay[:, :, i] @ last_recurrent_state
        inter_chunk_attn = query[:, :, i] @ last_recurrent_state
        core_attn_out[:, :, i] = inter_chunk_attn + intra_chunk_attn[:, :, i] @ v_new
        last_recurrent_state = last_recurrent_state * chunk_decay[:, :, i] + key[:, :, i].transpose(-1, -2) @ v_new

    last_recurrent_state = None if not output_final_state else last_recurrent_state
    core_attn_out = core_attn_out.reshape(padded_output_shape)[:, :, :sequence_length]
    core_attn_out = core_attn_out.transpose(1, 2).to(initial_dtype, memory_format=torch.contiguous_format)
    return core_attn_out, last_recurrent_state


def _recurrent_gated_delta_rule(query, key, value, g, beta, initial_state=None, output_final_state=False,
                                use_qk_l2norm_in_kernel=False, *, compute_dtype: torch.dtype):
    """transformers' ``torch_recurrent_gated_delta_rule`` (token by token) in ``compute_dtype``."""
    initial_dtype = query.dtype
    batch_size, sequence_length, num_k_heads, k_head_dim = key.shape
    num_v_heads, v_head_dim = value.shape[-2:]
    decay = g

    query, key, value, beta, decay = _delta_inputs(query, key, value, beta, decay, num_k_heads, num_v_heads,
                                                   use_qk_l2norm_in_kernel, compute_dtype)
    query = query / (query.shape[-1] ** 0.5)

    if initial_state is None:
        last_recurrent_state = torch.zeros((batch_size, num_v_heads, k_head_dim, v_head_dim),
                                           dtype=value.dtype, device=value.device)
    else:
        last_recurrent_state = initial_state.to(value)
    core_attn_out = torch.zeros_like(value)
    for i in range(sequence_length):
        q_t, k_t, v_t = query[:, :, i], key[:, :, i], value[:, :, i]
        last_recurrent_state = last_recurrent_state * decay[:, :, i].exp()[..., None, None]
        beta_t = beta[:, :, i].unsqueeze(-1)
        kv_mem = (last_recurrent_state * k_t.unsqueeze(-1)).sum(dim=-2)
        delta = (v_t - kv_mem) * beta_t
        last_recurrent_state = last_recurrent_state + k_t.unsqueeze(-1) * delta.unsqueeze(-2)
        core_attn_out[:, :, i] = (last_recurrent_state * q_t.unsqueeze(-1)).sum(dim=-2)

    last_recurrent_state = None if not output_final_state else last_recurrent_state
    core_attn_out = core_attn_out.transpose(1, 2).contiguous().to(initial_dtype)
    return core_attn_out, last_recurrent_state


# ============================================================================ dispatch + swap
def _dispatch(original: Callable, copy: Callable, first_tensor_arg: str, position: int) -> Callable:
    """float64 input -> our float64 copy; anything else -> the untouched upstream function."""

    params = frozenset(copy.__code__.co_varnames[:copy.__code__.co_argcount])

    def patched(*args, **kwargs):
        x = args[position] if len(args) > position else kwargs[first_tensor_arg]
        if x.dtype != torch.float64:
            return original(*args, **kwargs)
        # like upstream's wrapper, drop keyword arguments the implementation does not take (z=None ...)
        kwargs = {k: v for k, v in kwargs.items() if k in params}
        return copy(*args, **kwargs, compute_dtype=torch.float64)

    patched.__wrapped__ = original  # type: ignore[attr-defined]
    patched.__name__ = getattr(original, "__name__", "patched")
    return patched


# (module attribute, our copy, name of its first tensor argument, its position)
_SWAPS = {
    "mamba2_chunk_scan": (_chunk_scan, "hidden_states", 0),
    "mamba2_selective_state_update": (_selective_state_update, "hidden_states", 1),
    "torch_chunk_gated_delta_rule": (_chunk_gated_delta_rule, "query", 0),
    "torch_recurrent_gated_delta_rule": (_recurrent_gated_delta_rule, "query", 0),
}

# Public handles to the copies (tests compare them bitwise with upstream in float32).
chunk_scan = _chunk_scan
selective_state_update = _selective_state_update
chunk_gated_delta_rule = _chunk_gated_delta_rule
recurrent_gated_delta_rule = _recurrent_gated_delta_rule


# modeling module name -> (blocks inside float64_scans, the upstream functions it replaced)
_ACTIVE: dict[str, tuple[int, dict[str, Callable]]] = {}
_ACTIVE_LOCK = threading.Lock()


def _install(module: object) -> dict[str, Callable]:
    saved: dict[str, Callable] = {}
    for attr, (copy, arg, pos) in _SWAPS.items():
        original = getattr(module, attr, None)
        if original is None:
            continue
        saved[attr] = original
        setattr(module, attr, _dispatch(original, copy, arg, pos))
    return saved


@contextlib.contextmanager
def float64_scans(model_type: str) -> Iterator[None]:
    """Within the block, float64 scans of ``model_type``'s mixers stay float64; a no-op without a patched
    module (LFM2). Re-entrant and thread-safe: the swap stays while any block in any thread is inside."""
    module_name = PATCHED_MODULES.get(model_type)
    if module_name is None:
        yield
        return
    module = importlib.import_module(module_name)
    with _ACTIVE_LOCK:
        count, saved = _ACTIVE.get(module_name, (0, {}))
        if count == 0:
            saved = _install(module)
        _ACTIVE[module_name] = (count + 1, saved)
    try:
        yield
    finally:
        with _ACTIVE_LOCK:
            count, saved = _ACTIVE.pop(module_name)
            if count > 1:
                _ACTIVE[module_name] = (count - 1, saved)
            else:
                for attr, original in saved.items():
                    setattr(module, attr, original)
