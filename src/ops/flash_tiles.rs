//! Tile shapes of the attention forward per head-dim tile, dtype and arch. The kernel receives
//! them as `FS_BLOCK_M`, `FS_BLOCK_N`, `FS_NWARPS`; `smem_bytes` is its dynamic shared memory.

/// Head-dim tiles with their own variants; other head dims pad up to the next one.
pub const HEAD_DIM_TILES: &[i64] = &[32, 64, 96, 128, 192, 256];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashTile {
    pub block_m: u32,
    pub block_n: u32,
    pub warps: u32,
    pub smem_bytes: u32,
}

/// PLACEHOLDER until the kernel's table lands.
pub fn flash_fwd_tile(head_dim: u32, _dtype_code: u32, _arch: u32) -> FlashTile {
    let (block_m, block_n, warps) = match head_dim {
        0..=64 => (128, 64, 4),
        65..=128 => (128, 64, 4),
        _ => (64, 64, 4),
    };
    // Q tile + double-buffered K and V tiles, 2 bytes per element.
    let smem_bytes = (block_m + 4 * block_n) * head_dim * 2;
    FlashTile {
        block_m,
        block_n,
        warps,
        smem_bytes,
    }
}
