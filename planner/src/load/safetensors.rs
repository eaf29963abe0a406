//! safetensors readers: one memory-mapped file ([`SafetensorsFile`]), a sharded checkpoint
//! described by a `*.safetensors.index.json` ([`ShardedSafetensors`]), and
//! [`open_safetensors_any`], which picks one of the two for a file or a diffusers component
//! folder.
//!
//! The header is parsed by the `safetensors` crate (0.8), which checks that the tensors' byte
//! ranges are contiguous, match `dtype × shape`, and that the file is exactly as long as the
//! header says (a truncated file is rejected when it is opened). The file format is described
//! in the safetensors repository (`README.md`, "Format"): an 8-byte little-endian header
//! length, a JSON header, then the raw little-endian tensor bytes in C (row-major) order.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use ::safetensors::{Dtype, SafeTensorError, SafeTensors};
use edge_schema::DType;
use memmap2::Mmap;

use super::{LoadError, RawTensor, TensorSource};

/// File names diffusers and transformers give an unsharded checkpoint, in the order
/// [`open_safetensors_any`] tries them inside a folder.
pub const SINGLE_FILE_NAMES: [&str; 2] =
    ["diffusion_pytorch_model.safetensors", "model.safetensors"];

/// Suffix of a shard index file (`model.safetensors.index.json`,
/// `diffusion_pytorch_model.safetensors.index.json`).
pub const INDEX_SUFFIX: &str = ".safetensors.index.json";

/// Memory-maps `path` read-only.
///
/// Errors: [`LoadError::Io`] naming `path` when it cannot be opened or mapped.
#[allow(unsafe_code)]
fn map_file(path: &Path) -> Result<Mmap, LoadError> {
    let file = File::open(path).map_err(|source| io_error(path, source))?;
    // SAFETY: memmap2's contract for `Mmap::map` is that the mapped file is not modified or
    // truncated (by this or any other process) while the map is alive; otherwise reads through
    // the slice are undefined behaviour. The planner treats model files as read-only inputs and
    // never writes them; the caller of `SafetensorsFile::open` must guarantee that nothing else
    // modifies the file while the `SafetensorsFile` (and any `RawTensor` borrowed from it)
    // exists. This is stated on `SafetensorsFile`.
    unsafe { Mmap::map(&file) }.map_err(|source| io_error(path, source))
}

fn io_error(path: &Path, source: std::io::Error) -> LoadError {
    LoadError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn describe_safetensors_error(e: &SafeTensorError, file: &[u8]) -> String {
    match e {
        SafeTensorError::MetadataIncompleteBuffer => match expected_file_len(file) {
            Some(expected) => format!(
                "the file is {} bytes but its header describes {expected} bytes ({})",
                file.len(),
                if file.len() < expected {
                    "truncated"
                } else {
                    "trailing bytes"
                }
            ),
            None => "the file length does not match the header (truncated or trailing bytes)"
                .to_string(),
        },
        SafeTensorError::HeaderTooSmall => "shorter than the 8-byte header length".to_string(),
        SafeTensorError::InvalidHeaderLength => {
            "the header length is larger than the file".to_string()
        }
        other => other.to_string(),
    }
}

/// `8 + header length + data length` as the header of `file` describes it; `None` when the
/// header itself cannot be read.
fn expected_file_len(file: &[u8]) -> Option<usize> {
    let len_bytes: [u8; 8] = file.get(..8)?.try_into().ok()?;
    let header_len = usize::try_from(u64::from_le_bytes(len_bytes)).ok()?;
    let header = file.get(8..8usize.checked_add(header_len)?)?;
    let metadata: ::safetensors::tensor::Metadata = serde_json::from_slice(header).ok()?;
    (8 + header_len).checked_add(metadata.data_len())
}

/// Where one tensor lives inside a mapped file.
#[derive(Clone, Debug)]
struct Entry {
    dtype: Dtype,
    shape: Vec<usize>,
    /// Absolute byte range in the file.
    bytes: Range<usize>,
}

/// One memory-mapped `.safetensors` file.
///
/// Tensors keep the names, shapes (outermost-first, as PyTorch wrote them) and bytes of the
/// file. Only F32, F16 and BF16 tensors can be read: [`TensorSource::tensor`] returns
/// [`LoadError::UnsupportedDType`] for any other dtype (such tensors are still listed by
/// [`TensorSource::names`], so that a caller can skip them by name).
///
/// # Safety contract of the mapping
///
/// The file is memory-mapped (memmap2). It must not be modified or truncated while this value
/// (or a [`RawTensor`] borrowed from it) is alive; doing so is undefined behaviour.
pub struct SafetensorsFile {
    path: PathBuf,
    mmap: Mmap,
    entries: HashMap<String, Entry>,
}

impl SafetensorsFile {
    /// Maps and parses `path`.
    ///
    /// Errors: [`LoadError::Io`] when the file cannot be opened or mapped;
    /// [`LoadError::Safetensors`] when the header is malformed, the offsets are inconsistent,
    /// or the file is shorter (or longer) than its header says.
    pub fn open(path: &Path) -> Result<SafetensorsFile, LoadError> {
        let mmap = map_file(path)?;
        let (header_len, metadata) =
            SafeTensors::read_metadata(&mmap).map_err(|e| LoadError::Safetensors {
                path: path.display().to_string(),
                reason: describe_safetensors_error(&e, &mmap),
            })?;
        // `read_metadata` checked `8 + header_len + data_len == file length`, so these
        // additions cannot overflow and every range lies inside the map.
        let data_start = 8 + header_len;
        let entries = metadata
            .tensors()
            .into_iter()
            .map(|(name, info)| {
                let (start, end) = info.data_offsets;
                let entry = Entry {
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    bytes: data_start + start..data_start + end,
                };
                (name, entry)
            })
            .collect();
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            mmap,
            entries,
        })
    }

    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of tensors in the file.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the file holds no tensors.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether the file has a tensor called `name` (of any dtype).
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }
}

