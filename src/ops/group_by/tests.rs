use super::*;

#[test]
fn pieces_in_a_range_are_the_parts_of_the_pieces_that_hold_it() {
    let mut words = Words::default();
    for piece in [vec![0u64, 1, 2], vec![], vec![3, 4], vec![5, 6, 7, 8]] {
        words.push(Box::new(piece));
    }
    let all: Vec<u64> = (0..9).collect();
    for start in 0..=9 {
        for end in start..=9 {
            let parts = words.pieces_in(start..end);
            assert!(parts.iter().all(|p| !p.is_empty()), "{start}..{end}");
            assert_eq!(parts.concat(), all[start..end], "{start}..{end}");
        }
    }
    assert_eq!(words.pieces_in(2..6).len(), 3);
}

#[test]
fn a_folding_table_is_counted_where_it_outgrows_the_rows_own() {
    let inputs = |count: usize, reduction: Reduction| -> Vec<ReduceInput> {
        (0..count)
            .map(|_| ReduceInput {
                reduction,
                values: Words::default(),
                high_words: Words::default(),
                flip: 0,
                valid: None,
            })
            .collect()
    };
    let sums = inputs(4, Reduction::Sum);
    let rows = 1 << 20;
    // 2^21 slots of keys and groups, and every row's group.
    let unfolded = 2 * ((1 << 21) + 1) + rows;
    assert_eq!(hashed_table_words(rows, None, &sums), unfolded);
    assert_eq!(hashed_table_words(rows, Some(1_000), &sums), unfolded);
    // 2^20 slots (and the reserved one), each with its group, and four
    // folds' words and its key in eight words: more than the table
    // sized to the rows.
    let folding = ((1 << 20) + 1) * 9;
    assert!(folding > unfolded);
    assert_eq!(hashed_table_words(rows, Some(1 << 18), &sums), folding);
    // Five inputs do not fold.
    let five = inputs(5, Reduction::Count);
    assert_eq!(hashed_table_words(rows, Some(1 << 18), &five), unfolded);
}

#[test]
fn tables_are_sized_to_four_to_sixty_four_times_the_estimate_and_never_above_the_rows_own() {
    assert_eq!(sized_table_capacity(0), MIN_SIZED_TABLE_SLOTS);
    assert_eq!(sized_table_capacity(2), MIN_SIZED_TABLE_SLOTS);
    assert_eq!(sized_table_capacity(1 << 6), MIN_SIZED_TABLE_SLOTS);
    // Few groups: sixty-four times, within the spread bound.
    assert_eq!(sized_table_capacity(1 << 8), 1 << 14);
    assert_eq!(sized_table_capacity(1 << 10), 1 << 16);
    assert_eq!(sized_table_capacity(1 << 13), SPREAD_TABLE_SLOTS);
    assert_eq!(sized_table_capacity(1 << 15), SPREAD_TABLE_SLOTS);
    assert_eq!(sized_table_capacity(1 << 17), SPREAD_TABLE_SLOTS);
    // More: four times.
    assert_eq!(sized_table_capacity((1 << 17) + 1), 1 << 20);
    assert_eq!(sized_table_capacity(1 << 18), 1 << 20);
    // The table sized to the rows is the larger where the groups are
    // near the rows: group_on_device keeps it then.
    assert!(sized_table_capacity(1000) > table_capacity(1000));
    assert!(sized_table_capacity(1 << 24) < table_capacity(1 << 28));
}

