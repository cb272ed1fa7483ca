//! Arrow columns as device words and back: record batches in device memory
//! ([`device_batch`]), join keys as one `u64` a row
//! ([`keys`], floats first as integers: [`float_keys`]), sort keys as order-preserving codes ([`ordered_keys`]), group
//! keys and the check of hashed ones ([`group_keys`]), and aggregate inputs
//! and results ([`words`]), table columns as the column cache keeps them
//! ([`table_words`], strings of few values as codes: [`string_codes`], of many as
//! their bytes: [`string_bytes`]). Host work only; the device sees plain words.

pub(crate) mod concat;
pub(crate) mod float_keys;
pub mod device_batch;
pub(crate) mod group_keys;
pub(crate) mod keys;
pub(crate) mod ordered_keys;
pub(crate) mod string_bytes;
pub(crate) mod string_codes;
pub mod table_words;
pub(crate) mod words;
