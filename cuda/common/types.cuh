// common/types.cuh: the integer names every kernel family uses, and Raw, the packed register
// image of a few 16-bit or 32-bit elements that the vector loads and stores of copy.cuh move.
//
// Dtype codes (the FS_DTYPE / FS_IN_DTYPE / FS_BC_DTYPE defines and the DT template arguments of
// the prelude): 0 = fp16, 1 = bf16, 2 = fp32. fp16 / bf16 are 16-bit storage only: every value is
// widened to f32 by convert.cuh before arithmetic.
#pragma once

namespace fs {

typedef long long i64;
typedef unsigned int u32;
typedef unsigned short u16;

// N elements of ES bytes packed in ceil(N * ES / 4) 32-bit words; 16-bit element i lives in the low
// (even i) or high (odd i) half of word i / 2. Registers only: it exists so that a slice of a row
// moves as one vector load / store and is unpacked element by element (convert.cuh: elem).
template <int N, int ES>
struct Raw {
    u32 w[(N * ES + 3) / 4];
};

}  // namespace fs
