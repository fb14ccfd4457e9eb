//! Checkpoints: model parameters as safetensors, optimizer and scaler state as JSON,
//! saved together in one directory and restored exactly, so a resumed run continues
//! bit for bit.
//!
//! # The directory
//!
//! A checkpoint directory holds [`MANIFEST`] (`manifest.json`) and the three files it
//! names, each name carrying the first 16 hex digits of the file's SHA-256
//! (`model-<hex>.safetensors`, `optimizer-<hex>.json`, `scaler-<hex>.json`). The
//! manifest lists each file with its size and full SHA-256 digest (so `sha256sum` can
//! check them too); it is the unit of commit. It may also carry the training loop's own
//! state as a JSON value ([`save_with_meta`], [`load_with_meta`]): the step reached,
//! the position in the data, a history — what a PyTorch user adds to the dictionary
//! given to `torch.save` — committed with the rest in the same rename.
//!
//! # Saving is atomic
//!
//! [`save`] encodes everything in memory first. It then writes each data file to a
//! temporary file in the directory, syncs it to disk and renames it to its final name
//! (a name of its own: the files of the previous checkpoint are never written to), syncs
//! the directory, and writes the manifest the same way, its rename over the previous
//! manifest being the commit. Only after the directory is synced again are the previous
//! checkpoint's files and the leftovers of interrupted saves removed. A save cut short
//! anywhere — a full disk, a killed process, a power cut — leaves the previous manifest
//! and every file it names: the previous checkpoint still loads. One process at a time
//! may save into a directory.
//!
//! # Loading changes nothing unless everything fits
//!
//! [`load`] reads the manifest and every file, checks each file's size and digest,
//! decodes everything and checks it against the model (names, shapes, dtypes), the
//! optimizer ([`Optimizer::validate_state_dict`]) and the scaler
//! ([`ScalerStateDict::from_json`]) before it changes any of them: a failed load leaves
//! model, optimizer and scaler as they were. Every error names the file at fault.
//! NaN and infinite values (a scale that overflowed, a moment gone NaN) round-trip.
//!
//! # Example
//!
//! ```
//! use amp_autograd::amp_tensor::{DType, Generator};
//! use amp_nn::{Linear, Module};
//! use amp_optim::{Optimizer, Sgd, SgdOptions};
//! use amp_scaler::GradScaler;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut gen = Generator::new(0);
//! let model = Linear::new(4, 2, &mut gen)?;
//! let opt = Sgd::new(model.parameters(), 0.1, SgdOptions::default())?;
//! let scaler = GradScaler::new();
//! let dir = std::env::temp_dir().join(format!("amp-checkpoint-doc-{}", std::process::id()));
//! amp_checkpoint::save(&dir, &model, &opt, &scaler)?;
//!
//! // Another model of the same shape takes the saved parameters back, bit for bit.
//! let other = Linear::new(4, 2, &mut Generator::new(1))?;
//! let mut opt2 = Sgd::new(other.parameters(), 0.1, SgdOptions::default())?;
//! let mut scaler2 = GradScaler::new();
//! amp_checkpoint::load(&dir, &other, &mut opt2, &mut scaler2)?;
//! for (a, b) in model.parameters().iter().zip(other.parameters()) {
//!     assert_eq!(a.to_vec_f64(), b.to_vec_f64());
//! }
//! assert_eq!(scaler2.get_scale(), scaler.get_scale());
//! std::fs::remove_dir_all(&dir)?;
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use amp_nn::Module;
use amp_optim::{Optimizer, OptimizerStateDict};
use amp_scaler::{GradScaler, ScalerStateDict};
use amp_tensor::{with_dtype, DType, Element, Tensor as Raw};
use safetensors::tensor::{Dtype, SafeTensorError, SafeTensors, TensorView};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The manifest's file name: the file whose atomic replacement commits a save.
pub const MANIFEST: &str = "manifest.json";

/// The manifest's `format` tag.
pub const FORMAT: &str = "amp-checkpoint/1";

