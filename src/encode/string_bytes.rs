//! A string column as the device column cache keeps it where its values
//! are too many to code (names, comments): its bytes end to end and
//! `rows + 1` 4-byte offsets into them, a NULL row an empty string there
//! (its validity says NULL). The device reads such a column only in
//! `LIKE`, `=`, `<>`, `IN` with text and `IS NULL`. Host work only.

use datafusion::arrow::array::{Array, ArrayRef, AsArray, GenericStringArray, OffsetSizeTrait};
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
}

impl StringBytesBuilder {
    /// A builder for a column of `data_type`, or `None` where it is not a
    /// string type, with room for the offsets of about `rows` rows.
    pub fn with_rows_hint(data_type: &DataType, rows: usize) -> Option<Self> {
        if !matches!(data_type, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) {
            return None;
        }
        let mut offsets = empty_for_fill(initial_room(rows + 1));
        offsets.push(0);
        Some(Self {
            offsets,
            bytes: Vec::new(),
            validity: ValidityBuilder::default(),
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
            DataType::Utf8View => {
                let strings = piece.as_string_view();
                // At most the bytes every view names (a NULL's too).
                let bytes: usize = strings.views().iter().map(|&view| view as u32 as usize).sum();
                room_for(&mut self.bytes, bytes);
                self.append((0..strings.len()).map(|r| (!strings.is_null(r)).then(|| strings.value(r))))
            }
            DataType::Utf8 => self.append_offset_strings(piece.as_string::<i32>()),
            DataType::LargeUtf8 => self.append_offset_strings(piece.as_string::<i64>()),
            _ => false,
        };
        if appended {
            self.validity.push(piece, rows_before);
        }
        appended
    }

    fn append_offset_strings<O: OffsetSizeTrait>(&mut self, strings: &GenericStringArray<O>) -> bool {
        let offsets = strings.value_offsets();
        let bytes = offsets[offsets.len() - 1].as_usize() - offsets[0].as_usize();
        room_for(&mut self.bytes, bytes);
        self.append((0..strings.len()).map(|r| (!strings.is_null(r)).then(|| strings.value(r))))
    }

    /// Appends each value's bytes (nothing for a NULL).
    fn append<'a>(&mut self, values: impl Iterator<Item = Option<&'a str>>) -> bool {
        room_for(&mut self.offsets, values.size_hint().0);
        for value in values {
            self.bytes.extend_from_slice(value.unwrap_or_default().as_bytes());
            match i32::try_from(self.bytes.len()) {
                Ok(end) => self.offsets.push(end),
                Err(_) => return false,
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
}
