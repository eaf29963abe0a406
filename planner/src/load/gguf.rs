//! GGUF reader (versions 2 and 3, little-endian), as written by gguf-py and read by ggml
//! (`ggml/docs/gguf.md`, `ggml/src/gguf.cpp`).
//!
//! Layout: magic `GGUF`, `u32` version, `u64` tensor count, `u64` metadata count; the metadata
//! key/value pairs; one info record per tensor (name, `u32` n_dims, `u64 ne[n_dims]`, `u32`
//! ggml type, `u64` offset); padding to `general.alignment` (default 32); the data section,
//! in which each tensor starts at its offset. Strings are a `u64` length and UTF-8 bytes.
//!
//! The whole file is read into memory (this crate forbids `unsafe`, which memory-mapping
//! needs). Nothing in the file is trusted: every count, length and offset is checked with
//! overflow-checked arithmetic against the bytes actually present before anything is
//! allocated or sliced, and each problem is a specific [`GgufError`] naming the file (and the
//! tensor or key).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use edge_schema::DType;

use super::{LoadError, RawTensor, TensorSource};

/// `GGUF` as a little-endian `u32`.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Data-section alignment when `general.alignment` is absent (ggml `GGUF_DEFAULT_ALIGNMENT`).
pub const GGUF_DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a tensor may have (ggml `GGML_MAX_DIMS`).
pub const GGUF_MAX_DIMS: u32 = 4;
/// Deepest nesting of arrays inside arrays that the reader accepts.
const MAX_ARRAY_DEPTH: usize = 4;

/// Errors of reading a GGUF file. `path` is the file as given to [`GgufFile::open`] (or the
/// name given to [`GgufFile::from_bytes`]); byte offsets are from the start of the file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a GGUF file (magic {found:02x?}, expected \"GGUF\")")]
    BadMagic { path: String, found: Vec<u8> },
    #[error("{path}: GGUF version {version} is not supported (expected 2 or 3, little-endian)")]
    UnsupportedVersion { path: String, version: u32 },
    #[error("{path}: truncated: {what} at byte {offset} needs {needed} bytes but the file has {file_len}")]
    Truncated {
        path: String,
        what: String,
        offset: u64,
        needed: u64,
        file_len: u64,
    },
    #[error("{path}: {what} count {count} is impossible: the {remaining} bytes left in the file hold at most {max}")]
    AbsurdCount {
        path: String,
        what: String,
        count: u64,
        remaining: u64,
        max: u64,
    },
    #[error("{path}: {what} at byte {offset} is not valid UTF-8")]
    BadUtf8 {
        path: String,
        what: String,
        offset: u64,
    },
    #[error("{path}: metadata `{key}` has unknown value type {type_id}")]
    UnknownValueType {
        path: String,
        key: String,
        type_id: u32,
    },
    #[error("{path}: metadata `{key}` nests arrays deeper than {MAX_ARRAY_DEPTH} levels")]
    NestingTooDeep { path: String, key: String },
    #[error("{path}: metadata key `{key}` appears twice")]
    DuplicateKey { path: String, key: String },
    #[error(
        "{path}: general.alignment must be a non-zero power of two stored as u32, found {found}"
    )]
    BadAlignment { path: String, found: String },
    #[error("{path}: tensor `{tensor}` has {n_dims} dimensions (at most {GGUF_MAX_DIMS})")]
    TooManyDims {
        path: String,
        tensor: String,
        n_dims: u32,
    },
    #[error("{path}: tensor `{tensor}` has ggml type id {type_id}, which is not supported (supported: f32, f16, bf16, i32, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K..q6_K)")]
    UnknownTensorType {
        path: String,
        tensor: String,
        type_id: u32,
    },
    #[error("{path}: tensor `{tensor}` with ne {ne:?} ({dtype}): {reason}")]
    BadShape {
        path: String,
        tensor: String,
        ne: Vec<u64>,
        dtype: DType,
        reason: String,
    },
    #[error(
        "{path}: tensor `{tensor}` offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        path: String,
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    #[error("{path}: tensor `{tensor}` occupies bytes {start}..{end} but the file has {file_len}")]
    TensorOutOfBounds {
        path: String,
        tensor: String,
        start: u64,
        end: u64,
        file_len: u64,
    },
    #[error("{path}: tensor `{tensor}` appears twice")]
    DuplicateTensor { path: String, tensor: String },
}

