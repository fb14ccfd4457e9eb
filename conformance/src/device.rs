//! Running the op suites on a device (`--device cuda`): which device, and which cases met
//! an op without a kernel there.
//!
//! The op table's entries and the built-in backend return `String` messages; they make
//! them from the workspace's typed errors with this module's `error_text` /
//! `tensor_error_text`, which note every [`amp::tensor::Error::NoDeviceKernel`] they see
//! (on this thread, for the case being run). A suite runner asks `no_kernel` about the
//! message a case ended with: when it is such an error, recognised by its variant (or, for
//! a message made elsewhere, by PyTorch's text "with arguments from the 'CUDA' backend"),
//! the case is skipped on that device
//! ([`Outcome::NoDeviceKernel`](crate::suite::Outcome::NoDeviceKernel)): counted and
//! listed, never passed or failed.
//!
//! ```
//! use conformance::device::parse;
//! use amp::tensor::Device;
//!
//! assert_eq!(parse("cuda").unwrap(), Device::Cuda(0));
//! assert_eq!(parse("cuda:1").unwrap(), Device::Cuda(1));
//! assert_eq!(parse("cpu").unwrap(), Device::Cpu);
//! assert!(parse("tpu").unwrap_err().contains("expected cpu, cuda or cuda:N"));
//! ```

use std::cell::RefCell;

use amp::tensor::{Device, Error};

/// The device named on the command line: `cpu`, `cuda` (ordinal 0) or `cuda:N`.
pub fn parse(name: &str) -> Result<Device, String> {
    name.parse::<Device>().map_err(|e| e.to_string())
}

/// What PyTorch's dispatcher (and [`Error::NoDeviceKernel`]'s text) says of an op without
/// a CUDA kernel; recognises such an error in a message made without [`error_text`].
const CUDA_TEXT: &str = "with arguments from the 'CUDA' backend";

/// A [`Error::NoDeviceKernel`] seen while running the current case.
#[derive(Debug, Clone)]
struct Missing {
    op: &'static str,
    device: Device,
    text: String,
}

thread_local! {
    static MISSING: RefCell<Vec<Missing>> = const { RefCell::new(Vec::new()) };
}

/// Forgets the errors noted so far (the runner calls it before each case).
pub(crate) fn clear() {
    MISSING.with(|m| m.borrow_mut().clear());
}

/// The message of a tensor-layer error, noting it when it is [`Error::NoDeviceKernel`].
pub(crate) fn tensor_error_text(e: &Error) -> String {
    let text = e.to_string();
    if let Error::NoDeviceKernel { op, device } = e {
        MISSING.with(|m| {
            m.borrow_mut().push(Missing {
                op,
                device: *device,
                text: text.clone(),
            })
        });
    }
    text
}

/// The message of an autograd error, noting a [`Error::NoDeviceKernel`] it carries.
pub(crate) fn error_text(e: &amp::autograd::Error) -> String {
    match e {
        amp::autograd::Error::Tensor(t) => tensor_error_text(t),
        other => other.to_string(),
    }
}

/// The skip reason when `message` (what a case ended with, possibly wrapped in context)
/// is an op's [`Error::NoDeviceKernel`]: `op `NAME` has no CUDA kernel`; `None` for any
/// other message.
pub(crate) fn no_kernel(message: &str) -> Option<String> {
    let typed = MISSING.with(|m| {
        m.borrow()
            .iter()
            .find(|x| message.contains(&x.text))
            .map(|x| reason(x.op, x.device.backend_name()))
    });
    typed.or_else(|| {
        // A message made without `error_text`: PyTorch's text, `Could not run 'OP' with
        // arguments from the 'CUDA' backend`.
        let at = message.find(CUDA_TEXT)?;
        let head = &message[..at];
        let op = head
            .rfind("Could not run '")
            .map(|i| &head[i + "Could not run '".len()..])
            .and_then(|rest| rest.strip_suffix("' "))
            .unwrap_or("?");
        Some(reason(op, "CUDA"))
    })
}

fn reason(op: &str, backend: &str) -> String {
    format!("op `{op}` has no {backend} kernel")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_noted_error_is_recognised_inside_context() {
        clear();
        let e = amp::autograd::Error::Tensor(Error::no_device_kernel("mm", Device::Cuda(0)));
        let text = error_text(&e);
        assert_eq!(
            no_kernel(&format!("torch.mm failed: {text}")).as_deref(),
            Some("op `mm` has no CUDA kernel")
        );
        clear();
        // By its text alone (made without `error_text`).
        assert_eq!(
            no_kernel(&format!("backward failed: {text}")).as_deref(),
            Some("op `mm` has no CUDA kernel")
        );
    }

    #[test]
    fn other_errors_are_not_missing_kernels() {
        clear();
        let e = Error::DeviceUnavailable {
            device: Device::Cuda(0),
            reason: "no driver".into(),
        };
        let text = tensor_error_text(&e);
        assert_eq!(no_kernel(&text), None);
        let e = amp::autograd::Error::invalid("mm", "bad shapes");
        assert_eq!(no_kernel(&error_text(&e)), None);
    }
}