#[test]
fn fixed_point_sums_are_exact_where_the_terms_are_and_keep_special_values() {
    let sum = |values: &[f64]| -> f64 {
        let scales: Vec<Result<u64, u64>> = values
            .iter()
            .map(|v| fixed_point_scale(v.to_bits()))
            .collect();
        let top = scales.iter().filter_map(|s| s.ok()).max().unwrap_or(0);
        let specials = scales.iter().filter_map(|s| s.err()).fold(0, |a, b| a | b);
        let total: i128 = values
            .iter()
            .filter(|v| v.is_finite())
            .map(|v| fixed_point_term(v.to_bits(), top))
            .sum();
        fixed_sum_to_f64(total, top, specials)
    };
    assert_eq!(sum(&[]).to_bits(), 0f64.to_bits());
    assert_eq!(sum(&[-0.0]).to_bits(), 0f64.to_bits());
    assert_eq!(sum(&[1.5, -0.25, 1024.0]), 1025.25);
    assert_eq!(
        sum(&[f64::MAX, -f64::MAX, 3.0]),
        0.0,
        "3 is below 2^-62 of MAX"
    );
    assert_eq!(sum(&[f64::MAX, f64::MAX]), f64::INFINITY);
    assert_eq!(
        sum(&[f64::MIN_POSITIVE / 8.0, f64::MIN_POSITIVE / 8.0]),
        f64::MIN_POSITIVE / 4.0
    );
    assert_eq!(sum(&[1e-300, 2e-300]), 1e-300 + 2e-300);
    assert_eq!(
        sum(&[0.1; 10]),
        1.0,
        "the exact sum of ten 0.1s rounds to 1.0"
    );
    assert!(sum(&[1.0, f64::NAN]).is_nan());
    assert!(sum(&[f64::INFINITY, f64::NEG_INFINITY]).is_nan());
    assert_eq!(sum(&[f64::NEG_INFINITY, 5.0]), f64::NEG_INFINITY);
    // Any order, the same bits.
    let values: Vec<f64> = (0..1000)
        .map(|i| {
            ((i * 7919) % 1013) as f64
                * 1.1f64.powi(i % 300 - 150)
                * if i % 3 == 0 { -1.0 } else { 1.0 }
        })
        .collect();
    let mut reversed = values.clone();
    reversed.reverse();
    assert_eq!(sum(&values).to_bits(), sum(&reversed).to_bits());
    let naive: f64 = values.iter().sum();
    let magnitude: f64 = values.iter().map(|v| v.abs()).sum();
    assert!((sum(&values) - naive).abs() <= 1e-13 * magnitude);
}

#[test]
fn partitions_hold_a_few_hundred_groups() {
    assert_eq!(partition_bits_for_groups(0), 0);
    assert_eq!(partition_bits_for_groups(GROUPS_PER_PARTITION), 0);
    assert_eq!(partition_bits_for_groups(GROUPS_PER_PARTITION + 1), 1);
    assert_eq!(partition_bits_for_groups(1 << 24), 15);
    assert_eq!(partition_bits_for_groups(usize::MAX), 18);
}

#[test]
fn bitmap_sets_one_bit_per_valid_row() {
    let bits = validity_bitmap(130, |i| i % 2 == 0 || i == 129);
    assert_eq!(bits.len(), 3);
    assert_eq!(bits[0], 0x5555_5555_5555_5555);
    assert_eq!(bits[2], 0b11);
}

#[test]
fn reference_groups_in_first_occurrence_order() {
    let keys = [7, 3, 7, 9, 3];
    let bitmaps = vec![validity_bitmap(5, |i| i != 2)];
    let inputs = [
        ReduceInput {
            reduction: Reduction::Count,
            values: Words::default(),
            high_words: Words::default(),
            flip: 0,
            valid: Some(0),
        },
        ReduceInput {
            reduction: Reduction::Sum,
            values: vec![1, 2, 4, 8, 16].into(),
            high_words: Words::default(),
            flip: 0,
            valid: Some(0),
        },
        ReduceInput {
            reduction: Reduction::MaxI128,
            values: vec![5, 0, 9, 1, u64::MAX].into(),
            high_words: vec![1, 0, 1, 0, 0].into(),
            flip: 0,
            valid: None,
        },
    ];
    let grouped = reference::group_by(Some(&keys), 5, &inputs, &bitmaps);
    assert_eq!(grouped.groups, 3);
    assert_eq!(grouped.group_rows, vec![0, 1, 3]);
    assert_eq!(grouped.group_keys, vec![keys[0], keys[1], keys[3]]);
    assert_eq!(grouped.reduced[0].values, vec![1, 2, 1]);
    assert_eq!(grouped.reduced[1].values, vec![1, 18, 8]);
    assert_eq!(grouped.reduced[2].values, vec![9, u64::MAX, 1]);
    assert_eq!(grouped.reduced[2].high_words, vec![1, 0, 0]);
}

#[test]
fn reference_without_keys_has_one_group_even_without_rows() {
    let inputs = [ReduceInput {
        reduction: Reduction::Min,
        values: Words::default(),
        high_words: Words::default(),
        flip: 0,
        valid: None,
    }];
    let grouped = reference::group_by(None, 0, &inputs, &[]);
    assert_eq!(grouped.groups, 1);
    assert_eq!(grouped.reduced[0].values, vec![u64::MAX]);
}

#[test]
fn inputs_of_the_wrong_length_are_refused() {
    let inputs = [ReduceInput {
        reduction: Reduction::Sum,
        values: vec![1].into(),
        high_words: Words::default(),
        flip: 0,
        valid: None,
    }];
    assert!(check_inputs(None, 2, &inputs, &[]).is_err());
    assert!(check_inputs(Some(&vec![1].into()), 2, &[], &[]).is_err());
    assert!(check_inputs(None, 1, &inputs, &[]).is_ok());
}