/// What can go wrong saving or loading a checkpoint. Every variant about a file names
/// it (its path in the checkpoint directory).
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading, writing, syncing or renaming a file failed.
    #[error("checkpoint file {}: {source}", path.display())]
    Io {
        /// The file (or the directory).
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A file the checkpoint needs is not there.
    #[error("checkpoint file {} is missing", path.display())]
    Missing {
        /// The missing file.
        path: PathBuf,
    },
    /// A file whose size is not the one the manifest records (truncated, say).
    #[error("checkpoint file {} has {found} bytes, the manifest records {expected}", path.display())]
    Size {
        /// The file.
        path: PathBuf,
        /// Its size.
        found: u64,
        /// The size in the manifest.
        expected: u64,
    },
    /// A file whose SHA-256 is not the one the manifest records (corrupted).
    #[error("checkpoint file {} has SHA-256 {found}, the manifest records {expected}", path.display())]
    Checksum {
        /// The file.
        path: PathBuf,
        /// Its digest (lowercase hex).
        found: String,
        /// The digest in the manifest.
        expected: String,
    },
    /// A JSON file that does not parse as what it should hold.
    #[error("checkpoint file {}: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A manifest of another format.
    #[error("checkpoint file {}: format `{found}`, expected `{FORMAT}`", path.display())]
    UnknownFormat {
        /// The manifest.
        path: PathBuf,
        /// Its `format` tag.
        found: String,
    },
    /// A manifest naming something other than a plain file in the checkpoint directory.
    #[error("checkpoint file {}: `{name}` is not a file name in the checkpoint directory", path.display())]
    BadFileName {
        /// The manifest.
        path: PathBuf,
        /// The name it gives.
        name: String,
    },
    /// The model file does not decode or does not fit the model.
    #[error("checkpoint file {}: {source}", path.display())]
    Model {
        /// The model file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: Box<ModelError>,
    },
    /// The optimizer file does not fit the optimizer.
    #[error("checkpoint file {}: {source}", path.display())]
    Optimizer {
        /// The optimizer file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: Box<amp_optim::Error>,
    },
    /// The scaler file does not fit the scaler.
    #[error("checkpoint file {}: {source}", path.display())]
    Scaler {
        /// The scaler file.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: Box<amp_scaler::ScalerError>,
    },
    /// Encoding the model's parameters failed while saving (nothing was written).
    #[error("encoding the model for a checkpoint: {0}")]
    Encode(#[source] Box<ModelError>),
    /// Copying validated values into the model failed (the model changed between the
    /// checks and the copy).
    #[error(transparent)]
    Autograd(#[from] amp_autograd::Error),
}

/// Why model parameters cannot be encoded, decoded, or loaded into a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The bytes are not a valid safetensors file.
    #[error("safetensors: {0}")]
    SafeTensors(#[from] SafeTensorError),
    /// A tensor of a dtype this workspace does not have.
    #[error("tensor `{name}`: unsupported safetensors dtype {dtype:?}")]
    UnsupportedDtype {
        /// The tensor's name.
        name: String,
        /// Its dtype.
        dtype: Dtype,
    },
    /// Tensor data that is not a valid value of its dtype or shape.
    #[error("tensor `{name}`: {reason}")]
    BadData {
        /// The tensor's name.
        name: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// Parameters of the model that the file lacks (PyTorch's text).
    #[error("Missing key(s) in state_dict: {}.", quoted(.0))]
    MissingKeys(Vec<String>),
    /// Tensors in the file that the model lacks (PyTorch's text).
    #[error("Unexpected key(s) in state_dict: {}.", quoted(.0))]
    UnexpectedKeys(Vec<String>),
    /// A tensor whose shape is not its parameter's (PyTorch's text).
    #[error("size mismatch for {name}: copying a param with shape {found:?} from checkpoint, the shape in current model is {expected:?}.")]
    Shape {
        /// The parameter's name.
        name: String,
        /// The shape in the file.
        found: Vec<usize>,
        /// The parameter's shape.
        expected: Vec<usize>,
    },
    /// A tensor whose dtype is not its parameter's.
    #[error("dtype mismatch for {name}: copying a param of dtype {found} from checkpoint, the dtype in current model is {expected}.")]
    Dtype {
        /// The parameter's name.
        name: String,
        /// The dtype in the file.
        found: DType,
        /// The parameter's dtype.
        expected: DType,
    },
    /// Building a tensor failed.
    #[error("tensor `{name}`: {source}")]
    Tensor {
        /// The tensor's name.
        name: String,
        /// The error.
        #[source]
        source: amp_tensor::Error,
    },
    /// Copying checked values into the parameters failed.
    #[error(transparent)]
    Load(#[from] amp_autograd::Error),
}

fn quoted(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::I64 => Dtype::I64,
        DType::I32 => Dtype::I32,
        DType::Bool => Dtype::BOOL,
    }
}

fn from_st_dtype(name: &str, d: Dtype) -> Result<DType, ModelError> {
    Ok(match d {
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::I64 => DType::I64,
        Dtype::I32 => DType::I32,
        Dtype::BOOL => DType::Bool,
        dtype => {
            return Err(ModelError::UnsupportedDtype {
                name: name.to_owned(),
                dtype,
            })
        }
    })
}

/// Encode a model's parameters as a safetensors buffer.
pub fn model_to_safetensors(model: &dyn Module) -> Result<Vec<u8>, ModelError> {
    let sd = model.state_dict();
    let bytes: Vec<(String, DType, Vec<usize>, Vec<u8>)> = sd
        .iter()
        .map(|(n, t)| (n.clone(), t.dtype(), t.dims().to_vec(), raw_bytes(t)))
        .collect();
    let views = bytes
        .iter()
        .map(|(n, d, s, b)| Ok((n.clone(), TensorView::new(st_dtype(*d), s.clone(), b)?)))
        .collect::<Result<Vec<_>, ModelError>>()?;
    Ok(safetensors::serialize(views, &None)?)
}

/// Decode a safetensors buffer and check it against `model`: the same names, and for
/// each its parameter's shape and dtype. Nothing is changed; the tensors come back in
/// the model's parameter order.
pub fn decode_model(model: &dyn Module, bytes: &[u8]) -> Result<Vec<(String, Raw)>, ModelError> {
    let st = SafeTensors::deserialize(bytes)?;
    let mut found: HashMap<String, Raw> = HashMap::new();
    for (name, view) in st.tensors() {
        let dtype = from_st_dtype(&name, view.dtype())?;
        let t = from_bytes(&name, dtype, view.shape(), view.data())?;
        found.insert(name, t);
    }
    let params = model.named_state();
    let missing: Vec<String> = params
        .iter()
        .filter(|(n, _)| !found.contains_key(n))
        .map(|(n, _)| n.clone())
        .collect();
    if !missing.is_empty() {
        return Err(ModelError::MissingKeys(missing));
    }
    if found.len() != params.len() {
        let mut unexpected: Vec<String> = found
            .keys()
            .filter(|k| !params.iter().any(|(n, _)| n == *k))
            .cloned()
            .collect();
        unexpected.sort();
        return Err(ModelError::UnexpectedKeys(unexpected));
    }
    let mut out = Vec::with_capacity(params.len());
    for (name, p) in params {
        let t = found
            .remove(&name)
            .expect("every parameter was found above");
        if t.dims() != p.dims() {
            return Err(ModelError::Shape {
                name,
                found: t.dims().to_vec(),
                expected: p.dims().to_vec(),
            });
        }
        if t.dtype() != p.dtype() {
            return Err(ModelError::Dtype {
                name,
                found: t.dtype(),
                expected: p.dtype(),
            });
        }
        out.push((name, t));
    }
    Ok(out)
}

/// Restore a model's parameters from a safetensors buffer: everything is checked
/// ([`decode_model`]) before any parameter changes.
pub fn model_from_safetensors(model: &dyn Module, bytes: &[u8]) -> Result<(), ModelError> {
    let sd = decode_model(model, bytes)?;
    model.load_state_dict(&sd)?;
    Ok(())
}

fn raw_bytes(t: &Raw) -> Vec<u8> {
    let t = t.contiguous();
    let n = t.elem_count();
    with_dtype!(t.dtype(), T => {
        let v = t.to_vec::<T>().expect("own dtype");
        let size = std::mem::size_of::<T>();
        let mut out = vec![0u8; n * size];
        // SAFETY: T is plain old data (floats, ints, bool) and `out` is n * size bytes.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr() as *const u8, out.as_mut_ptr(), n * size) };
        if cfg!(target_endian = "big") {
            out.chunks_mut(size).for_each(|c| c.reverse());
        }
        out
    })
}

fn from_bytes(name: &str, dtype: DType, shape: &[usize], data: &[u8]) -> Result<Raw, ModelError> {
    let bad = |reason| ModelError::BadData {
        name: name.to_owned(),
        reason,
    };
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| bad("the shape's element count overflows"))?;
    with_dtype!(dtype, T => {
        let size = std::mem::size_of::<T>();
        if n.checked_mul(size) != Some(data.len()) {
            return Err(bad("the data length is not the shape's"));
        }
        if T::DTYPE == DType::Bool && data.iter().any(|&b| b > 1) {
            return Err(bad("a bool tensor holds a byte other than 0 or 1"));
        }
        let mut v: Vec<T> = vec![T::default(); n];
        let mut bytes = data.to_vec();
        if cfg!(target_endian = "big") {
            bytes.chunks_mut(size).for_each(|c| c.reverse());
        }
        // SAFETY: `v` holds n * size bytes; every bit pattern is valid for the float and
        // int types, and bool bytes were checked to be 0 or 1 above.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr() as *mut u8, n * size) };
        Raw::from_vec(v, shape).map_err(|source| ModelError::Tensor { name: name.to_owned(), source })
    })
}

/// The manifest: the format tag, the three files, and the caller's state if any.
#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    format: String,
    files: ManifestFiles,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    meta: Option<serde_json::Value>,
}

#[derive(Debug, Serialize, Deserialize)]
struct ManifestFiles {
    model: FileEntry,
    optimizer: FileEntry,
    scaler: FileEntry,
}

/// One file of a checkpoint: its name in the directory, size and SHA-256 (hex).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct FileEntry {
    file: String,
    bytes: u64,
    sha256: String,
}