impl fmt::Debug for SafetensorsFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SafetensorsFile")
            .field("path", &self.path)
            .field("tensors", &self.entries.len())
            .field("bytes", &self.mmap.len())
            .finish()
    }
}

/// Maps a safetensors dtype to the project's [`DType`]; `None` for types the planner does not
/// read (integers, bool, f64, fp8, ...).
fn map_dtype(dtype: Dtype) -> Option<DType> {
    match dtype {
        Dtype::F32 => Some(DType::F32),
        Dtype::F16 => Some(DType::F16),
        Dtype::BF16 => Some(DType::BF16),
        _ => None,
    }
}

impl TensorSource for SafetensorsFile {
    fn tensor(&self, name: &str) -> Result<Option<RawTensor<'_>>, LoadError> {
        let Some(entry) = self.entries.get(name) else {
            return Ok(None);
        };
        let dtype = map_dtype(entry.dtype).ok_or_else(|| LoadError::UnsupportedDType {
            path: self.path.display().to_string(),
            tensor: name.to_string(),
            dtype: format!("{:?}", entry.dtype),
        })?;
        let data = self
            .mmap
            .get(entry.bytes.clone())
            .ok_or_else(|| LoadError::Safetensors {
                path: self.path.display().to_string(),
                reason: format!(
                    "tensor `{name}`: byte range {:?} lies outside the file",
                    entry.bytes
                ),
            })?;
        Ok(Some(RawTensor {
            dtype,
            shape: entry.shape.clone(),
            data,
        }))
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.entries.keys().cloned().collect();
        names.sort();
        names
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}

/// A checkpoint split over several safetensors files, as transformers' and diffusers'
/// `save_pretrained` write it: `<name>.safetensors.index.json` holds
/// `{"metadata": {...}, "weight_map": {"<tensor>": "<shard file name>", ...}}` and the shards
/// lie next to it.
///
/// Exactly the tensors listed in `weight_map` are exposed; each shard is mapped once (same
/// safety contract as [`SafetensorsFile`]).
pub struct ShardedSafetensors {
    index_path: PathBuf,
    shards: Vec<SafetensorsFile>,
    /// Tensor name → index into `shards`.
    weight_map: BTreeMap<String, usize>,
}