/// GGUF metadata value type ids (`enum gguf_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgufValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl GgufValueType {
    /// The type for id `id` (0..=12), or `None`.
    pub fn from_id(id: u32) -> Option<GgufValueType> {
        use GgufValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The fewest bytes one value of this type occupies in a file (strings: the length;
    /// arrays: the element type and count).
    fn min_bytes(self) -> u64 {
        use GgufValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// An array: the element type (kept so that an empty array still has one) and the items.
    Array(GgufValueType, Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    /// An integer value of any width, when it is non-negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v as u64),
            GgufValue::U16(v) => Some(v as u64),
            GgufValue::U32(v) => Some(v as u64),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// An integer value of any width as `i64`, when it fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::I8(v) => Some(v as i64),
            GgufValue::I16(v) => Some(v as i64),
            GgufValue::I32(v) => Some(v as i64),
            GgufValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// A float or integer value as `f64`.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v as f64),
            GgufValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// A bool value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The items of an array value.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(_, items) => Some(items),
            _ => None,
        }
    }
}

/// One tensor's info record, validated against the file.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufTensorInfo {
    /// Name as stored (e.g. `model.diffusion_model.blocks.0.attn.qkv.weight`).
    pub name: String,
    /// ggml dimension order: `ne[0]` is the innermost (contiguous) dimension.
    pub ne: Vec<u64>,
    /// The same dimensions **outermost-first** (PyTorch/numpy order, the reverse of `ne`):
    /// a Linear weight stored with `ne = [in, out]` has `shape = [out, in]`.
    pub shape: Vec<usize>,
    /// Storage type (from the ggml type id).
    pub dtype: DType,
    /// Offset of the first byte from the start of the data section (a multiple of the
    /// alignment).
    pub offset: u64,
    /// Bytes the tensor occupies: `dtype.bytes_for(Π ne)`.
    pub n_bytes: u64,
}

/// A GGUF file read into memory: its metadata, tensor infos and data.
pub struct GgufFile {
    /// The file name given to [`GgufFile::open`] / [`GgufFile::from_bytes`] (for errors).
    pub path: String,
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata key/value pairs, sorted by key.
    pub metadata: BTreeMap<String, GgufValue>,
    /// Tensor infos in file order.
    pub tensors: Vec<GgufTensorInfo>,
    /// Data-section alignment (`general.alignment`, default 32).
    pub alignment: u64,
    /// Byte offset of the data section in the file.
    pub data_offset: u64,
    bytes: Vec<u8>,
    by_name: HashMap<String, usize>,
}

impl GgufFile {
    /// Reads and validates the GGUF file at `path`.
    ///
    /// Errors: [`GgufError::Io`] when the file cannot be read, otherwise those of
    /// [`GgufFile::from_bytes`].
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| GgufError::Io {
            path: name.clone(),
            source,
        })?;
        GgufFile::from_bytes(name, bytes)
    }

    /// Parses and validates GGUF bytes; `name` is used in errors.
    ///
    /// Errors: a wrong magic, a version other than 2 or 3, a truncated header, counts that
    /// the file cannot hold, invalid UTF-8, unknown metadata types, duplicate keys or tensor
    /// names, a bad `general.alignment`, more than 4 dimensions, an unsupported ggml type,
    /// a shape whose rows are not whole blocks or whose size overflows, a misaligned tensor
    /// offset, or a tensor extending past the end of the file.
    pub fn from_bytes(name: impl Into<String>, bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        let path = name.into();
        let mut r = Reader {
            bytes: &bytes,
            pos: 0,
            path: &path,
        };
        let magic = r.take(4, "magic")?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic {
                path: path.clone(),
                found: magic.to_vec(),
            });
        }
        let version = r.u32("version")?;
        if version != 2 && version != 3 {
            return Err(GgufError::UnsupportedVersion {
                path: path.clone(),
                version,
            });
        }
        let n_tensors = r.u64("tensor count")?;
        let n_kv = r.u64("metadata count")?;
        r.check_count("metadata entry", n_kv, 8 + 4 + 1)?;

        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = r.string("metadata key")?;
            let type_id = r.u32("metadata value type")?;
            let value = r.value(&key, type_id, 0)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(GgufError::DuplicateKey {
                    path: path.clone(),
                    key,
                });
            }
        }

        let alignment = match metadata.get("general.alignment") {
            None => GGUF_DEFAULT_ALIGNMENT,
            Some(GgufValue::U32(a)) if *a != 0 && a.is_power_of_two() => *a as u64,
            Some(other) => {
                return Err(GgufError::BadAlignment {
                    path: path.clone(),
                    found: format!("{other:?}"),
                })
            }
        };

        r.check_count("tensor", n_tensors, 8 + 4 + 4 + 8)?;
        let mut raw = Vec::new();
        for _ in 0..n_tensors {
            let name = r.string("tensor name")?;
            let n_dims = r.u32("tensor n_dims")?;
            if n_dims > GGUF_MAX_DIMS {
                return Err(GgufError::TooManyDims {
                    path: path.clone(),
                    tensor: name,
                    n_dims,
                });
            }
            let mut ne = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                ne.push(r.u64("tensor dimension")?);
            }
            let type_id = r.u32("tensor type")?;
            let offset = r.u64("tensor offset")?;
            raw.push((name, ne, type_id, offset));
        }

        let file_len = bytes.len() as u64;
        let data_offset =
            align_up(r.pos as u64, alignment).ok_or_else(|| GgufError::Truncated {
                path: path.clone(),
                what: "data section".into(),
                offset: r.pos as u64,
                needed: alignment,
                file_len,
            })?;
        let mut tensors = Vec::with_capacity(raw.len());
        let mut by_name = HashMap::with_capacity(raw.len());
        for (name, ne, type_id, offset) in raw {
            let info = validate_tensor(
                &path,
                name,
                ne,
                type_id,
                offset,
                alignment,
                data_offset,
                file_len,
            )?;
            if by_name.insert(info.name.clone(), tensors.len()).is_some() {
                return Err(GgufError::DuplicateTensor {
                    path: path.clone(),
                    tensor: info.name,
                });
            }
            tensors.push(info);
        }
        Ok(GgufFile {
            path,
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
            bytes,
            by_name,
        })
    }

    /// The info record of tensor `name`.
    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw little-endian bytes of tensor `name` (exactly `n_bytes` long; its ggml block
    /// layout for quantized types). Alignment in memory is not guaranteed.
    pub fn tensor_bytes(&self, name: &str) -> Option<&[u8]> {
        let t = self.tensor_info(name)?;
        // Bounds were checked in `from_bytes`; `get` keeps this total anyway.
        let start = usize::try_from(self.data_offset.checked_add(t.offset)?).ok()?;
        let end = start.checked_add(usize::try_from(t.n_bytes).ok()?)?;
        self.bytes.get(start..end)
    }

    /// Metadata value `key`.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// Metadata string `key`, when present and a string.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.metadata.get(key).and_then(GgufValue::as_str)
    }
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .field("file_len", &self.bytes.len())
            .finish()
    }
}

