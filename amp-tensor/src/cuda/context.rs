//! One context and one stream per device, created on first use.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaStream, DriverError};

use super::Library;
use crate::{Device, Error, Result, SharedError};

/// A device's context and the stream every operation on it is queued on.
///
/// One stream per device orders every launch, copy and free, so no event tracking is
/// needed and nothing waits on the host except an explicit read back.
#[derive(Debug)]
pub struct DeviceContext {
    /// The device.
    pub device: Device,
    /// The primary context.
    pub ctx: Arc<CudaContext>,
    /// The stream all work on this device goes to.
    pub stream: Arc<CudaStream>,
}

/// A driver error of `op` on `device` as an [`Error::DeviceFailure`].
pub fn driver_error(op: &'static str, device: Device) -> impl Fn(DriverError) -> Error {
    move |e| Error::DeviceFailure {
        op,
        device,
        source: SharedError::new(e),
    }
}

/// The context of `device` (created once per process and device).
///
/// # Errors
/// [`Error::DeviceUnavailable`] when the driver is missing or the ordinal does not exist;
/// [`Error::DeviceFailure`] when the context cannot be created.
pub fn device_context(device: Device) -> Result<Arc<DeviceContext>> {
    static CONTEXTS: Mutex<Vec<Option<Arc<DeviceContext>>>> = Mutex::new(Vec::new());
    let ordinal = super::ensure_device(device, &[Library::Driver])?;
    let mut all = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
    if all.len() <= ordinal {
        all.resize(ordinal + 1, None);
    }
    if let Some(c) = &all[ordinal] {
        return Ok(c.clone());
    }
    let ctx = CudaContext::new(ordinal).map_err(driver_error("cuCtxCreate", device))?;
    // SAFETY: every buffer of this device is used on its one stream only, so the
    // per-buffer events cudarc records for cross-stream ordering are never needed.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx
        .new_stream()
        .map_err(driver_error("cuStreamCreate", device))?;
    let c = Arc::new(DeviceContext {
        device,
        ctx,
        stream,
    });
    all[ordinal] = Some(c.clone());
    Ok(c)
}

impl DeviceContext {
    /// Block the host until everything queued on this device's stream has run.
    ///
    /// # Errors
    /// [`Error::DeviceFailure`] with the error of any earlier asynchronous failure.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(driver_error("cuStreamSynchronize", self.device))
    }
}