/// The three data files: name stem and extension.
const PARTS: [(&str, &str); 3] = [
    ("model", "safetensors"),
    ("optimizer", "json"),
    ("scaler", "json"),
];

/// Digits of the SHA-256 in a data file's name.
const NAME_DIGITS: usize = 16;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A writer [`save_with`] can sync to disk before it renames the file.
pub trait SyncWrite: Write {
    /// Flush the data to the storage device (`fsync`).
    fn sync(&mut self) -> io::Result<()>;
}

impl SyncWrite for File {
    fn sync(&mut self) -> io::Result<()> {
        self.sync_all()
    }
}

/// Save model, optimizer and scaler into `dir`, atomically (see the module's docs).
pub fn save(
    dir: &Path,
    model: &dyn Module,
    opt: &dyn Optimizer,
    scaler: &GradScaler,
) -> Result<(), CheckpointError> {
    save_files(dir, model, opt, scaler, None, new_file)
}

/// [`save`], with `meta` — the training loop's own state (its step, its data position,
/// a history) — kept in the manifest, so that it is committed together with model,
/// optimizer and scaler: a checkpoint never pairs one step's parameters with another
/// step's counter. [`load_with_meta`] gives it back.
pub fn save_with_meta(
    dir: &Path,
    model: &dyn Module,
    opt: &dyn Optimizer,
    scaler: &GradScaler,
    meta: &serde_json::Value,
) -> Result<(), CheckpointError> {
    save_files(dir, model, opt, scaler, Some(meta), new_file)
}

