//! Tile shapes of the attention forward per head-dim tile, dtype and arch, as measured on the
//! H100 (2026-11-22; sm_80 and sm_86/89 rows are compile- and shared-memory-checked only).
//! The kernel receives them as `FS_BLOCK_M`, `FS_BLOCK_N`, `FS_NWARPS`, `FS_KV_STAGES`,
//! `FS_MIN_BLOCKS`, `FS_QK_UNROLL`; every row compiles with 0 spill bytes.

/// Head-dim tiles with their own variants; other head dims pad up to the next one.
pub const HEAD_DIM_TILES: &[i64] = &[32, 64, 96, 128, 192, 256];

/// Queries up to this long use the short 64-row tile (real-time shapes: less waste, more CTAs).
pub const SHORT_SEQLEN_Q: i64 = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashTile {
    pub block_m: u32,
    pub block_n: u32,
    pub warps: u32,
    /// K/V buffers: 2 = double-buffered; 1 = V(j) loads during QK^T, K(j+1) during P.V.
    pub stages: u32,
    /// `__launch_bounds__` min blocks per SM.
    pub min_blocks: u32,
    /// Unroll of the QK^T k loop; 1 keeps the 255-register tiles spill-free.
    pub qk_unroll: u32,
}

const fn t(block_m: u32, block_n: u32, warps: u32, stages: u32) -> FlashTile {
    FlashTile {
        block_m,
        block_n,
        warps,
        stages,
        min_blocks: 1,
        qk_unroll: 16,
    }
}

const fn u1(tile: FlashTile) -> FlashTile {
    FlashTile {
        qk_unroll: 1,
        ..tile
    }
}

impl FlashTile {
    /// Dynamic shared memory: the Q tile and `stages` K and V tiles, rows padded by 16 bytes.
    pub fn smem_bytes(&self, head_dim_tile: u32, elem_bytes: u32) -> u32 {
        (self.block_m + 2 * self.stages * self.block_n) * (head_dim_tile * elem_bytes + 16)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ArchClass {
    /// sm_90 (and sm_100): 227 KB of shared memory per block.
    Hopper,
    /// sm_80 / sm_87: 163 KB.
    A100,
    /// sm_86 / sm_89 / sm_120: 99 KB.
    Consumer,
}

fn class(arch: u32) -> ArchClass {
    match arch {
        90 | 100 | 101 | 103 => ArchClass::Hopper,
        80 | 87 => ArchClass::A100,
        _ => ArchClass::Consumer,
    }
}

/// The tile for a head-dim tile, dtype code (0 fp16, 1 bf16, 2 fp32), arch (cc * 10) and
/// query length.
pub fn flash_fwd_tile(head_dim_tile: u32, dtype_code: u32, arch: u32, seqlen_q: i64) -> FlashTile {
    let c = class(arch);
    let idx = match head_dim_tile {
        0..=32 => 0,
        33..=64 => 1,
        65..=96 => 2,
        97..=128 => 3,
        129..=192 => 4,
        _ => 5,
    };
    if dtype_code == 2 {
        // fp32 runs as 3xTF32: four times the register and smem footprint per element.
        let s = if c == ArchClass::Hopper { 2 } else { 1 };
        let tiles = [
            t(64, 64, 4, s),
            t(64, 64, 4, s),
            t(64, 32, 4, s),
            t(64, 32, 4, s),
            t(64, 32, 4, s),
            t(64, 32, 4, s),
        ];
        if c == ArchClass::Consumer && idx == 5 {
            return t(32, 32, 2, 1);
        }
        return tiles[idx];
    }
    if seqlen_q <= SHORT_SEQLEN_Q && head_dim_tile <= 128 {
        return t(64, 64, 4, if c == ArchClass::Hopper { 2 } else { 1 });
    }
    let table = match c {
        ArchClass::Hopper => [
            t(128, 64, 4, 2),
            t(128, 128, 4, 1),
            u1(t(128, 64, 4, 1)),
            u1(t(128, 64, 4, 1)),
            t(128, 64, 8, 2),
            t(128, 64, 8, 2),
        ],
        ArchClass::A100 => [
            t(128, 128, 4, 1),
            t(128, 64, 4, 1),
            t(128, 64, 4, 1),
            u1(t(128, 64, 4, 1)),
            t(128, 64, 8, 1),
            t(128, 64, 8, 1),
        ],
        ArchClass::Consumer => [
            t(128, 128, 4, 1),
            u1(t(128, 64, 4, 1)),
            t(128, 64, 4, 1),
            t(64, 64, 4, 1),
            t(64, 64, 4, 1),
            t(64, 64, 4, 1),
        ],
    };
    table[idx]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tile_fits_the_arch_shared_memory() {
        for (arch, limit) in [(90, 232_448), (80, 166_912), (86, 101_376), (89, 101_376)] {
            for &hd in HEAD_DIM_TILES {
                for dtype in 0..3 {
                    for seqlen_q in [1, 4096] {
                        let tile = flash_fwd_tile(hd as u32, dtype, arch, seqlen_q);
                        let elem = if dtype == 2 { 4 } else { 2 };
                        let smem = tile.smem_bytes(hd as u32, elem);
                        assert!(
                            smem <= limit,
                            "sm_{arch} hd{hd} dtype{dtype}: {smem} > {limit}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn measured_hopper_rows() {
        assert_eq!(flash_fwd_tile(128, 1, 90, 4096), u1(t(128, 64, 4, 1)));
        assert_eq!(flash_fwd_tile(128, 1, 90, 4096).smem_bytes(128, 2), 69_632);
        assert_eq!(flash_fwd_tile(64, 1, 90, 60), t(64, 64, 4, 2));
        assert_eq!(flash_fwd_tile(256, 1, 90, 4096).smem_bytes(256, 2), 202_752);
    }
}
