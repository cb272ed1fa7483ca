//! LIKE patterns, and text to compare with, as the device matches them
//! over strings kept as their bytes (`ScanOp::Like`): patterns of literal
//! text and `%` only, which match by finding their segments in turn; a `_`
//! or an escape (`\`) leaves the predicate to DataFusion.

/// The remap table of `pattern` that `ScanOp::Like` reads: the segment
/// count, whether the pattern starts with `%` and whether it ends with one
/// (1 or 0), then per segment (the text between `%`s, empty ones dropped)
/// its byte length and its bytes, four to a little-endian word. `None`
/// where the pattern holds a `_` or a `\`.
pub(crate) fn like_table(pattern: &str) -> Option<Vec<u32>> {
    if pattern.contains(['_', '\\']) {
        return None;
    }
    let segments: Vec<&[u8]> = pattern
        .split('%')
        .filter(|s| !s.is_empty())
        .map(str::as_bytes)
        .collect();
    let mut table = vec![
        u32::try_from(segments.len()).ok()?,
        u32::from(pattern.starts_with('%')),
        u32::from(pattern.ends_with('%')),
    ];
    for segment in segments {
        push_segment(&mut table, segment)?;
    }
    Some(table)
}

/// The table [`like_table`] makes, for a string equal to `text`: one
/// segment, both ends closed (whatever `text` holds, `%` and `_` included).
/// `None` for text of 4 GiB or more.
pub(crate) fn text_table(text: &str) -> Option<Vec<u32>> {
    let mut table = vec![1, 0, 0];
    push_segment(&mut table, text.as_bytes())?;
    Some(table)
}

/// The table [`like_table`] makes, for a string that starts with `text`:
/// one segment, closed at the start and open at the end (whatever `text`
/// holds, `%` and `_` included). `None` for text of 4 GiB or more.
pub(crate) fn prefix_table(text: &str) -> Option<Vec<u32>> {
    let mut table = vec![1, 0, 1];
    push_segment(&mut table, text.as_bytes())?;
    Some(table)
}

/// What `substr(s, 1, length) = text` asks of `s` itself, for a length of
/// at least one character: the table of a string starting with `text`
/// where `text` holds `length` characters (the first `length` characters
/// of `s` are exactly its bytes: UTF-8 codes no character as the start of
/// another), of a string equal to `text` where it holds fewer (`s` is then
/// no longer than `text`); `None` where it holds more (no `s` matches).
/// The outer `None`: text of 4 GiB or more.
pub(crate) fn substr_table(text: &str, length: usize) -> Option<Option<Vec<u32>>> {
    match text.chars().count().cmp(&length) {
        std::cmp::Ordering::Equal => prefix_table(text).map(Some),
        std::cmp::Ordering::Less => text_table(text).map(Some),
        std::cmp::Ordering::Greater => Some(None),
    }
}