impl ShardedSafetensors {
    /// Reads the index at `index_path` and opens every shard it names.
    ///
    /// Errors: [`LoadError::Io`] / [`LoadError::Json`] naming the index when it cannot be read
    /// or has no `weight_map` object of strings; [`LoadError::Io`] naming the shard (and the
    /// index that lists it) when a shard file cannot be opened; any error of
    /// [`SafetensorsFile::open`] for a shard; [`LoadError::MissingInShard`] when a tensor
    /// listed in the index is not in its shard.
    pub fn open(index_path: &Path) -> Result<ShardedSafetensors, LoadError> {
        let index_str = index_path.display().to_string();
        let text = std::fs::read_to_string(index_path).map_err(|e| io_error(index_path, e))?;
        let index: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| LoadError::Json {
                path: index_str.clone(),
                reason: format!("malformed shard index JSON: {e}"),
            })?;
        let map = index
            .get("weight_map")
            .and_then(serde_json::Value::as_object)
            .ok_or_else(|| LoadError::Json {
                path: index_str.clone(),
                reason: "expected an object field `weight_map` (tensor name → shard file)"
                    .to_string(),
            })?;
        let dir = index_path.parent().unwrap_or(Path::new(""));

        let mut shard_names: BTreeMap<&str, usize> = BTreeMap::new();
        let mut shards = Vec::new();
        let mut weight_map = BTreeMap::new();
        for (tensor, shard) in map {
            let shard = shard.as_str().ok_or_else(|| LoadError::Json {
                path: index_str.clone(),
                reason: format!("`weight_map[\"{tensor}\"]` must be a shard file name string"),
            })?;
            let idx = match shard_names.get(shard) {
                Some(&idx) => idx,
                None => {
                    let shard_path = dir.join(shard);
                    let file = open_shard(&shard_path, index_path)?;
                    shards.push(file);
                    shard_names.insert(shard, shards.len() - 1);
                    shards.len() - 1
                }
            };
            let file = &shards[idx];
            if !file.contains(tensor) {
                return Err(LoadError::MissingInShard {
                    path: index_str,
                    tensor: tensor.clone(),
                    shard: file.path().display().to_string(),
                });
            }
            weight_map.insert(tensor.clone(), idx);
        }
        Ok(ShardedSafetensors {
            index_path: index_path.to_path_buf(),
            shards,
            weight_map,
        })
    }

    /// The index file this was read from.
    pub fn index_path(&self) -> &Path {
        &self.index_path
    }

    /// The shards, each once, in the order the index first names them.
    pub fn shards(&self) -> &[SafetensorsFile] {
        &self.shards
    }
}

fn open_shard(shard_path: &Path, index_path: &Path) -> Result<SafetensorsFile, LoadError> {
    if !shard_path.is_file() {
        return Err(LoadError::Io {
            path: shard_path.display().to_string(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!(
                    "shard listed in {} does not exist or is not a file",
                    index_path.display()
                ),
            ),
        });
    }
    SafetensorsFile::open(shard_path)
}

impl fmt::Debug for ShardedSafetensors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardedSafetensors")
            .field("index_path", &self.index_path)
            .field("shards", &self.shards)
            .field("tensors", &self.weight_map.len())
            .finish()
    }
}

impl TensorSource for ShardedSafetensors {
    fn tensor(&self, name: &str) -> Result<Option<RawTensor<'_>>, LoadError> {
        match self.weight_map.get(name) {
            Some(&idx) => self.shards[idx].tensor(name),
            None => Ok(None),
        }
    }

    fn names(&self) -> Vec<String> {
        self.weight_map.keys().cloned().collect()
    }

    fn describe(&self) -> String {
        let shards: Vec<String> = self
            .shards
            .iter()
            .map(|s| {
                s.path()
                    .file_name()
                    .map_or_else(|| s.describe(), |n| n.to_string_lossy().into_owned())
            })
            .collect();
        format!(
            "{} (shards: {})",
            self.index_path.display(),
            shards.join(", ")
        )
    }
}

/// Opens safetensors weights given as
/// - a file whose name ends in `.json`: a shard index ([`ShardedSafetensors`]);
/// - any other file: a single safetensors file ([`SafetensorsFile`]);
/// - a folder (a diffusers / transformers component folder): the first that exists of
///   `diffusion_pytorch_model.safetensors`, `model.safetensors`, then the single
///   `*.safetensors.index.json` in it (preferring `diffusion_pytorch_model.safetensors.index.json`
///   and `model.safetensors.index.json` when there are several), then the folder's only
///   `*.safetensors` file.
///
/// Errors: [`LoadError::Io`] when `path` does not exist; [`LoadError::Folder`] naming the
/// folder and the expected file names when a folder holds no (or ambiguous) weights; the
/// errors of [`SafetensorsFile::open`] / [`ShardedSafetensors::open`].
pub fn open_safetensors_any(path: &Path) -> Result<Box<dyn TensorSource>, LoadError> {
    let meta = std::fs::metadata(path).map_err(|e| io_error(path, e))?;
    if meta.is_dir() {
        let file = find_weights_in_dir(path)?;
        return open_safetensors_any(&file);
    }
    let is_index = path
        .file_name()
        .is_some_and(|n| n.to_string_lossy().ends_with(".json"));
    if is_index {
        Ok(Box::new(ShardedSafetensors::open(path)?))
    } else {
        Ok(Box::new(SafetensorsFile::open(path)?))
    }
}