fn new_file(path: &Path) -> io::Result<File> {
    OpenOptions::new().write(true).create_new(true).open(path)
}

/// [`save`], with every file's bytes written through a writer that `create` makes for
/// a new temporary file at the path given (for instance one that fails part way, to
/// check that an interrupted save leaves the previous checkpoint whole). After an
/// error before the commit, the files this save made (temporary files, and data files
/// the previous manifest does not name) are removed as far as possible.
pub fn save_with<W: SyncWrite>(
    dir: &Path,
    model: &dyn Module,
    opt: &dyn Optimizer,
    scaler: &GradScaler,
    create: impl FnMut(&Path) -> io::Result<W>,
) -> Result<(), CheckpointError> {
    save_files(dir, model, opt, scaler, None, create)
}

fn save_files<W: SyncWrite>(
    dir: &Path,
    model: &dyn Module,
    opt: &dyn Optimizer,
    scaler: &GradScaler,
    meta: Option<&serde_json::Value>,
    mut create: impl FnMut(&Path) -> io::Result<W>,
) -> Result<(), CheckpointError> {
    let model_bytes =
        model_to_safetensors(model).map_err(|e| CheckpointError::Encode(Box::new(e)))?;
    let json = |part: &str, v: serde_json::Result<Vec<u8>>| {
        v.map_err(|source| CheckpointError::Json {
            path: dir.join(part),
            source,
        })
    };
    let opt_bytes = json("optimizer", serde_json::to_vec(&opt.state_dict()))?;
    let scaler_bytes = json("scaler", serde_json::to_vec(&scaler.state_dict_json()))?;
    fs::create_dir_all(dir).map_err(io_at(dir))?;

    let mut made = Vec::new();
    let written = write_all_files(
        dir,
        [&model_bytes, &opt_bytes, &scaler_bytes],
        meta,
        &mut create,
        &mut made,
    );
    match written {
        Ok(keep) => {
            // The checkpoint is committed; what is left is tidying up. A file that
            // cannot be removed now is removed by a later save.
            remove_stale(dir, &keep);
            Ok(())
        }
        Err(e) => {
            for f in made {
                // Best effort: a leftover is removed by the next successful save.
                let _ = fs::remove_file(f);
            }
            Err(e)
        }
    }
}

