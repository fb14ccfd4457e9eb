//! The command line of `cargo xtask conformance` (the `conformance` binary).
//!
//! ```
//! use amp::tensor::Device;
//! use conformance::cli::Options;
//!
//! let o = Options::parse(["--device", "cuda", "--texts"]).unwrap();
//! assert_eq!(o.device, Device::Cuda(0));
//! assert!(o.texts && o.vectors.is_none());
//! assert_eq!(Options::parse::<[&str; 0]>([]).unwrap(), Options::default());
//! assert!(Options::parse(["--device"]).is_err());
//! ```

use std::path::PathBuf;

use amp::tensor::Device;

use crate::{ConformanceError, Report};

/// The usage line printed for arguments the runner does not understand.
pub const USAGE: &str =
    "usage: cargo xtask conformance [--vectors DIR] [--device cpu|cuda|cuda:N] [--texts]";

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Options {
    /// `--vectors DIR`: the vector files of DIR instead of the built-in copy.
    pub vectors: Option<PathBuf>,
    /// `--device D`: where the op suites' tensors live (`cpu`, the default; `cuda` is
    /// `cuda:0`).
    pub device: Device,
    /// `--texts`: also print every error text that is not PyTorch's.
    pub texts: bool,
}

impl Options {
    /// The options of `args` (the arguments after the program name), in any order.
    ///
    /// # Errors
    /// A message naming the argument: an unknown one, an option without its value or
    /// given twice, a device that is not `cpu`, `cuda` or `cuda:N`.
    pub fn parse<I>(args: I) -> Result<Options, String>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let mut o = Options::default();
        let (mut vectors, mut device) = (false, false);
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let arg = arg.as_ref();
            let mut value = |seen: &mut bool| {
                if std::mem::replace(seen, true) {
                    return Err(format!("`{arg}` is given twice"));
                }
                args.next()
                    .map(|v| v.as_ref().to_owned())
                    .ok_or_else(|| format!("`{arg}` needs a value"))
            };
            match arg {
                "--texts" => o.texts = true,
                "--vectors" => o.vectors = Some(PathBuf::from(value(&mut vectors)?)),
                "--device" => o.device = crate::device::parse(&value(&mut device)?)?,
                other => return Err(format!("unknown argument `{other}`")),
            }
        }
        Ok(o)
    }

    /// Runs what the options ask for: [`crate::run_on`] with their device and directory.
    ///
    /// # Errors
    /// As [`crate::run_on`]: the device cannot be used, or the directory's files cannot.
    pub fn run(&self) -> Result<Report, ConformanceError> {
        crate::run_on(self.device, self.vectors.as_deref())
    }
}
