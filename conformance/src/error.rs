//! Errors loading vector files, or reaching the device of a device run.

use std::path::PathBuf;

/// Why a set of vector files could not be run. Every variant but [`ConformanceError::Device`]
/// names the file.
#[derive(Debug, thiserror::Error)]
pub enum ConformanceError {
    /// The device of `--device` cannot be used: [`amp::tensor::Error::DeviceUnavailable`]
    /// naming what is missing (a build without the `cuda` feature, no driver, no such
    /// device), or the driver's failure; its text is the message.
    #[error(transparent)]
    Device(amp::tensor::Error),
    /// A file or directory could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Not JSON, or not the `amp-vectors/1` file layout.
    #[error("{file}: not an amp-vectors file: {source}")]
    Json {
        /// The file.
        file: String,
        /// The parse error (with line and column).
        #[source]
        source: serde_json::Error,
    },
    /// `format` is not `amp-vectors/1`.
    #[error("{file}: unknown format `{format}` (this runner reads `amp-vectors/1`)")]
    UnknownFormat {
        /// The file.
        file: String,
        /// The format it declares.
        format: String,
    },
    /// `suite` is not one of the five suites.
    #[error("{file}: unknown suite `{suite}` (expected policy, autocast, grad, scaler or train)")]
    UnknownSuite {
        /// The file.
        file: String,
        /// The suite it declares.
        suite: String,
    },
    /// A case does not follow its suite's layout.
    #[error("{file}: case {index} (`{id}`): {message}")]
    BadCase {
        /// The file.
        file: String,
        /// The case's index in `cases`.
        index: usize,
        /// The case's id, if it has one.
        id: String,
        /// What is wrong.
        message: String,
    },
    /// Two cases of a file share an id.
    #[error("{file}: cases {first} and {second} share the id `{id}`")]
    DuplicateId {
        /// The file.
        file: String,
        /// The id.
        id: String,
        /// Index of the first case with it.
        first: usize,
        /// Index of the second.
        second: usize,
    },
    /// Two files of one suite share a case id.
    #[error("case id `{id}` of suite {suite} appears in both {first} and {second}")]
    DuplicateIdAcrossFiles {
        /// The suite.
        suite: String,
        /// The id.
        id: String,
        /// The first file.
        first: String,
        /// The second file.
        second: String,
    },
    /// The directory holds no `*.json` file.
    #[error("{}: no vector files (*.json)", dir.display())]
    NoVectors {
        /// The directory.
        dir: PathBuf,
    },
}
