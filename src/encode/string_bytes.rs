//! A string column as the device column cache keeps it where its values
//! are too many to code (names, comments): its bytes end to end and
//! `rows + 1` 4-byte offsets into them, a NULL row an empty string there
//! (its validity says NULL). The device reads such a column only in
//! `LIKE`, `=`, `<>`, `IN` with text and `IS NULL`, and a scan of files
//! outputs it from the part's bytes brought back whole. Host work only.

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, GenericStringArray, OffsetSizeTrait, StringViewArray,
};
use datafusion::arrow::datatypes::DataType;

use super::table_words::{empty_for_fill, initial_room, room_for, HostWords, ValidityBuilder, WordValues};
use crate::gpu::WordKind;

/// A string column's bytes and offsets made piece by piece as a part is
/// read, in memory mapped in huge pages where large (see
/// [`empty_for_fill`]). A part's bytes stay below 2 GiB (the offsets are
/// 4-byte).
pub struct StringBytesBuilder {
    offsets: Vec<i32>,
    bytes: Vec<u8>,
    validity: ValidityBuilder,
    /// About how many rows the part holds: the first piece's bytes a row
    /// size the bytes' room for all of them at once.
    rows_hint: usize,
}

/// Bytes a part's strings may take: its offsets are 4-byte.
const MAX_BYTES: usize = i32::MAX as usize;