/// Appends one segment to a pattern's table: its byte length, then its
/// bytes four to a little-endian word (the last padded with zeros).
fn push_segment(table: &mut Vec<u32>, segment: &[u8]) -> Option<()> {
    table.push(u32::try_from(segment.len()).ok()?);
    table.extend(segment.chunks(4).map(|chunk| {
        let mut le = [0u8; 4];
        le[..chunk.len()].copy_from_slice(chunk);
        u32::from_le_bytes(le)
    }));
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_become_their_segments_and_open_ends() {
        // "%special%requests%": two segments, open at both ends.
        let table = like_table("%special%requests%").unwrap();
        assert_eq!(&table[..3], &[2, 1, 1]);
        assert_eq!(table[3], 7);
        assert_eq!(table[4], u32::from_le_bytes(*b"spec"));
        assert_eq!(table[5], u32::from_le_bytes([b'i', b'a', b'l', 0]));
        assert_eq!(table[6], 8);
        assert_eq!(&table[7..9], &[u32::from_le_bytes(*b"requ"), u32::from_le_bytes(*b"ests")]);
        assert_eq!(table.len(), 9);
        // A prefix, a suffix, text alone, multibyte text.
        assert_eq!(like_table("ab%").unwrap(), vec![1, 0, 1, 2, u32::from_le_bytes([b'a', b'b', 0, 0])]);
        assert_eq!(&like_table("%ab").unwrap()[..3], &[1, 1, 0]);
        assert_eq!(&like_table("ab").unwrap()[..3], &[1, 0, 0]);
        assert_eq!(like_table("é").unwrap()[3], 2);
        // Empty segments dropped: "%" and "%%" match everything, "" only
        // the empty string, "a%%b" as "a%b".
        assert_eq!(like_table("%").unwrap(), vec![0, 1, 1]);
        assert_eq!(like_table("%%").unwrap(), vec![0, 1, 1]);
        assert_eq!(like_table("").unwrap(), vec![0, 0, 0]);
        assert_eq!(like_table("a%%b").unwrap(), like_table("a%b").unwrap());
        // Text to equal: its bytes as they are, wildcards included.
        assert_eq!(text_table("ab").unwrap(), like_table("ab").unwrap());
        assert_eq!(text_table("").unwrap(), vec![1, 0, 0, 0]);
        assert_eq!(text_table("a_%").unwrap(), vec![1, 0, 0, 3, u32::from_le_bytes([b'a', b'_', b'%', 0])]);
    }

    #[test]
    fn like_over_a_column_of_string_bytes_compiles_to_one_match_and_the_rest_is_refused() {
        use std::sync::Arc;

        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        use datafusion::physical_expr::expressions::{col, lit, BinaryExpr, LikeExpr};
        use datafusion::physical_expr::PhysicalExpr;

        use super::super::program::{ProgramBuilder, ValueType};
        use crate::gpu::launch::ScanOp;

        let schema = Schema::new(vec![
            Field::new("i", DataType::Int64, true),
            Field::new("c", DataType::Utf8View, true),
        ]);
        let c = col("c", &schema).unwrap();
        let like = |negated: bool, case_insensitive: bool, pattern: &str| -> Arc<dyn PhysicalExpr> {
            let pattern = lit(datafusion::common::ScalarValue::Utf8View(Some(pattern.into())));
            Arc::new(LikeExpr::new(negated, case_insensitive, Arc::clone(&c), pattern))
        };
        let builder = || ProgramBuilder::new(&schema).with_byte_columns(&[1]);
        // NOT LIKE: the match, then its negation; the test holds the table.
        let mut program = builder();
        let value = program.compile(&like(true, false, "%special%requests%")).unwrap();
        assert_eq!(value.value_type, ValueType::Bool);
        let ops: Vec<i64> = program.instructions().iter().map(|i| i[0]).collect();
        assert_eq!(ops, [ScanOp::Like as i64, ScanOp::Not as i64]);
        assert_eq!(program.columns(), &[1]);
        let test = &program.tests()[0];
        assert_eq!(test.pattern.as_deref(), like_table("%special%requests%").as_ref());
        assert!(test.join_keys.is_none());
        // ILIKE, `_`, a pattern from a column, reading the column any other
        // way: refused, with the reason.
        let refused = |expr: Arc<dyn PhysicalExpr>| builder().compile(&expr).unwrap_err();
        assert!(refused(like(false, true, "%a%")).contains("ILIKE"));
        assert!(refused(like(false, false, "a_c")).contains("`_`"));
        let from_column: Arc<dyn PhysicalExpr> =
            Arc::new(LikeExpr::new(false, false, Arc::clone(&c), Arc::clone(&c)));
        assert!(refused(from_column).contains("not a string literal"));
        let text = || lit(datafusion::common::ScalarValue::Utf8View(Some("x%".into())));
        let compare = |op| -> Arc<dyn PhysicalExpr> { Arc::new(BinaryExpr::new(text(), op, Arc::clone(&c))) };
        let less: Arc<dyn PhysicalExpr> =
            Arc::new(BinaryExpr::new(Arc::clone(&c), datafusion::logical_expr::Operator::Lt, text()));
        assert!(refused(less).contains("only by LIKE"));
        // `<>` text: a match of the text as one closed segment, negated.
        let mut program = builder();
        program.compile(&compare(datafusion::logical_expr::Operator::NotEq)).unwrap();
        let ops: Vec<i64> = program.instructions().iter().map(|i| i[0]).collect();
        assert_eq!(ops, [ScanOp::Like as i64, ScanOp::Not as i64]);
        assert_eq!(program.tests()[0].pattern.as_deref(), text_table("x%").as_ref());
        // NOT IN: a match a value, ORed, negated.
        let values = ["a", "b"]
            .map(|v| lit(datafusion::common::ScalarValue::Utf8View(Some(v.into()))))
            .to_vec();
        let not_in = datafusion::physical_expr::expressions::in_list(Arc::clone(&c), values, &true, &schema)
            .unwrap();
        let mut program = builder();
        program.compile(&not_in).unwrap();
        let likes = program.instructions().iter().filter(|i| i[0] == ScanOp::Like as i64).count();
        assert_eq!(likes, 2);
        assert_eq!(program.instructions().last().unwrap()[0], ScanOp::Not as i64);
        assert_eq!(program.tests()[1].pattern.as_deref(), text_table("b").as_ref());
        // IS NULL: whether a match of "%" (every valid string) is NULL.
        let is_null: Arc<dyn PhysicalExpr> =
            Arc::new(datafusion::physical_expr::expressions::IsNullExpr::new(Arc::clone(&c)));
        let mut program = builder();
        program.compile(&is_null).unwrap();
        let ops: Vec<i64> = program.instructions().iter().map(|i| i[0]).collect();
        assert_eq!(ops, [ScanOp::Like as i64, ScanOp::IsNull as i64]);
        assert_eq!(program.tests()[0].pattern.as_deref(), like_table("%").as_ref());
        assert!(builder().group_code(1, 0).unwrap_err().contains("only by LIKE"));
        // `substr(c, 1, 2) IN`: a prefix a value of two characters, the
        // whole string for a shorter one, none for a longer one.
        let substr = |start: i64, length: i64| -> Arc<dyn PhysicalExpr> {
            let args = vec![Arc::clone(&c), lit(start), lit(length)];
            let config = Arc::new(datafusion::config::ConfigOptions::default());
            let function = datafusion::physical_expr::ScalarFunctionExpr::try_new(
                datafusion::functions::unicode::substr(),
                args,
                &schema,
                config,
            );
            Arc::new(function.unwrap())
        };
        let texts = |values: &[&str]| {
            values
                .iter()
                .map(|v| lit(datafusion::common::ScalarValue::Utf8View(Some((*v).into()))))
                .collect::<Vec<_>>()
        };
        let in_list = |string: Arc<dyn PhysicalExpr>, values: &[&str]| {
            datafusion::physical_expr::expressions::in_list(string, texts(values), &false, &schema).unwrap()
        };
        let mut program = builder();
        program.compile(&in_list(substr(1, 2), &["13", "1", "123"])).unwrap();
        let patterns: Vec<Option<Vec<u32>>> =
            program.tests().iter().map(|t| t.pattern.as_deref().cloned()).collect();
        assert_eq!(patterns, [like_table("13%"), text_table("1")]);
        // `=` and `<>` alike; from another start, or only longer values:
        // not evaluated on the device.
        let equal: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
            substr(1, 1),
            datafusion::logical_expr::Operator::Eq,
            texts(&["€"]).remove(0),
        ));
        let mut program = builder();
        program.compile(&equal).unwrap();
        assert_eq!(program.tests()[0].pattern.as_deref(), prefix_table("€").as_ref());
        assert!(builder().compile(&in_list(substr(2, 2), &["13"])).is_err());
        let longer = builder().compile(&in_list(substr(1, 1), &["13", "ab"])).unwrap_err();
        assert!(longer.contains("is not evaluated on the device"), "{longer}");
        // Not kept as bytes: LIKE is a test of its dictionary codes.
        let mut coded = ProgramBuilder::new(&schema);
        coded.compile(&like(false, false, "%a%")).unwrap();
        assert_eq!(coded.instructions()[0][0], ScanOp::CodeTest as i64);
    }

    #[test]
    fn a_substring_from_the_start_is_a_prefix_or_the_whole_string() {
        // As many characters as the substring: a prefix, wildcards and
        // multibyte characters as they are.
        assert_eq!(substr_table("13", 2), Some(Some(like_table("13%").unwrap())));
        assert_eq!(substr_table("%_", 2), Some(Some(vec![1, 0, 1, 2, u32::from_le_bytes([b'%', b'_', 0, 0])])));
        assert_eq!(substr_table("€a", 2), Some(Some(vec![1, 0, 1, 4, u32::from_le_bytes([0xe2, 0x82, 0xac, b'a'])])));
        // Fewer: the whole string; more: nothing matches.
        assert_eq!(substr_table("1", 2), Some(text_table("1")));
        assert_eq!(substr_table("", 3), Some(text_table("")));
        assert_eq!(substr_table("€€€", 2), Some(None));
    }

    #[test]
    fn single_character_wildcards_and_escapes_are_refused() {
        assert_eq!(like_table("a_b"), None);
        assert_eq!(like_table("100\\%"), None);
        assert_eq!(like_table("%_%"), None);
    }
}