/// Write the data files and then the manifest; returns the names the new manifest
/// references. Until the commit, `made` collects the files this save created (to be
/// removed if it fails); after it, nothing (the new checkpoint must stay).
fn write_all_files<W: SyncWrite>(
    dir: &Path,
    payloads: [&Vec<u8>; 3],
    meta: Option<&serde_json::Value>,
    create: &mut impl FnMut(&Path) -> io::Result<W>,
    made: &mut Vec<PathBuf>,
) -> Result<Vec<String>, CheckpointError> {
    let mut entries = Vec::with_capacity(3);
    for ((stem, ext), bytes) in PARTS.iter().zip(payloads) {
        let sha256 = hex(&Sha256::digest(bytes));
        let file = format!("{stem}-{}.{ext}", &sha256[..NAME_DIGITS]);
        write_file(dir, &file, bytes, create, made)?;
        entries.push(FileEntry {
            file,
            bytes: bytes.len() as u64,
            sha256,
        });
    }
    // The data files' names must be on disk before a manifest refers to them.
    sync_dir(dir)?;
    let mut keep: Vec<String> = entries.iter().map(|e| e.file.clone()).collect();
    let [model, optimizer, scaler] = <[FileEntry; 3]>::try_from(entries).expect("three parts");
    let manifest = Manifest {
        format: FORMAT.to_owned(),
        files: ManifestFiles {
            model,
            optimizer,
            scaler,
        },
        meta: meta.cloned(),
    };
    let text = serde_json::to_vec_pretty(&manifest).map_err(|source| CheckpointError::Json {
        path: dir.join(MANIFEST),
        source,
    })?;
    // The commit: the manifest's rename replaces the previous one in one step.
    write_file(dir, MANIFEST, &text, create, made)?;
    made.clear();
    sync_dir(dir)?;
    keep.push(MANIFEST.to_owned());
    Ok(keep)
}