impl StringBytesBuilder {
    /// Whether a column of `data_type` can be kept as its strings' bytes:
    /// a string column.
    pub fn accepts(data_type: &DataType) -> bool {
        matches!(data_type, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
    }

    /// A builder for a column of `data_type`, or `None` where it is not a
    /// string type, with room for the offsets of about `rows` rows.
    pub fn with_rows_hint(data_type: &DataType, rows: usize) -> Option<Self> {
        if !Self::accepts(data_type) {
            return None;
        }
        let mut offsets = empty_for_fill(initial_room(rows + 1));
        offsets.push(0);
        Some(Self {
            offsets,
            bytes: Vec::new(),
            validity: ValidityBuilder::default(),
            rows_hint: rows,
        })
    }

    fn rows(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Appends `piece`'s rows, or returns `false` where it is not a string
    /// array or the part's bytes would reach 2 GiB (the builder is then of
    /// no further use).
    pub fn push(&mut self, piece: &ArrayRef) -> bool {
        let rows_before = self.rows();
        let appended = match piece.data_type() {
            DataType::Utf8View => self.append_views(piece.as_string_view()),
            DataType::Utf8 => self.append_offset_strings(piece.as_string::<i32>()),
            DataType::LargeUtf8 => self.append_offset_strings(piece.as_string::<i64>()),
            _ => false,
        };
        if appended {
            self.validity.push(piece, rows_before);
        }
        appended
    }

    /// Makes room for a piece of `rows` rows and `bytes` bytes, or returns
    /// `false` where the part's bytes would reach [`MAX_BYTES`]. The first
    /// piece makes room for the whole part at its bytes a row (an eighth
    /// more): growing by doubling would map and copy the bytes several
    /// times over, which for a part's comments cost more than the copy.
    fn make_room(&mut self, rows: usize, bytes: usize) -> bool {
        if self.bytes.len() + bytes >= MAX_BYTES {
            return false;
        }
        if self.bytes.capacity() == 0 && rows > 0 {
            let part_rows = self.rows_hint.max(rows) as f64;
            let expected = (bytes as f64 / rows as f64 * part_rows * 1.125) as usize;
            // Room never written is never mapped: a guess too large costs
            // address space only.
            self.bytes = empty_for_fill(expected.clamp(bytes, MAX_BYTES));
        }
        room_for(&mut self.bytes, bytes);
        room_for(&mut self.offsets, rows);
        true
    }

    /// Appends string views' bytes: each view's inline bytes or its
    /// buffer's range, copied without building a `&str` a row.
    fn append_views(&mut self, strings: &StringViewArray) -> bool {
        let views = strings.views();
        let nulls = strings.nulls().filter(|n| n.null_count() > 0);
        let length = |row: usize, view: u128| match &nulls {
            Some(nulls) if nulls.is_null(row) => 0,
            _ => view as u32 as usize,
        };
        let bytes: usize = views.iter().enumerate().map(|(row, &view)| length(row, view)).sum();
        if !self.make_room(views.len(), bytes) {
            return false;
        }
        let buffers = strings.data_buffers();
        for (row, &view) in views.iter().enumerate() {
            let len = length(row, view);
            if len > 12 {
                let (buffer, offset) = ((view >> 64) as u32 as usize, (view >> 96) as u32 as usize);
                self.bytes.extend_from_slice(&buffers[buffer][offset..offset + len]);
            } else if len > 0 {
                self.bytes.extend_from_slice(&view.to_le_bytes()[4..4 + len]);
            }
            // Below MAX_BYTES: checked for the whole piece above.
            self.offsets.push(self.bytes.len() as i32);
        }
        true
    }

    fn append_offset_strings<O: OffsetSizeTrait>(&mut self, strings: &GenericStringArray<O>) -> bool {
        let offsets = strings.value_offsets();
        let (first, last) = (offsets[0].as_usize(), offsets[offsets.len() - 1].as_usize());
        if !self.make_room(strings.len(), last - first) {
            return false;
        }
        match strings.nulls().filter(|n| n.null_count() > 0) {
            // Every row's bytes at once, their offsets moved.
            None => {
                let base = self.bytes.len() as i64 - first as i64;
                self.bytes.extend_from_slice(&strings.value_data()[first..last]);
                self.offsets
                    .extend(offsets[1..].iter().map(|end| (end.as_usize() as i64 + base) as i32));
            }
            // A NULL row's slot may hold bytes: it becomes empty.
            Some(nulls) => {
                for row in 0..strings.len() {
                    if nulls.is_valid(row) {
                        self.bytes.extend_from_slice(strings.value(row).as_bytes());
                    }
                    self.offsets.push(self.bytes.len() as i32);
                }
            }
        }
        true
    }

    /// The column of every piece pushed: the offsets as its (narrow)
    /// values, its bytes beside them.
    pub fn finish(self) -> HostWords {
        let rows = self.rows();
        HostWords {
            rows,
            kind: WordKind::Bytes,
            values: WordValues::Narrow(self.offsets),
            validity: self.validity.finish(rows),
            dictionary: None,
            bytes: Some(self.bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use datafusion::arrow::array::{LargeStringArray, StringArray, StringViewArray};

    fn strings_of(words: &HostWords) -> Vec<Option<String>> {
        let WordValues::Narrow(offsets) = &words.values else {
            panic!("offsets are 4-byte");
        };
        let bytes = words.bytes.as_ref().unwrap();
        (0..words.rows)
            .map(|r| {
                let valid = words
                    .validity
                    .as_ref()
                    .is_none_or(|v| (v[r / 64] >> (r % 64)) & 1 == 1);
                let (from, to) = (offsets[r] as usize, offsets[r + 1] as usize);
                valid.then(|| String::from_utf8(bytes[from..to].to_vec()).unwrap())
            })
            .collect()
    }

    #[test]
    fn pieces_of_every_string_type_become_bytes_and_offsets_with_their_nulls() {
        let long = "a string longer than a view's twelve inline bytes";
        let values = [Some("é€"), None, Some(""), Some(long), Some("x")];
        let pieces: Vec<ArrayRef> = vec![
            Arc::new(StringViewArray::from(values.to_vec())),
            Arc::new(StringArray::from(values.to_vec()).slice(1, 4)),
            Arc::new(LargeStringArray::from(vec![Some("last")])),
            Arc::new(StringViewArray::from(Vec::<Option<&str>>::new())),
        ];
        let mut builder = StringBytesBuilder::with_rows_hint(&DataType::Utf8View, 4).unwrap();
        for piece in &pieces {
            assert!(builder.push(piece));
        }
        let words = builder.finish();
        assert_eq!(words.kind, WordKind::Bytes);
        assert_eq!(words.rows, 10);
        let mut expected: Vec<Option<String>> = values.iter().map(|v| v.map(String::from)).collect();
        expected.extend(values[1..].iter().map(|v| v.map(String::from)));
        expected.push(Some("last".into()));
        assert_eq!(strings_of(&words), expected);
        // NULL rows take no bytes.
        let total: usize = expected.iter().flatten().map(String::len).sum();
        assert_eq!(words.bytes.as_ref().unwrap().len(), total);
        assert_eq!(words.validity, Some(vec![0b11_1101_1101]));
    }

    #[test]
    fn columns_without_nulls_have_no_validity_and_other_types_are_refused() {
        let mut builder = StringBytesBuilder::with_rows_hint(&DataType::Utf8, 0).unwrap();
        assert!(builder.push(&(Arc::new(StringArray::from(vec!["a", "bc"])) as ArrayRef)));
        let words = builder.finish();
        assert_eq!(words.validity, None);
        assert_eq!(strings_of(&words), vec![Some("a".into()), Some("bc".into())]);
        assert!(StringBytesBuilder::with_rows_hint(&DataType::Int64, 1).is_none());
        let mut builder = StringBytesBuilder::with_rows_hint(&DataType::Utf8, 0).unwrap();
        let ints: ArrayRef = Arc::new(datafusion::arrow::array::Int64Array::from(vec![1]));
        assert!(!builder.push(&ints));
    }

    /// The strings of `piece` (a string array of any type), NULL as `None`.
    fn expected(piece: &ArrayRef) -> Vec<Option<String>> {
        let as_utf8 = datafusion::arrow::compute::cast(piece, &DataType::Utf8).unwrap();
        as_utf8.as_string::<i32>().iter().map(|v| v.map(String::from)).collect()
    }

    #[test]
    fn sliced_pieces_buffers_of_views_and_null_slots_holding_bytes_keep_each_rows_string() {
        use datafusion::arrow::array::StringViewBuilder;
        use datafusion::arrow::buffer::{Buffer, NullBuffer, OffsetBuffer};
        // Views in several data buffers (small blocks), long and short.
        let mut views = StringViewBuilder::new().with_fixed_block_size(64);
        for i in 0..200 {
            match i % 7 {
                0 => views.append_null(),
                1 => views.append_value(""),
                _ => views.append_value(format!("{i} {}", "long text ".repeat(i % 4))),
            }
        }
        let views = views.finish();
        assert!(views.data_buffers().len() > 2);
        // A NULL slot holding bytes, as Arrow allows: it becomes empty.
        let offsets = OffsetBuffer::new(vec![0i32, 3, 8, 10].into());
        let hidden = StringArray::new(
            offsets,
            Buffer::from_slice_ref(b"abcHIDDENxy"[..10].as_ref()),
            Some(NullBuffer::from(vec![true, false, true])),
        );
        let words: Vec<String> = (0..300).map(|i| format!("w{i}")).collect();
        let plain = StringArray::from_iter_values(words.iter());
        let large = LargeStringArray::from_iter_values(words.iter());
        let pieces: Vec<ArrayRef> = vec![
            Arc::new(views.slice(3, 150)),
            Arc::new(hidden),
            Arc::new(plain.slice(17, 100)),
            Arc::new(large.slice(250, 50)),
            Arc::new(views),
        ];
        // A hint below, at and above the rows: the room grows or not.
        let rows: usize = pieces.iter().map(|p| p.len()).sum();
        for hint in [0, 10, rows, 100 * rows] {
            let mut builder = StringBytesBuilder::with_rows_hint(&DataType::Utf8View, hint).unwrap();
            let mut want = Vec::new();
            for piece in &pieces {
                assert!(builder.push(piece));
                want.extend(expected(piece));
            }
            let words = builder.finish();
            assert_eq!(words.rows, rows);
            assert_eq!(strings_of(&words), want, "rows hint {hint}");
            let total: usize = want.iter().flatten().map(String::len).sum();
            assert_eq!(words.bytes.as_ref().unwrap().len(), total, "NULL rows take no bytes");
        }
    }
}
