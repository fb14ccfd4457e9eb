//! The autocast decision as a pure function: (policy, device type, autocast dtype,
//! argument dtypes and call flags) → a cast plan or an error. No tensors, no threads,
//! so every device's policy is testable anywhere (cuda without a GPU).

use amp_policy::{CastPolicy, DeviceType};
use amp_tensor::{promote_types, DType};

use crate::AutocastError;

/// One tensor argument as the decision sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArgInfo {
    pub dtype: DType,
    pub device: DeviceType,
}

/// How the op was called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallFlags {
    /// In place (`add_`): never autocast.
    pub inplace: bool,
    /// Writes into `out=`: never autocast.
    pub out: bool,
    /// Called with an explicit `dtype=`: never autocast.
    pub explicit_dtype: bool,
    /// The op has a `dtype=` parameter (for `fp32_set_opt_dtype`).
    pub accepts_dtype: bool,
}

/// What to do before the op runs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CastPlan {
    /// Per argument: the dtype to cast it to, or `None` to leave it.
    pub casts: Vec<Option<DType>>,
    /// A `dtype=` to run the op with (`fp32_set_opt_dtype`).
    pub set_dtype: Option<DType>,
}

impl CastPlan {
    /// `true` when nothing changes.
    pub fn is_noop(&self) -> bool {
        self.set_dtype.is_none() && self.casts.iter().all(Option::is_none)
    }
}

/// Autocast eligibility: floating point, on the region's device type, not float64.
pub fn is_eligible(arg: ArgInfo, device: DeviceType) -> bool {
    arg.device == device && arg.dtype.is_floating_point() && arg.dtype != DType::F64
}

/// Decide what autocast does to one call of an op with `policy`, under a region of
/// `device` with lower-precision dtype `autocast_dtype`. `banned_message` is the text
/// of a banned op.
pub fn decide(
    policy: CastPolicy,
    banned_message: Option<&str>,
    device: DeviceType,
    autocast_dtype: DType,
    args: &[ArgInfo],
    flags: CallFlags,
) -> Result<CastPlan, AutocastError> {
    let mut plan = CastPlan {
        casts: vec![None; args.len()],
        set_dtype: None,
    };
    if flags.inplace || flags.out || flags.explicit_dtype {
        return Ok(plan);
    }
    let cast_all_to = |plan: &mut CastPlan, to: DType| {
        for (slot, a) in plan.casts.iter_mut().zip(args) {
            if is_eligible(*a, device) && a.dtype != to {
                *slot = Some(to);
            }
        }
    };
    match policy {
        CastPolicy::None => {}
        CastPolicy::LowerPrecisionFp => cast_all_to(&mut plan, autocast_dtype),
        CastPolicy::Fp32 => cast_all_to(&mut plan, DType::F32),
        CastPolicy::Fp32SetOptDtype => {
            if flags.accepts_dtype && args.first().is_some_and(|a| is_eligible(*a, device)) {
                plan.set_dtype = Some(DType::F32);
            }
        }
        CastPolicy::Promote => {
            let widest = args
                .iter()
                .filter(|a| is_eligible(**a, device))
                .fold(autocast_dtype, |acc, a| promote_types(acc, a.dtype));
            cast_all_to(&mut plan, widest);
        }
        CastPolicy::Banned => {
            return Err(AutocastError::Banned(
                banned_message
                    .unwrap_or("this op is banned under autocast")
                    .to_string(),
            ))
        }
    }
    Ok(plan)
}

/// The dtypes a device type can autocast to.
pub fn supported_dtypes(device: DeviceType) -> &'static [DType] {
    match device {
        DeviceType::Cpu => &[DType::BF16, DType::F16],
        DeviceType::Cuda => &[DType::F16, DType::BF16],
    }
}

/// The default lower-precision dtype: float16 on cuda, bfloat16 on cpu.
pub fn default_dtype(device: DeviceType) -> DType {
    match device {
        DeviceType::Cpu => DType::BF16,
        DeviceType::Cuda => DType::F16,
    }
}

/// Fail unless `dtype` is one `device` can autocast to.
pub fn check_dtype(device: DeviceType, dtype: DType) -> Result<(), AutocastError> {
    if supported_dtypes(device).contains(&dtype) {
        Ok(())
    } else {
        Err(AutocastError::UnsupportedDType {
            device,
            dtype,
            supported: match device {
                DeviceType::Cpu => "torch.bfloat16, torch.float16",
                DeviceType::Cuda => "torch.float16, torch.bfloat16",
            },
        })
    }
}
