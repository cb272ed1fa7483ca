// Merge-path matching of two sorted key arrays (seed 000 §3.3, seed 001 §3:
// the GPU sort-merge join), and the expansion of the matches into row pairs.
//
// `a` is the streamed side, `b` the other side, both sorted ascending (the
// keys are order-preserving codes, made on the host or by `ordered_codes`
// below, so ascending codes are the join's own sort order). For every a[i] the join needs the run of equal
// keys in b: lower[i] = #{b < a[i]} and upper[i] = #{b <= a[i]}. Both are a
// merge of a and b: merging with ties taken from a first, the b elements
// emitted before a[i] are those below it (lower); with ties taken from b
// first, those at most a[i] (upper). Merge path splits the merged sequence of
// n + m elements into equal diagonals: each block finds where its tile's
// two diagonals cross the inputs by binary search, copies its stretch of
// both into shared memory (coalesced), and each thread merges its part of
// the tile there, so every thread does the same work whatever the skew and
// global memory is read and written in whole sectors.
//
// The matches are then counted (upper - lower), scanned on the host side
// (`scan.cu`), and `expand_pairs` writes the pairs of any range of output
// positions: the host picks ranges of at most the output buffer, so an
// exploding join streams through a bounded buffer.
#include "common.cuh"

// Whether a[i] precedes b[j] in the merge: on ties a first for the lower
// bounds, b first for the upper bounds.
__device__ __forceinline__ bool a_first(u64 a, u64 b, bool upper) {
    return upper ? a < b : a <= b;
}

// Number of a elements among the first `diagonal` elements of the merge.
__device__ u64 merge_path_split(const u64* a, u64 n, const u64* b, u64 m, u64 diagonal,
                                bool upper) {
    u64 lo = diagonal > m ? diagonal - m : 0;
    u64 hi = diagonal < n ? diagonal : n;
    while (lo < hi) {
        const u64 mid = (lo + hi) / 2;
        // a[mid] is among the first `diagonal` iff it precedes
        // b[diagonal - mid - 1], the last b element that would be.
        if (a_first(a[mid], b[diagonal - mid - 1], upper)) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// Merged elements of one tile of `merge_path_bounds`: MERGE_ITEMS per thread.
#define MERGE_ITEMS 8
#define MERGE_TILE (BLOCK_THREADS * MERGE_ITEMS)

// For every i < n: bounds[i] = #{b < a[i]} (upper == 0) or #{b <= a[i]}
// (upper == 1). With `subtract_from` set, writes bounds[i] = that count minus
// subtract_from[i] instead (upper - lower: the match count), which may alias
// nothing else. Block t merges positions [t * MERGE_TILE, (t + 1) *
// MERGE_TILE) of the merged sequence: a's stretch [a0, a1) and b's [b0, b1)
// between its diagonals, whose lengths add up to the tile's.
// Launch: grid = ceil((n + m) / MERGE_TILE), block = BLOCK_THREADS.
extern "C" __global__ void merge_path_bounds(const u64* a, u64 n, const u64* b, u64 m, u32 upper,
                                             const u64* subtract_from, u64* bounds) {
    // The tile's stretch of a, then its stretch of b.
    __shared__ u64 tile_keys[MERGE_TILE];
    // The bound of each key of a's stretch.
    __shared__ u64 tile_bounds[MERGE_TILE];
    __shared__ u64 splits[2];
    const bool up = upper != 0;
    const u64 total = n + m;
    const u64 begin = (u64)blockIdx.x * MERGE_TILE;
    if (begin >= total) return;  // the whole block
    const u64 end = min(total, begin + MERGE_TILE);
    if (threadIdx.x < 2) {
        splits[threadIdx.x] = merge_path_split(a, n, b, m, threadIdx.x == 0 ? begin : end, up);
    }
    __syncthreads();
    const u64 a0 = splits[0], a1 = splits[1];
    const u64 b0 = begin - a0;
    const u32 na = (u32)(a1 - a0);
    const u32 tile = (u32)(end - begin);
    const u32 nb = tile - na;
    for (u32 k = threadIdx.x; k < tile; k += BLOCK_THREADS) {
        tile_keys[k] = k < na ? a[a0 + k] : b[b0 + (k - na)];
    }
    __syncthreads();
    const u64* sa = tile_keys;
    const u64* sb = tile_keys + na;
    const u32 first = min(threadIdx.x * MERGE_ITEMS, tile);
    const u32 last = min(first + MERGE_ITEMS, tile);
    u32 i = (u32)merge_path_split(sa, na, sb, nb, first, up);
    u32 j = first - i;
    for (u32 step = first; step < last; ++step) {
        if (i < na && (j >= nb || a_first(sa[i], sb[j], up))) {
            tile_bounds[i] = b0 + j;
            ++i;
        } else {
            ++j;
        }
    }
    __syncthreads();
    for (u32 k = threadIdx.x; k < na; k += BLOCK_THREADS) {
        const u64 bound = tile_bounds[k];
        bounds[a0 + k] = subtract_from ? bound - subtract_from[a0 + k] : bound;
    }
}

// Writes the pairs at output positions [first, first + len): position p
// belongs to the row i of a with offsets[i] <= p < offsets[i] + counts[i]
// (the last i with offsets[i] <= p, as rows without matches take no
// positions), and pairs a's sorted position i with b's row b_ids[lower[i] +
// p - offsets[i]]. `offsets` is the exclusive scan of the match counts.
// Launch: any grid, block = BLOCK_THREADS (grid-stride), n >= 1, and
// first + len <= the total match count.
extern "C" __global__ void expand_pairs(const u64* offsets, const u64* lower, u64 n,
                                        const u64* b_ids, u64 first, u64 len, u64* out_a_pos,
                                        u64* out_b_ids) {
    for (u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x; k < len;
         k += (u64)gridDim.x * blockDim.x) {
        const u64 p = first + k;
        // Last i with offsets[i] <= p; offsets[0] = 0 <= p.
        u64 lo = 0, hi = n;
        while (hi - lo > 1) {
            const u64 mid = (lo + hi) / 2;
            if (offsets[mid] <= p) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        out_a_pos[k] = lo;
        out_b_ids[k] = b_ids[lower[lo] + (p - offsets[lo])];
    }
}

// In place, for i < n: keys[i], a raw 8-byte integer key (its bits as they
// are in the Arrow column), becomes its order-preserving code: its distance
// from `base`, the smallest key of both sides (ascending), or from the
// largest (descending). Both differences wrap exactly as the host's codes do
// (`OrderedKeyEncoder`), and ascending codes are the join's order.
extern "C" __global__ void ordered_codes(u64* keys, u64 n, u64 base, u32 descending) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const u64 key = keys[i];
        keys[i] = descending ? base - key : key - base;
    }
}
