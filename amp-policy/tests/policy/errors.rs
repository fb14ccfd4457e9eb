//! Names that do not parse, and their typed errors.

use amp_policy::{CastPolicy, DeviceType, PolicyError, Profile};

#[test]
fn device_types() {
    for d in DeviceType::ALL {
        assert_eq!(d.to_string().parse::<DeviceType>(), Ok(d));
        assert_eq!(serde_json::to_string(&d).unwrap(), format!("\"{d}\""));
        assert_eq!(
            serde_json::from_str::<DeviceType>(&format!("\"{d}\"")).unwrap(),
            d
        );
    }
    assert_eq!(DeviceType::Cpu.index(), 0);
    assert_eq!(DeviceType::Cuda.index(), 1);
    let err = "xla".parse::<DeviceType>().unwrap_err();
    assert_eq!(err, PolicyError::UnknownDevice("xla".into()));
    assert_eq!(
        err.to_string(),
        "unknown device type `xla` (expected `cpu` or `cuda`)"
    );
    assert!("CUDA".parse::<DeviceType>().is_err());
    assert!("".parse::<DeviceType>().is_err());
}

#[test]
fn cast_policies() {
    let names = [
        "lower_precision_fp",
        "fp32",
        "fp32_set_opt_dtype",
        "promote",
        "banned",
        "none",
    ];
    for (p, name) in CastPolicy::ALL.into_iter().zip(names) {
        assert_eq!(p.as_str(), name);
        assert_eq!(p.to_string(), name);
        assert_eq!(name.parse::<CastPolicy>(), Ok(p));
        assert_eq!(serde_json::to_string(&p).unwrap(), format!("\"{name}\""));
        assert_eq!(
            serde_json::from_str::<CastPolicy>(&format!("\"{name}\"")).unwrap(),
            p
        );
        assert_eq!(p.is_autocast(), p != CastPolicy::None);
    }
    assert_eq!(CastPolicy::default(), CastPolicy::None);
    let err = "fp16".parse::<CastPolicy>().unwrap_err();
    assert_eq!(err, PolicyError::UnknownPolicy("fp16".into()));
    assert!(err.to_string().starts_with("unknown cast policy `fp16`"));
}

#[test]
fn profiles() {
    assert_eq!(Profile::NAMES, ["docs", "torch-2.15"]);
    for name in Profile::NAMES {
        assert_eq!(Profile::by_name(name).unwrap().name(), name);
    }
    let err = Profile::by_name("torch-2.16").unwrap_err();
    assert_eq!(
        err,
        PolicyError::UnknownProfile {
            name: "torch-2.16".into(),
            known: "docs, torch-2.15".into()
        }
    );
    assert_eq!(
        err.to_string(),
        "unknown policy profile `torch-2.16` (known profiles: docs, torch-2.15)"
    );
}

#[test]
fn errors_are_std_errors() {
    fn takes(_: &dyn std::error::Error) {}
    takes(&PolicyError::UnknownDevice("x".into()));
}