/// The weights file (single file or shard index) inside a component folder; see
/// [`open_safetensors_any`] for the search order.
fn find_weights_in_dir(dir: &Path) -> Result<PathBuf, LoadError> {
    for name in SINGLE_FILE_NAMES {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    let listing = std::fs::read_dir(dir).map_err(|e| io_error(dir, e))?;
    let mut indexes = Vec::new();
    let mut singles = Vec::new();
    for entry in listing {
        let entry = entry.map_err(|e| io_error(dir, e))?;
        let p = entry.path();
        if !p.is_file() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(INDEX_SUFFIX) {
            indexes.push(p);
        } else if name.ends_with(".safetensors") {
            singles.push(p);
        }
    }
    indexes.sort();
    singles.sort();
    if indexes.len() > 1 {
        for name in SINGLE_FILE_NAMES {
            let preferred = dir.join(format!("{name}.index.json"));
            if indexes.contains(&preferred) {
                return Ok(preferred);
            }
        }
        return Err(LoadError::Folder {
            path: dir.display().to_string(),
            reason: format!(
                "several shard indexes and none is the standard name: {}",
                file_list(&indexes)
            ),
        });
    }
    if let Some(index) = indexes.pop() {
        return Ok(index);
    }
    match singles.len() {
        1 => Ok(singles.remove(0)),
        0 => Err(LoadError::Folder {
            path: dir.display().to_string(),
            reason: format!(
                "no weights: expected {} or {} or a *{}",
                SINGLE_FILE_NAMES[0], SINGLE_FILE_NAMES[1], INDEX_SUFFIX
            ),
        }),
        _ => Err(LoadError::Folder {
            path: dir.display().to_string(),
            reason: format!(
                "several *.safetensors files and no {} / {} / *{} to choose: {}",
                SINGLE_FILE_NAMES[0],
                SINGLE_FILE_NAMES[1],
                INDEX_SUFFIX,
                file_list(&singles)
            ),
        }),
    }
}

fn file_list(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| {
            p.file_name().map_or_else(
                || p.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::to_f32;

    fn fixture(rel: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures")
            .join(rel)
    }

    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }

    fn index_names(index: &Path) -> Vec<String> {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(index).unwrap()).unwrap();
        let mut names: Vec<String> = v["weight_map"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        names.sort();
        names
    }

    #[test]
    fn single_file_shapes_and_values() {
        let path = fixture("pixart-sigma-tiny/transformer/diffusion_pytorch_model.safetensors");
        let f = SafetensorsFile::open(&path).unwrap();
        // hidden 64 = 4 heads × 16, in_channels 4, patch 2 (transformer/config.json).
        let w = f.tensor("pos_embed.proj.weight").unwrap().unwrap();
        assert_eq!(w.dtype, DType::F32);
        assert_eq!(w.shape, vec![64, 4, 2, 2]);
        assert_eq!(w.data.len(), 64 * 4 * 2 * 2 * 4);
        assert_eq!(to_f32(&w).len(), 64 * 4 * 2 * 2);
        let t = f
            .tensor("adaln_single.emb.timestep_embedder.linear_1.weight")
            .unwrap()
            .unwrap();
        assert_eq!(t.shape, vec![64, 256]);
        let values = to_f32(&t);
        assert_eq!(values.len(), 64 * 256);
        assert!(values.iter().all(|v| v.is_finite()) && values.iter().any(|v| *v != 0.0));
        assert!(f.tensor("no.such.tensor").unwrap().is_none());
        let names = f.names();
        assert!(names.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(names.len(), f.len());
        assert!(f
            .describe()
            .ends_with("diffusion_pytorch_model.safetensors"));
    }

    /// `t5_trace.embed_tokens[0, j]` is `shared.weight[input_ids[0, j]]` (T5 does not scale its
    /// embedding), so reading the right bytes of the right shard reproduces the reference.
    #[test]
    fn sharded_t5_embedding_matches_reference() {
        let index = fixture("pixart-sigma-tiny/text_encoder/model.safetensors.index.json");
        let t5 = ShardedSafetensors::open(&index).unwrap();
        assert_eq!(t5.names(), index_names(&index));
        assert_eq!(t5.shards().len(), 3);
        for name in t5.names() {
            let t = t5.tensor(&name).unwrap().unwrap();
            assert_eq!(
                to_f32(&t).len(),
                t.shape.iter().product::<usize>(),
                "{name}"
            );
        }
        let shared = t5.tensor("shared.weight").unwrap().unwrap();
        assert_eq!(shared.shape, vec![1536, 32]);
        let shared = to_f32(&shared);

        let trace_path = fixture("pixart-sigma-tiny/reference/t5_trace.safetensors");
        let trace = SafetensorsFile::open(&trace_path).unwrap();
        let embed = trace.tensor("embed_tokens").unwrap().unwrap();
        assert_eq!(embed.shape, vec![1, 300, 32]);
        let embed = to_f32(&embed);
        let bytes = std::fs::read(&trace_path).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let ids = st.tensor("input_ids").unwrap();
        assert_eq!(ids.dtype(), Dtype::I32);
        for (j, id) in ids.data().chunks_exact(4).enumerate() {
            let id = i32::from_le_bytes([id[0], id[1], id[2], id[3]]) as usize;
            assert_eq!(
                &embed[j * 32..(j + 1) * 32],
                &shared[id * 32..(id + 1) * 32],
                "token {j}"
            );
        }
    }

    #[test]
    fn integer_tensor_is_unsupported() {
        let path = fixture("pixart-sigma-tiny/reference/t5_trace.safetensors");
        let f = SafetensorsFile::open(&path).unwrap();
        assert!(f.names().contains(&"input_ids".to_string()));
        match f.tensor("input_ids") {
            Err(LoadError::UnsupportedDType {
                path: p,
                tensor,
                dtype,
            }) => {
                assert!(p.ends_with("t5_trace.safetensors"));
                assert_eq!(tensor, "input_ids");
                assert_eq!(dtype, "I32");
            }
            other => panic!("expected UnsupportedDType, got {other:?}"),
        }
    }

    #[test]
    fn f16_and_bf16_are_read_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("half.safetensors");
        let values = [1.0f32, -2.5, 0.5, 3.0, -0.125, 64.0];
        let f16: Vec<u8> = values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect();
        let bf16: Vec<u8> = values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect();
        let views = vec![
            (
                "a.f16",
                ::safetensors::tensor::TensorView::new(Dtype::F16, vec![2, 3], &f16).unwrap(),
            ),
            (
                "b.bf16",
                ::safetensors::tensor::TensorView::new(Dtype::BF16, vec![3, 2], &bf16).unwrap(),
            ),
        ];
        ::safetensors::serialize_to_file(views, None, &path).unwrap();
        let f = SafetensorsFile::open(&path).unwrap();
        let a = f.tensor("a.f16").unwrap().unwrap();
        assert_eq!((a.dtype, a.shape.clone()), (DType::F16, vec![2, 3]));
        assert_eq!(to_f32(&a), values);
        let b = f.tensor("b.bf16").unwrap().unwrap();
        assert_eq!((b.dtype, b.shape.clone()), (DType::BF16, vec![3, 2]));
        assert_eq!(to_f32(&b), values);
    }

    fn expect_safetensors_error(path: &Path) -> String {
        match SafetensorsFile::open(path) {
            Err(LoadError::Safetensors { path: p, reason }) => {
                assert_eq!(p, path.display().to_string());
                reason
            }
            other => panic!("expected a Safetensors error, got {other:?}"),
        }
    }

    #[test]
    fn corrupt_header_is_rejected() {
        let src = fixture("pixart-sigma-tiny/text_encoder/model-00003-of-00003.safetensors");
        let mut bytes = std::fs::read(src).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("corrupt.safetensors");
        // Break the JSON header just after its opening brace.
        bytes[9] = b'#';
        std::fs::write(&path, &bytes).unwrap();
        let reason = expect_safetensors_error(&path);
        assert!(
            reason.contains("deserialize") || reason.contains("header"),
            "{reason}"
        );
        // A header length that points past the end of the file.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[..8].copy_from_slice(&(1u64 << 20).to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let reason = expect_safetensors_error(&path);
        assert!(reason.contains("header length"), "{reason}");
        std::fs::write(&path, [1u8, 2, 3]).unwrap();
        let reason = expect_safetensors_error(&path);
        assert!(reason.contains("8-byte"), "{reason}");
    }

    #[test]
    fn truncated_file_is_rejected_on_open() {
        let src = fixture("pixart-sigma-tiny/text_encoder/model-00003-of-00003.safetensors");
        let bytes = std::fs::read(src).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("truncated.safetensors");
        std::fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
        let reason = expect_safetensors_error(&path);
        assert!(reason.contains("truncated"), "{reason}");
        let (short, full) = (bytes.len() - 4, bytes.len());
        assert!(reason.contains(&format!("is {short} bytes")), "{reason}");
        assert!(
            reason.contains(&format!("describes {full} bytes")),
            "{reason}"
        );
    }

    #[test]
    fn missing_file_is_an_io_error_naming_it() {
        let path = fixture("pixart-sigma-tiny/transformer/nope.safetensors");
        match SafetensorsFile::open(&path) {
            Err(LoadError::Io { path: p, .. }) => assert!(p.ends_with("nope.safetensors")),
            other => panic!("expected Io, got {other:?}"),
        }
    }

    #[test]
    fn missing_shard_names_the_shard() {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(&fixture("pixart-sigma-tiny/text_encoder"), dir.path());
        std::fs::remove_file(dir.path().join("model-00002-of-00003.safetensors")).unwrap();
        let index = dir.path().join("model.safetensors.index.json");
        match ShardedSafetensors::open(&index) {
            Err(e @ LoadError::Io { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("model-00002-of-00003.safetensors"), "{msg}");
                assert!(msg.contains("model.safetensors.index.json"), "{msg}");
            }
            other => panic!("expected Io, got {other:?}"),
        }
    }

    #[test]
    fn tensor_absent_from_its_shard_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(&fixture("pixart-sigma-tiny/text_encoder"), dir.path());
        let index = dir.path().join("model.safetensors.index.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&index).unwrap()).unwrap();
        v["weight_map"]["shared.weight"] = "model-00003-of-00003.safetensors".into();
        std::fs::write(&index, v.to_string()).unwrap();
        match ShardedSafetensors::open(&index) {
            Err(LoadError::MissingInShard {
                path,
                tensor,
                shard,
                ..
            }) => {
                assert!(path.ends_with("model.safetensors.index.json"));
                assert_eq!(tensor, "shared.weight");
                assert!(shard.ends_with("model-00003-of-00003.safetensors"));
            }
            other => panic!("expected MissingInShard, got {other:?}"),
        }
        std::fs::write(&index, "{\"metadata\": {}}").unwrap();
        match ShardedSafetensors::open(&index) {
            Err(LoadError::Json { path, reason }) => {
                assert!(path.ends_with("model.safetensors.index.json"));
                assert!(reason.contains("weight_map"), "{reason}");
            }
            other => panic!("expected Json, got {other:?}"),
        }
    }

    #[test]
    fn open_any_picks_single_or_sharded() {
        let single = open_safetensors_any(&fixture("pixart-sigma-tiny/transformer")).unwrap();
        assert!(single
            .describe()
            .ends_with("diffusion_pytorch_model.safetensors"));
        let sharded = open_safetensors_any(&fixture("pixart-alpha-tiny/text_encoder")).unwrap();
        assert!(sharded.describe().contains("model.safetensors.index.json"));
        let index = fixture("pixart-alpha-tiny/text_encoder/model.safetensors.index.json");
        assert_eq!(sharded.names(), index_names(&index));
        let by_index = open_safetensors_any(&index).unwrap();
        assert_eq!(by_index.names(), sharded.names());
        let demo =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../demo/pixart-shapes-64/text_encoder");
        let demo = open_safetensors_any(&demo).unwrap();
        assert!(demo.describe().ends_with("model.safetensors"));

        let empty = tempfile::tempdir().unwrap();
        match open_safetensors_any(empty.path()) {
            Err(LoadError::Folder { path, reason }) => {
                assert_eq!(path, empty.path().display().to_string());
                assert!(
                    reason.contains("diffusion_pytorch_model.safetensors"),
                    "{reason}"
                );
                assert!(reason.contains(".safetensors.index.json"), "{reason}");
            }
            other => panic!("expected Folder, got {:?}", other.map(|s| s.describe())),
        }
    }
}