/// Write `bytes` to a temporary file beside `dir/name`, sync it, rename it to
/// `dir/name`. `made` gets the temporary file, and then `dir/name` if it is new.
/// Errors name `dir/name`.
fn write_file<W: SyncWrite>(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    create: &mut impl FnMut(&Path) -> io::Result<W>,
    made: &mut Vec<PathBuf>,
) -> Result<(), CheckpointError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let target = dir.join(name);
    let tmp = dir.join(format!(
        ".{name}.{}-{}.tmp",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    made.push(tmp.clone());
    let fail = io_at(&target);
    let mut w = create(&tmp).map_err(&fail)?;
    w.write_all(bytes).map_err(&fail)?;
    w.flush().map_err(&fail)?;
    w.sync().map_err(&fail)?;
    drop(w);
    // A data file of this name already there has these very bytes (the name is their
    // digest) and may belong to the previous checkpoint: it must survive a failure.
    let existed = target.exists();
    fs::rename(&tmp, &target).map_err(&fail)?;
    made.pop();
    if !existed {
        made.push(target.clone());
    }
    Ok(())
}

fn io_at(path: &Path) -> impl Fn(io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Make the directory's entries (new names, renames) durable.
fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    #[cfg(unix)]
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_at(dir))?;
    #[cfg(not(unix))]
    let _ = dir; // Directories cannot be opened for syncing here; renames are durable.
    Ok(())
}

/// `name` is a data file name this module writes (`model-<16 hex>.safetensors`, ...).
fn is_data_file(name: &str) -> bool {
    PARTS.iter().any(|(stem, ext)| {
        name.strip_prefix(stem)
            .and_then(|r| r.strip_prefix('-'))
            .and_then(|r| r.strip_suffix(ext))
            .and_then(|r| r.strip_suffix('.'))
            .is_some_and(|h| {
                h.len() == NAME_DIGITS && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            })
    })
}

/// `name` is a temporary file this module writes (`.<name>.<pid>-<n>.tmp`).
fn is_temp_file(name: &str) -> bool {
    name.strip_prefix('.')
        .and_then(|r| r.strip_suffix(".tmp"))
        .is_some_and(|r| {
            r.starts_with(MANIFEST)
                || PARTS
                    .iter()
                    .any(|(stem, _)| r.starts_with(&format!("{stem}-")))
        })
}

/// Remove the data files of earlier checkpoints and the temporary files of
/// interrupted saves; leave `keep` and every file this module did not write.
fn remove_stale(dir: &Path, keep: &[String]) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if (is_data_file(name) && !keep.iter().any(|k| k == name)) || is_temp_file(name) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Read a whole file; a missing one is [`CheckpointError::Missing`].
fn read(path: &Path) -> Result<Vec<u8>, CheckpointError> {
    fs::read(path).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => CheckpointError::Missing {
            path: path.to_owned(),
        },
        _ => CheckpointError::Io {
            path: path.to_owned(),
            source,
        },
    })
}

