use std::collections::HashMap;

use super::{
    fixed_point_scale, fixed_point_term, fixed_sum_to_f64, Grouped, ReduceInput, Reduced,
    Reduction,
};

/// What [`super::group_on_device`] computes, then downloaded, on the host.
pub fn group_by(
    keys: Option<&[u64]>,
    rows: usize,
    inputs: &[ReduceInput],
    bitmaps: &[Vec<u64>],
) -> Grouped {
    let mut group_of_row = Vec::with_capacity(rows);
    let mut group_rows = Vec::new();
    match keys {
        Some(keys) => {
            let mut ids: HashMap<u64, usize> = HashMap::new();
            for (row, key) in keys.iter().enumerate() {
                let next = ids.len();
                let id = *ids.entry(*key).or_insert(next);
                if id == next {
                    group_rows.push(row as u64);
                }
                group_of_row.push(id);
            }
        }
        None => group_of_row.resize(rows, 0),
    }
    let groups = if keys.is_some() { group_rows.len() } else { 1 };
    let reduced = inputs
        .iter()
        .map(|input| reduce(input, &group_of_row, groups, bitmaps))
        .collect();
    Grouped {
        groups,
        group_keys: match keys {
            Some(keys) => group_rows.iter().map(|&row| keys[row as usize]).collect(),
            None => Vec::new(),
        },
        group_rows,
        row_groups: if keys.is_some() {
            group_of_row.iter().map(|&g| g as u64).collect()
        } else {
            Vec::new()
        },
        reduced,
        table_overflowed: false,
        folded_in_table: false,
        folding_table_grown: false,
        inputs_reduced_as_they_landed: 0,
        numbered_in_partitions: false,
    }
}

fn reduce(
    input: &ReduceInput,
    group_of_row: &[usize],
    groups: usize,
    bitmaps: &[Vec<u64>],
) -> Reduced {
    let valid = |i: usize| {
        input
            .valid
            .is_none_or(|b| (bitmaps[b][i / 64] >> (i % 64)) & 1 == 1)
    };
    let (values, high_words) = (input.values.to_vec(), input.high_words.to_vec());
    if input.reduction == Reduction::SumF64Fixed {
        return fixed_sums(&values, group_of_row, groups, valid);
    }
    let wide = |i: usize| (u128::from(high_words[i]) << 64) | u128::from(values[i]);
    let (identity, combine): (u128, fn(u128, u128) -> u128) = match input.reduction {
        Reduction::Count | Reduction::Sum | Reduction::SumI128 => (0, u128::wrapping_add),
        Reduction::Min => (u64::MAX.into(), u128::min),
        Reduction::MinI128 => (u128::MAX, u128::min),
        Reduction::Max | Reduction::MaxI128 => (0, u128::max),
        Reduction::SumF64 | Reduction::SumF64Fixed => (0f64.to_bits().into(), |a, b| {
            (f64::from_bits(a as u64) + f64::from_bits(b as u64))
                .to_bits()
                .into()
        }),
    };
    let mut out = vec![identity; groups];
    for (i, &g) in group_of_row.iter().enumerate() {
        if !valid(i) {
            continue;
        }
        let value = match input.reduction {
            Reduction::Count => 1,
            r if r.is_wide() => wide(i),
            Reduction::Sum | Reduction::Min | Reduction::Max => {
                u128::from(values[i] ^ input.flip)
            }
            _ => u128::from(values[i]),
        };
        out[g] = combine(out[g], value);
    }
    if input.reduction.is_wide() {
        Reduced {
            values: out.iter().map(|&v| v as u64).collect(),
            high_words: out.iter().map(|&v| (v >> 64) as u64).collect(),
        }
    } else {
        Reduced {
            // Sums wrap at 64 bits like the device's.
            values: out.iter().map(|&v| v as u64).collect(),
            high_words: Vec::new(),
        }
    }
}

/// [`Reduction::SumF64Fixed`] as the device computes it, to the bit.
fn fixed_sums(
    values: &[u64],
    group_of_row: &[usize],
    groups: usize,
    valid: impl Fn(usize) -> bool,
) -> Reduced {
    let mut top = vec![0u64; groups];
    let mut specials = vec![0u64; groups];
    for (i, &g) in group_of_row.iter().enumerate() {
        if valid(i) {
            match fixed_point_scale(values[i]) {
                Ok(exponent) => top[g] = top[g].max(exponent),
                Err(flag) => specials[g] |= flag,
            }
        }
    }
    let mut sums = vec![0i128; groups];
    for (i, &g) in group_of_row.iter().enumerate() {
        if valid(i) && fixed_point_scale(values[i]).is_ok() {
            sums[g] = sums[g].wrapping_add(fixed_point_term(values[i], top[g]));
        }
    }
    Reduced {
        values: (0..groups)
            .map(|g| fixed_sum_to_f64(sums[g], top[g], specials[g]).to_bits())
            .collect(),
        high_words: Vec::new(),
    }
}
