use super::*;

/// The value of `#define NAME value` in a kernel source.
fn defined(source: &str, name: &str) -> u64 {
    let prefix = format!("#define {name} ");
    let line = source
        .lines()
        .find(|line| line.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no #define {name}"));
    line[prefix.len()..].trim().parse().unwrap()
}

/// The launches size grids, buffers and checks by these constants; the
/// kernels by their own.
#[test]
fn launch_constants_match_the_kernels() {
    let common = include_str!("../../../ptx/common.cuh");
    let radix = include_str!("../../../ptx/radix_partition.cu");
    let join = include_str!("../../../ptx/hash_join.cu");
    let group_by = include_str!("../../../ptx/group_by.cu");
    assert_eq!(defined(common, "BLOCK_THREADS"), u64::from(BLOCK_THREADS));
    assert_eq!(defined(radix, "MAX_RADIX_BITS"), u64::from(MAX_RADIX_BITS));
    assert_eq!(defined(join, "TABLE_CAPACITY"), JOIN_TABLE_CAPACITY as u64);
    assert_eq!(defined(join, "MAX_JOIN_FOLDS"), MAX_JOIN_FOLDS as u64);
    assert_eq!(defined(group_by, "MAX_TABLE_FOLDS"), MAX_TABLE_FOLDS as u64);
}

#[test]
fn a_join_grid_is_the_resident_blocks_or_the_tasks() {
    assert_eq!(join_blocks(1 << 17, 132, 3), 396);
    assert_eq!(join_blocks(100, 132, 3), 100);
    assert_eq!(join_blocks(0, 132, 3), 1);
}