impl TensorSource for GgufFile {
    fn tensor(&self, name: &str) -> Result<Option<RawTensor<'_>>, LoadError> {
        let (Some(info), Some(data)) = (self.tensor_info(name), self.tensor_bytes(name)) else {
            return Ok(None);
        };
        Ok(Some(RawTensor {
            dtype: info.dtype,
            shape: info.shape.clone(),
            data,
        }))
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.tensors.iter().map(|t| t.name.clone()).collect();
        names.sort();
        names
    }

    fn describe(&self) -> String {
        format!("GGUF file {}", self.path)
    }
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    Some(x.checked_add(a - 1)? / a * a)
}

/// Checks one tensor record and computes its shape and size.
fn validate_tensor(
    path: &str,
    name: String,
    ne: Vec<u64>,
    type_id: u32,
    offset: u64,
    alignment: u64,
    data_offset: u64,
    file_len: u64,
) -> Result<GgufTensorInfo, GgufError> {
    let Some(dtype) = DType::from_ggml_type_id(type_id) else {
        return Err(GgufError::UnknownTensorType {
            path: path.into(),
            tensor: name,
            type_id,
        });
    };
    let bad = |reason: String, name: String, ne: Vec<u64>| GgufError::BadShape {
        path: path.into(),
        tensor: name,
        ne,
        dtype,
        reason,
    };
    let row = ne.first().copied().unwrap_or(1);
    if !row.is_multiple_of(dtype.block_size() as u64) {
        let reason = format!(
            "ne[0] = {row} is not a multiple of the block size {}",
            dtype.block_size()
        );
        return Err(bad(reason, name, ne));
    }
    let Some(n_elements) = ne.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)) else {
        return Err(bad("the element count overflows".into(), name, ne));
    };
    let Some(n_bytes) = dtype.bytes_for(n_elements) else {
        return Err(bad("the byte size overflows".into(), name, ne));
    };
    let mut shape = Vec::with_capacity(ne.len());
    for &d in ne.iter().rev() {
        match usize::try_from(d) {
            Ok(d) => shape.push(d),
            Err(_) => {
                return Err(bad(
                    format!("dimension {d} does not fit in memory"),
                    name,
                    ne,
                ))
            }
        }
    }
    if !offset.is_multiple_of(alignment) {
        return Err(GgufError::MisalignedTensor {
            path: path.into(),
            tensor: name,
            offset,
            alignment,
        });
    }
    let start = data_offset.checked_add(offset);
    let end = start.and_then(|s| s.checked_add(n_bytes));
    match (start, end) {
        (Some(_), Some(end)) if end <= file_len => {}
        _ => {
            return Err(GgufError::TensorOutOfBounds {
                path: path.into(),
                tensor: name,
                start: start.unwrap_or(u64::MAX),
                end: end.unwrap_or(u64::MAX),
                file_len,
            })
        }
    }
    Ok(GgufTensorInfo {
        name,
        ne,
        shape,
        dtype,
        offset,
        n_bytes,
    })
}

