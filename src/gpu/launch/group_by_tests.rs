use super::*;

fn rows_of(rows: usize, span: Option<(usize, usize)>) -> GroupRows<'static> {
    GroupRows {
        groups_of_rows: None,
        rows,
        valid_bits: None,
        groups: 1,
        span,
    }
}

#[test]
fn a_span_reduces_its_own_rows_within_all_of_them() {
    let all = rows_of(100, None);
    assert_eq!((all.bounds(), all.reduced()), ((0, 100), 100));
    let chunk = all.chunk(37, 64);
    assert_eq!((chunk.kernel_bounds(), chunk.reduced()), ((37, 64), 27));
    assert!(chunk.check().is_ok());
    // Past the rows, or backwards: refused before any launch.
    assert!(all.chunk(90, 101).check().is_err());
    assert!(all.chunk(50, 40).check().is_err());
    // The passes that read every row twice take all of them only.
    assert!(all.whole().is_ok());
    assert!(all.chunk(0, 100).whole().is_ok());
    assert!(chunk.whole().is_err());
}