/// The JSON file at `path` (read into `bytes`) as a `T`.
fn from_json<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    path: &Path,
) -> Result<T, CheckpointError> {
    serde_json::from_slice(bytes).map_err(|source| CheckpointError::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// Read the file `entry` names and check its size and digest.
fn read_verified(
    dir: &Path,
    manifest: &Path,
    entry: &FileEntry,
) -> Result<(PathBuf, Vec<u8>), CheckpointError> {
    let plain = Path::new(&entry.file)
        .file_name()
        .is_some_and(|f| f == entry.file.as_str())
        && !entry.file.starts_with('.')
        && !entry.file.contains(['/', '\\']);
    if !plain {
        return Err(CheckpointError::BadFileName {
            path: manifest.to_owned(),
            name: entry.file.clone(),
        });
    }
    let path = dir.join(&entry.file);
    let bytes = read(&path)?;
    if bytes.len() as u64 != entry.bytes {
        return Err(CheckpointError::Size {
            path,
            found: bytes.len() as u64,
            expected: entry.bytes,
        });
    }
    let found = hex(&Sha256::digest(&bytes));
    if !found.eq_ignore_ascii_case(&entry.sha256) {
        return Err(CheckpointError::Checksum {
            path,
            found,
            expected: entry.sha256.clone(),
        });
    }
    Ok((path, bytes))
}

/// Restore what [`save`] wrote into existing model, optimizer and scaler objects. All
/// of it is read, verified and checked first; on an error none of the three has changed.
/// A disabled scaler ignores its saved state, as PyTorch's does.
pub fn load(
    dir: &Path,
    model: &dyn Module,
    opt: &mut dyn Optimizer,
    scaler: &mut GradScaler,
) -> Result<(), CheckpointError> {
    load_with_meta(dir, model, opt, scaler).map(|_| ())
}

/// [`load`], giving back the training loop's state that [`save_with_meta`] kept (`None`
/// for a checkpoint saved without one).
pub fn load_with_meta(
    dir: &Path,
    model: &dyn Module,
    opt: &mut dyn Optimizer,
    scaler: &mut GradScaler,
) -> Result<Option<serde_json::Value>, CheckpointError> {
    let manifest_path = dir.join(MANIFEST);
    let manifest: Manifest = from_json(&read(&manifest_path)?, &manifest_path)?;
    if manifest.format != FORMAT {
        return Err(CheckpointError::UnknownFormat {
            path: manifest_path,
            found: manifest.format,
        });
    }
    let files = &manifest.files;
    let (model_path, model_bytes) = read_verified(dir, &manifest_path, &files.model)?;
    let (opt_path, opt_bytes) = read_verified(dir, &manifest_path, &files.optimizer)?;
    let (scaler_path, scaler_bytes) = read_verified(dir, &manifest_path, &files.scaler)?;

    let model_sd = decode_model(model, &model_bytes).map_err(|e| CheckpointError::Model {
        path: model_path,
        source: Box::new(e),
    })?;
    let opt_sd: OptimizerStateDict = from_json(&opt_bytes, &opt_path)?;
    let opt_error = |e| CheckpointError::Optimizer {
        path: opt_path.clone(),
        source: Box::new(e),
    };
    opt.validate_state_dict(&opt_sd).map_err(opt_error)?;
    let scaler_json: serde_json::Value = from_json(&scaler_bytes, &scaler_path)?;
    let scaler_error = |e| CheckpointError::Scaler {
        path: scaler_path.clone(),
        source: Box::new(e),
    };
    let scaler_sd = if scaler.is_enabled() {
        Some(ScalerStateDict::from_json(&scaler_json).map_err(scaler_error)?)
    } else {
        None
    };

    // Everything fits: only now does anything change.
    model.load_state_dict(&model_sd)?;
    opt.load_state_dict(&opt_sd).map_err(opt_error)?;
    if let Some(sd) = scaler_sd {
        scaler.load_state_dict(Some(&sd)).map_err(scaler_error)?;
    }
    Ok(manifest.meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_this_module_writes_and_only_those_are_recognised() {
        assert!(is_data_file("model-0123456789abcdef.safetensors"));
        assert!(is_data_file("optimizer-0123456789abcdef.json"));
        assert!(is_data_file("scaler-ffffffffffffffff.json"));
        for other in [
            "model.safetensors",
            "optimizer.json",
            "model-0123456789abcdef.json",
            "model-0123456789ABCDEF.safetensors",
            "model-0123456789abcde.safetensors",
            "notes-0123456789abcdef.json",
            MANIFEST,
        ] {
            assert!(!is_data_file(other), "{other}");
        }
        assert!(is_temp_file(".manifest.json.12-3.tmp"));
        assert!(is_temp_file(".model-0123456789abcdef.safetensors.12-0.tmp"));
        assert!(!is_temp_file(".notes.tmp"));
        assert!(!is_temp_file("model-0123456789abcdef.safetensors"));
    }
}