/// A bounds-checked little-endian cursor over the file bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a str,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        let truncated = || GgufError::Truncated {
            path: self.path.into(),
            what: what.into(),
            offset: self.pos as u64,
            needed: n,
            file_len: self.bytes.len() as u64,
        };
        let n_usize = usize::try_from(n).map_err(|_| truncated())?;
        let end = self.pos.checked_add(n_usize).ok_or_else(truncated)?;
        let s = self.bytes.get(self.pos..end).ok_or_else(truncated)?;
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Fails unless `count` items of at least `min_bytes` each fit in the rest of the file.
    fn check_count(&self, what: &str, count: u64, min_bytes: u64) -> Result<(), GgufError> {
        let max = self.remaining() / min_bytes;
        if count > max {
            return Err(GgufError::AbsurdCount {
                path: self.path.into(),
                what: what.into(),
                count,
                remaining: self.remaining(),
                max,
            });
        }
        Ok(())
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let at = self.pos as u64;
        let s = self.take(len, what)?;
        match std::str::from_utf8(s) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::BadUtf8 {
                path: self.path.into(),
                what: what.into(),
                offset: at,
            }),
        }
    }

    fn value(&mut self, key: &str, type_id: u32, depth: usize) -> Result<GgufValue, GgufError> {
        let Some(ty) = GgufValueType::from_id(type_id) else {
            return Err(GgufError::UnknownValueType {
                path: self.path.into(),
                key: key.into(),
                type_id,
            });
        };
        let what = || format!("value of `{key}`");
        Ok(match ty {
            GgufValueType::U8 => GgufValue::U8(u8::from_le_bytes(self.array(&what())?)),
            GgufValueType::I8 => GgufValue::I8(i8::from_le_bytes(self.array(&what())?)),
            GgufValueType::U16 => GgufValue::U16(u16::from_le_bytes(self.array(&what())?)),
            GgufValueType::I16 => GgufValue::I16(i16::from_le_bytes(self.array(&what())?)),
            GgufValueType::U32 => GgufValue::U32(u32::from_le_bytes(self.array(&what())?)),
            GgufValueType::I32 => GgufValue::I32(i32::from_le_bytes(self.array(&what())?)),
            GgufValueType::F32 => GgufValue::F32(f32::from_le_bytes(self.array(&what())?)),
            GgufValueType::Bool => GgufValue::Bool(self.array::<1>(&what())?[0] != 0),
            GgufValueType::String => GgufValue::String(self.string(&what())?),
            GgufValueType::U64 => GgufValue::U64(u64::from_le_bytes(self.array(&what())?)),
            GgufValueType::I64 => GgufValue::I64(i64::from_le_bytes(self.array(&what())?)),
            GgufValueType::F64 => GgufValue::F64(f64::from_le_bytes(self.array(&what())?)),
            GgufValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::NestingTooDeep {
                        path: self.path.into(),
                        key: key.into(),
                    });
                }
                let elem_id = self.u32(&what())?;
                let Some(elem) = GgufValueType::from_id(elem_id) else {
                    return Err(GgufError::UnknownValueType {
                        path: self.path.into(),
                        key: key.into(),
                        type_id: elem_id,
                    });
                };
                let count = self.u64(&what())?;
                self.check_count(&format!("array `{key}` element"), count, elem.min_bytes())?;
                let mut items = Vec::with_capacity(count.min(1 << 16) as usize);
                for _ in 0..count {
                    items.push(self.value(key, elem_id, depth + 1)?);
                }
                GgufValue::Array(elem, items)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixtures() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
    }

    fn quant_vectors() -> GgufFile {
        GgufFile::open(fixtures().join("gguf-quant-vectors/quant_vectors.gguf"))
            .expect("open quant_vectors.gguf")
    }

    /// Every tensor of `quant_vectors.gguf` has the manifest's name, type and `ne`, and its
    /// bytes equal the safetensors fixture's `T.bytes` (`input_f32` its f32 bytes).
    #[test]
    fn quant_vectors_match_safetensors() {
        let dir = fixtures().join("gguf-quant-vectors");
        let g = quant_vectors();
        let st_bytes =
            std::fs::read(dir.join("quant_vectors.safetensors")).expect("read safetensors");
        let st = ::safetensors::SafeTensors::deserialize(&st_bytes).expect("parse safetensors");
        let manifest: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.join("manifest.json")).expect("read manifest"),
        )
        .expect("parse manifest");
        let types = manifest["types"].as_object().expect("manifest.types");
        assert_eq!(g.tensors.len(), types.len() + 1);
        for (key, t) in types {
            let name = t["gguf_tensor"]["name"].as_str().expect("gguf_tensor.name");
            let ne: Vec<u64> = t["gguf_tensor"]["ggml_ne"]
                .as_array()
                .expect("ggml_ne")
                .iter()
                .map(|v| v.as_u64().expect("ne"))
                .collect();
            let info = g
                .tensor_info(name)
                .unwrap_or_else(|| panic!("{name} missing"));
            assert_eq!(info.dtype, DType::from_name(key).expect("dtype"), "{name}");
            assert_eq!(info.ne, ne, "{name}");
            assert_eq!(
                info.shape,
                ne.iter().rev().map(|&d| d as usize).collect::<Vec<_>>(),
                "{name}"
            );
            let want = st.tensor(&format!("{key}.bytes")).expect("T.bytes");
            assert_eq!(g.tensor_bytes(name), Some(want.data()), "{name}");
        }
        let input = g.tensor_info("input_f32").expect("input_f32");
        assert_eq!(
            (input.dtype, input.shape.clone()),
            (DType::F32, vec![10, 256])
        );
        let want = st.tensor("input_f32").expect("input_f32");
        assert_eq!(g.tensor_bytes("input_f32"), Some(want.data()));
        assert_eq!(g.alignment, GGUF_DEFAULT_ALIGNMENT);
        assert!(g.version == 2 || g.version == 3);
        assert!(g.tensor_bytes("nope").is_none());
    }

    /// Every PixArt GGUF fixture (sigma F16/Q8_0/Q4_0, alpha F16/Q8_0): each tensor's type,
    /// `ne` and shape against `reference/manifest.json → gguf.files.<T>.tensors`, and the
    /// `pixart.*` metadata against `gguf.metadata`.
    #[test]
    fn pixart_files_match_manifest() {
        let mut checked = 0;
        for fixture in ["pixart-sigma-tiny", "pixart-alpha-tiny"] {
            let dir = fixtures().join(fixture);
            let manifest: serde_json::Value = serde_json::from_slice(
                &std::fs::read(dir.join("reference/manifest.json")).expect("read manifest"),
            )
            .expect("parse manifest");
            let files = manifest["gguf"]["files"].as_object().expect("gguf.files");
            for (file_type, file) in files {
                let g = GgufFile::open(dir.join(file["file"].as_str().expect("file")))
                    .expect("open gguf");
                check_pixart_file(&g, file, &manifest["gguf"]["metadata"]);
                assert!(
                    g.get("general.file_type").is_some(),
                    "{fixture} {file_type}"
                );
                checked += 1;
            }
        }
        assert_eq!(checked, 5);
    }

    fn check_pixart_file(g: &GgufFile, file: &serde_json::Value, metadata: &serde_json::Value) {
        let listed = file["tensors"].as_array().expect("tensors");
        assert_eq!(g.tensors.len(), listed.len(), "{}", g.path);
        for t in listed {
            let name = t["name"].as_str().expect("name");
            let info = g
                .tensor_info(name)
                .unwrap_or_else(|| panic!("{}: {name} missing", g.path));
            let ty = t["ggml_type"].as_str().expect("ggml_type");
            assert_eq!(info.dtype, DType::from_name(ty).expect("type"), "{name}");
            let ne: Vec<u64> = t["ggml_ne"]
                .as_array()
                .expect("ne")
                .iter()
                .map(|v| v.as_u64().expect("ne"))
                .collect();
            let shape: Vec<usize> = t["numpy_shape"]
                .as_array()
                .expect("shape")
                .iter()
                .map(|v| v.as_u64().expect("dim") as usize)
                .collect();
            assert_eq!(info.ne, ne, "{name}");
            assert_eq!(info.shape, shape, "{name}");
            let raw = g.tensor(name).expect("tensor").expect("present");
            assert_eq!(raw.shape, shape, "{name}");
            assert_eq!(
                raw.data.len() as u64,
                info.dtype
                    .bytes_for(shape.iter().product::<usize>() as u64)
                    .expect("size")
            );
        }
        assert_eq!(g.get_str("general.architecture"), Some("pixart"));
        for (k, v) in metadata.as_object().expect("metadata") {
            let got = g
                .get(k)
                .unwrap_or_else(|| panic!("{}: metadata {k} missing", g.path));
            match v {
                serde_json::Value::String(s) => assert_eq!(got.as_str(), Some(s.as_str()), "{k}"),
                serde_json::Value::Bool(b) => assert_eq!(got.as_bool(), Some(*b), "{k}"),
                serde_json::Value::Number(n) => {
                    let want = n.as_f64().expect("number");
                    let have = got
                        .as_f64()
                        .unwrap_or_else(|| panic!("{k}: {got:?} is not a number"));
                    assert!(
                        (have - want).abs() <= 1e-6 * want.abs(),
                        "{k}: {have} vs {want}"
                    );
                }
                other => panic!("{k}: unexpected manifest value {other:?}"),
            }
        }
        let names = g.names();
        assert!(names.windows(2).all(|w| w[0] < w[1]));
    }

    /// Overwriting any single header byte with 0x00, 0x80 or 0xFF never panics.
    #[test]
    fn header_byte_corruption_never_panics() {
        let good = quant_vectors_bytes();
        let end = quant_vectors().data_offset as usize;
        for i in 0..end {
            for v in [0x00, 0x80, 0xFF] {
                let mut b = good.clone();
                b[i] = v;
                let _ = GgufFile::from_bytes("t", b);
            }
        }
    }

    fn quant_vectors_bytes() -> Vec<u8> {
        std::fs::read(fixtures().join("gguf-quant-vectors/quant_vectors.gguf"))
            .expect("read quant_vectors.gguf")
    }

    /// Byte offset of the tensor info record of `name` (its name string's length field).
    fn info_offset(bytes: &[u8], name: &str) -> usize {
        let mut needle = (name.len() as u64).to_le_bytes().to_vec();
        needle.extend_from_slice(name.as_bytes());
        bytes
            .windows(needle.len())
            .position(|w| w == needle.as_slice())
            .expect("info record")
    }

    /// Truncating the file anywhere before the end of its last tensor gives an error (never a
    /// panic): inside the header a `Truncated`/`AbsurdCount`, inside the data a
    /// `TensorOutOfBounds` naming the tensor cut off. (Trailing padding may be cut.)
    #[test]
    fn truncations_are_errors() {
        let bytes = quant_vectors_bytes();
        let g = quant_vectors();
        let data_offset = g.data_offset as usize;
        let data_end = data_offset
            + g.tensors
                .iter()
                .map(|t| (t.offset + t.n_bytes) as usize)
                .max()
                .expect("tensors");
        let mut cuts: Vec<usize> = (0..data_offset.min(600)).collect();
        cuts.extend((data_offset - 200..data_offset).step_by(7));
        cuts.extend([data_offset + 1, bytes.len() / 2, data_end - 1]);
        for cut in cuts {
            let err = GgufFile::from_bytes("cut.gguf", bytes[..cut].to_vec())
                .expect_err("truncated file accepted");
            let msg = err.to_string();
            assert!(msg.starts_with("cut.gguf: "), "{msg}");
            if cut < 4 {
                assert!(matches!(err, GgufError::Truncated { .. }), "{cut}: {err}");
            } else if cut >= data_offset {
                match &err {
                    GgufError::TensorOutOfBounds { tensor, .. } => {
                        assert!(msg.contains(tensor.as_str()))
                    }
                    other => panic!("cut at {cut}: {other}"),
                }
            } else {
                assert!(
                    matches!(
                        err,
                        GgufError::Truncated { .. }
                            | GgufError::AbsurdCount { .. }
                            | GgufError::TensorOutOfBounds { .. }
                    ),
                    "cut at {cut}: {err}"
                );
            }
        }
    }

    #[test]
    fn unknown_type_id_names_tensor() {
        let mut bytes = quant_vectors_bytes();
        let at = info_offset(&bytes, "q5_1") + 8 + 4 + 4 + 2 * 8;
        assert_eq!(
            u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")),
            DType::Q5_1.ggml_type_id()
        );
        bytes[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
        let err = GgufFile::from_bytes("t.gguf", bytes).expect_err("type 99 accepted");
        assert!(
            matches!(&err, GgufError::UnknownTensorType { tensor, type_id: 99, .. } if tensor == "q5_1"),
            "{err}"
        );
        assert!(err.to_string().contains("`q5_1`") && err.to_string().contains("99"));
    }

    #[test]
    fn header_corruptions_are_specific_errors() {
        let good = quant_vectors_bytes();
        let mut b = good.clone();
        b[0] = b'X';
        assert!(matches!(
            GgufFile::from_bytes("t", b),
            Err(GgufError::BadMagic { .. })
        ));
        let mut b = good.clone();
        b[4..8].copy_from_slice(&1u32.to_le_bytes());
        assert!(matches!(
            GgufFile::from_bytes("t", b),
            Err(GgufError::UnsupportedVersion { version: 1, .. })
        ));
        // Big-endian files read as a byte-swapped version.
        let mut b = good.clone();
        b[4..8].copy_from_slice(&3u32.to_be_bytes());
        assert!(matches!(
            GgufFile::from_bytes("t", b),
            Err(GgufError::UnsupportedVersion { .. })
        ));
        let mut b = good.clone();
        b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            GgufFile::from_bytes("t", b),
            Err(GgufError::AbsurdCount {
                count: u64::MAX,
                ..
            }) | Err(GgufError::Truncated { .. })
        ));
        let mut b = good.clone();
        b[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(matches!(
            GgufFile::from_bytes("t", b),
            Err(GgufError::AbsurdCount { .. })
        ));
        // A tensor name with invalid UTF-8.
        let mut b = good.clone();
        let at = info_offset(&b, "q8_0") + 8;
        b[at] = 0xFF;
        assert!(matches!(
            GgufFile::from_bytes("t", b),
            Err(GgufError::BadUtf8 { .. })
        ));
        // A name length far past the end of the file.
        let mut b = good.clone();
        let at = info_offset(&b, "q8_0");
        b[at..at + 8].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
        assert!(matches!(
            GgufFile::from_bytes("t", b),
            Err(GgufError::Truncated { .. })
        ));
        // Five dimensions.
        let mut b = good.clone();
        let at = info_offset(&b, "q8_0") + 8 + 4;
        b[at..at + 4].copy_from_slice(&5u32.to_le_bytes());
        assert!(matches!(
            GgufFile::from_bytes("t", b),
            Err(GgufError::TooManyDims { n_dims: 5, .. })
        ));
        // ne[0] not a multiple of the block size.
        let mut b = good.clone();
        let at = info_offset(&b, "q8_0") + 8 + 4 + 4;
        b[at..at + 8].copy_from_slice(&255u64.to_le_bytes());
        assert!(matches!(
            GgufFile::from_bytes("t", b),
            Err(GgufError::BadShape { .. })
        ));
        // A huge outer dimension: overflowing or past the end.
        let mut b = good.clone();
        b[at + 8..at + 16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            GgufFile::from_bytes("t", b),
            Err(GgufError::BadShape { .. })
        ));
        let mut b = good.clone();
        b[at + 8..at + 16].copy_from_slice(&1000u64.to_le_bytes());
        assert!(matches!(
            GgufFile::from_bytes("t", b),
            Err(GgufError::TensorOutOfBounds { .. })
        ));
        // A misaligned and an out-of-range offset.
        let mut b = good.clone();
        let at = info_offset(&b, "q8_0") + 8 + 4 + 4 + 16 + 4;
        let off = u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        b[at..at + 8].copy_from_slice(&(off + 1).to_le_bytes());
        assert!(matches!(
            GgufFile::from_bytes("t", b),
            Err(GgufError::MisalignedTensor { .. })
        ));
        let mut b = good.clone();
        b[at..at + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
        assert!(matches!(
            GgufFile::from_bytes("t", b),
            Err(GgufError::TensorOutOfBounds { .. })
        ));
    }

    /// A hand-built file exercising every metadata value type, nested arrays, a custom
    /// alignment and a zero-dimensional tensor.
    #[test]
    fn all_value_types_round_trip() {
        fn s(b: &mut Vec<u8>, v: &str) {
            b.extend_from_slice(&(v.len() as u64).to_le_bytes());
            b.extend_from_slice(v.as_bytes());
        }
        let mut b = Vec::new();
        b.extend_from_slice(b"GGUF");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&15u64.to_le_bytes());
        let kv: Vec<(&str, u32, Vec<u8>)> = vec![
            ("a.u8", 0, vec![200]),
            ("a.i8", 1, vec![0xFE]),
            ("a.u16", 2, 60000u16.to_le_bytes().to_vec()),
            ("a.i16", 3, (-300i16).to_le_bytes().to_vec()),
            ("a.u32", 4, 7u32.to_le_bytes().to_vec()),
            ("a.i32", 5, (-7i32).to_le_bytes().to_vec()),
            ("a.f32", 6, 1.5f32.to_le_bytes().to_vec()),
            ("a.bool", 7, vec![1]),
            ("a.u64", 10, u64::MAX.to_le_bytes().to_vec()),
            ("a.i64", 11, (-9i64).to_le_bytes().to_vec()),
            ("a.f64", 12, 0.25f64.to_le_bytes().to_vec()),
            ("general.alignment", 4, 64u32.to_le_bytes().to_vec()),
        ];
        for (k, t, v) in &kv {
            s(&mut b, k);
            b.extend_from_slice(&t.to_le_bytes());
            b.extend_from_slice(v);
        }
        s(&mut b, "a.str");
        b.extend_from_slice(&8u32.to_le_bytes());
        s(&mut b, "héllo");
        s(&mut b, "a.strs");
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&8u32.to_le_bytes());
        b.extend_from_slice(&2u64.to_le_bytes());
        s(&mut b, "x");
        s(&mut b, "");
        s(&mut b, "a.nested");
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&5u32.to_le_bytes());
        b.extend_from_slice(&2u64.to_le_bytes());
        b.extend_from_slice(&1i32.to_le_bytes());
        b.extend_from_slice(&(-2i32).to_le_bytes());
        s(&mut b, "scalar");
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        let data_at = b.len().div_ceil(64) * 64;
        b.resize(data_at, 0);
        b.extend_from_slice(&2.5f32.to_le_bytes());

        let g = GgufFile::from_bytes("hand.gguf", b.clone()).expect("parse");
        assert_eq!(g.alignment, 64);
        assert_eq!(g.data_offset, data_at as u64);
        assert_eq!(g.get("a.u8"), Some(&GgufValue::U8(200)));
        assert_eq!(g.get("a.i8"), Some(&GgufValue::I8(-2)));
        assert_eq!(g.get("a.u16"), Some(&GgufValue::U16(60000)));
        assert_eq!(g.get("a.i16"), Some(&GgufValue::I16(-300)));
        assert_eq!(g.get("a.u32").and_then(GgufValue::as_u64), Some(7));
        assert_eq!(g.get("a.i32").and_then(GgufValue::as_i64), Some(-7));
        assert_eq!(g.get("a.f32").and_then(GgufValue::as_f64), Some(1.5));
        assert_eq!(g.get("a.bool").and_then(GgufValue::as_bool), Some(true));
        assert_eq!(g.get("a.u64"), Some(&GgufValue::U64(u64::MAX)));
        assert_eq!(g.get("a.i64"), Some(&GgufValue::I64(-9)));
        assert_eq!(g.get("a.f64"), Some(&GgufValue::F64(0.25)));
        assert_eq!(g.get_str("a.str"), Some("héllo"));
        assert_eq!(
            g.get("a.strs"),
            Some(&GgufValue::Array(
                GgufValueType::String,
                vec![
                    GgufValue::String("x".into()),
                    GgufValue::String(String::new())
                ]
            ))
        );
        assert_eq!(
            g.get("a.nested"),
            Some(&GgufValue::Array(
                GgufValueType::Array,
                vec![GgufValue::Array(
                    GgufValueType::I32,
                    vec![GgufValue::I32(1), GgufValue::I32(-2)]
                )]
            ))
        );
        let t = g.tensor_info("scalar").expect("scalar");
        assert_eq!((t.shape.clone(), t.n_bytes), (vec![], 4));
        assert_eq!(g.tensor_bytes("scalar"), Some(&2.5f32.to_le_bytes()[..]));

        // Alignment 0 and a non-u32 alignment are rejected.
        let at = b
            .windows(17)
            .position(|w| w == b"general.alignment")
            .expect("key")
            + 17;
        let mut z = b.clone();
        z[at + 4..at + 8].copy_from_slice(&0u32.to_le_bytes());
        assert!(matches!(
            GgufFile::from_bytes("t", z),
            Err(GgufError::BadAlignment { .. })
        ));
        let mut z = b.clone();
        z[at..at + 4].copy_from_slice(&5u32.to_le_bytes());
        assert!(matches!(
            GgufFile::from_bytes("t", z),
            Err(GgufError::BadAlignment { .. })
        ));
        // An unknown value type names the key.
        let mut z = b.clone();
        z[at..at + 4].copy_from_slice(&13u32.to_le_bytes());
        assert!(
            matches!(GgufFile::from_bytes("t", z), Err(GgufError::UnknownValueType { key, type_id: 13, .. }) if key == "general.alignment")
        );
        // A duplicate key.
        let mut z = b.clone();
        let k = z.windows(4).position(|w| w == b"a.u8").expect("a.u8");
        z[k..k + 4].copy_from_slice(b"a.i8");
        assert!(matches!(
            GgufFile::from_bytes("t", z),
            Err(GgufError::DuplicateKey { .. })
        ));
        // An array count larger than the file.
        let mut z = b.clone();
        let k = z.windows(6).position(|w| w == b"a.strs").expect("a.strs") + 6 + 4 + 4;
        z[k..k + 8].copy_from_slice(&(1u64 << 50).to_le_bytes());
        assert!(matches!(
            GgufFile::from_bytes("t", z),
            Err(GgufError::AbsurdCount { .. })
        ));
    }

    /// Arrays nested deeper than the limit are refused instead of recursing without bound.
    #[test]
    fn deep_nesting_is_refused() {
        let mut b = Vec::new();
        b.extend_from_slice(b"GGUF");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.push(b'k');
        b.extend_from_slice(&9u32.to_le_bytes());
        for _ in 0..100 {
            b.extend_from_slice(&9u32.to_le_bytes());
            b.extend_from_slice(&1u64.to_le_bytes());
        }
        assert!(matches!(
            GgufFile::from_bytes("t", b),
            Err(GgufError::NestingTooDeep { .. })
        ));
    }
}
