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
// n + m elements into equal diagonals; each thread finds where its diagonal
// crosses the two inputs by binary search and merges its stretch
// sequentially, so every thread does the same work whatever the skew.
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

// For every i < n: bounds[i] = #{b < a[i]} (upper == 0) or #{b <= a[i]}
// (upper == 1). With `subtract_from` set, writes bounds[i] = that count minus
// subtract_from[i] instead (upper - lower: the match count), which may alias
// nothing else.
// Launch: grid * BLOCK_THREADS >= ceil((n + m) / items_per_thread),
// block = BLOCK_THREADS, items_per_thread >= 1.
extern "C" __global__ void merge_path_bounds(const u64* a, u64 n, const u64* b, u64 m, u32 upper,
                                             u64 items_per_thread, const u64* subtract_from,
                                             u64* bounds) {
    const u64 thread = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 total = n + m;
    const u64 begin = thread * items_per_thread;
    if (begin >= total) return;
    const u64 end = min(total, begin + items_per_thread);
    u64 i = merge_path_split(a, n, b, m, begin, upper != 0);
    u64 j = begin - i;
    for (u64 step = begin; step < end; ++step) {
        if (i < n && (j >= m || a_first(a[i], b[j], upper != 0))) {
            bounds[i] = subtract_from ? j - subtract_from[i] : j;
            ++i;
        } else {
            ++j;
        }
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
