//! User overrides, bans and profile data files.

use amp_policy::{CastPolicy, DeviceType, PolicyError, Profile, Source};

const CPU: DeviceType = DeviceType::Cpu;
const CUDA: DeviceType = DeviceType::Cuda;

#[test]
fn override_moves_a_listed_op_and_keeps_the_original_value() {
    let docs = Profile::docs();
    let p = docs.with_override(CUDA, "mm", CastPolicy::Fp32);
    assert_eq!(p.policy_by_name(CUDA, "mm"), CastPolicy::Fp32);
    assert_eq!(
        docs.policy_by_name(CUDA, "mm"),
        CastPolicy::LowerPrecisionFp
    );
    assert_eq!(p.policy_by_name(CPU, "mm"), CastPolicy::LowerPrecisionFp);
    assert_eq!(p.name(), "docs");

    let e = p.entry(CUDA, "mm").unwrap();
    assert_eq!(e.source(), &Source::Override);
    let old = e.replaces().unwrap();
    assert_eq!(old.policy(), CastPolicy::LowerPrecisionFp);
    assert!(
        matches!(old.source(), Source::Documented { list } if list == "CUDA Ops that can autocast to float16")
    );

    // It keeps its documented position.
    let fp32 = p.ops(CUDA, CastPolicy::Fp32);
    let lpf = p.ops(CUDA, CastPolicy::LowerPrecisionFp);
    assert!(fp32.contains(&"mm"));
    assert!(!lpf.contains(&"mm"));
    let pos = p.entries(CUDA).position(|e| e.op() == "mm");
    let docs_pos = docs.entries(CUDA).position(|e| e.op() == "mm");
    assert_eq!(pos, docs_pos);
}

#[test]
fn override_adds_a_custom_op_at_the_end() {
    let p = Profile::docs().with_override(CPU, "my_custom_op", CastPolicy::Promote);
    assert_eq!(p.policy_by_name(CPU, "my_custom_op"), CastPolicy::Promote);
    assert_eq!(p.policy_by_name(CUDA, "my_custom_op"), CastPolicy::None);
    assert_eq!(
        p.ops(CPU, CastPolicy::Promote),
        ["cat", "stack", "index_copy", "my_custom_op"]
    );
    assert_eq!(p.entries(CPU).last().unwrap().op(), "my_custom_op");
    assert!(p.entry(CPU, "my_custom_op").unwrap().replaces().is_none());
    assert_eq!(p.entries(CPU).len(), Profile::docs().entries(CPU).len() + 1);
}

#[test]
fn override_to_none_takes_an_op_off_the_lists() {
    let p = Profile::docs().with_override(CPU, "cat", CastPolicy::None);
    assert_eq!(p.policy_by_name(CPU, "cat"), CastPolicy::None);
    assert_eq!(p.ops(CPU, CastPolicy::None), ["cat"]);
    assert_eq!(p.ops(CPU, CastPolicy::Promote), ["stack", "index_copy"]);
    assert!(p
        .explain(CPU, "cat")
        .starts_with("cat on cpu: none (runs in its input types) — from a user override"));
}

#[test]
fn ban_with_message() {
    let p = Profile::docs().with_ban(CUDA, "mse_loss", "mse_loss: use my_stable_mse instead");
    assert_eq!(p.policy_by_name(CUDA, "mse_loss"), CastPolicy::Banned);
    assert_eq!(
        p.banned_message(CUDA, "mse_loss"),
        Some("mse_loss: use my_stable_mse instead")
    );
    assert_eq!(
        p.ops(CUDA, CastPolicy::Banned),
        ["mse_loss", "binary_cross_entropy"]
    );
    let text = p.explain(CUDA, "mse_loss");
    assert!(
        text.contains("banned (fails under autocast) — from a user override (profile docs)"),
        "{text}"
    );
    assert!(
        text.ends_with("Error message:\nmse_loss: use my_stable_mse instead"),
        "{text}"
    );
    // Unbanning drops the message.
    let q = p.with_override(CUDA, "mse_loss", CastPolicy::Fp32);
    assert_eq!(q.banned_message(CUDA, "mse_loss"), None);
    assert_eq!(q.entry(CUDA, "mse_loss").unwrap().message(), None);
    assert_eq!(
        q.entry(CUDA, "mse_loss")
            .unwrap()
            .replaces()
            .unwrap()
            .policy(),
        CastPolicy::Banned
    );
}

#[test]
fn unban_binary_cross_entropy_on_cuda() {
    let p = Profile::docs().with_override(CUDA, "binary_cross_entropy", CastPolicy::Fp32);
    assert_eq!(
        p.policy_by_name(CUDA, "binary_cross_entropy"),
        CastPolicy::Fp32
    );
    assert_eq!(p.banned_message(CUDA, "binary_cross_entropy"), None);
}

#[test]
fn override_with_banned_policy_gets_a_generic_message() {
    let p = Profile::docs().with_override(CPU, "cat", CastPolicy::Banned);
    assert_eq!(
        p.banned_message(CPU, "cat"),
        Some("cat is banned under cpu autocast by a user override")
    );
}

#[test]
fn overrides_chain_and_are_values() {
    let docs = Profile::docs();
    let a = docs.with_override(CPU, "op_a", CastPolicy::Fp32);
    let b = a.with_override(CPU, "op_b", CastPolicy::LowerPrecisionFp);
    assert_eq!(a.policy_by_name(CPU, "op_b"), CastPolicy::None);
    assert_eq!(b.policy_by_name(CPU, "op_a"), CastPolicy::Fp32);
    assert_eq!(b.policy_by_name(CPU, "op_b"), CastPolicy::LowerPrecisionFp);
    let c = b.clone();
    assert!(c.ptr_eq(&b));
    assert!(!c.ptr_eq(&a));
    // Overriding twice keeps the history.
    let d = b.with_override(CPU, "op_a", CastPolicy::Promote);
    let e = d.entry(CPU, "op_a").unwrap();
    assert_eq!(e.policy(), CastPolicy::Promote);
    assert_eq!(e.replaces().unwrap().policy(), CastPolicy::Fp32);
    assert!(d
        .explain(CPU, "op_a")
        .contains("replaces fp32 from an earlier user override"));
}

#[test]
fn aliases_follow_overrides_of_their_target() {
    let p = Profile::docs().with_override(CPU, "grid_sampler", CastPolicy::Promote);
    assert_eq!(p.policy_by_name(CPU, "grid_sample"), CastPolicy::Promote);
    // An override of the alias name itself gives it its own entry.
    let q = p.with_override(CPU, "grid_sample", CastPolicy::LowerPrecisionFp);
    assert_eq!(
        q.policy_by_name(CPU, "grid_sample"),
        CastPolicy::LowerPrecisionFp
    );
    assert_eq!(q.policy_by_name(CPU, "grid_sampler"), CastPolicy::Promote);
    assert_eq!(
        q.listed_policy(CPU, "grid_sample"),
        CastPolicy::LowerPrecisionFp
    );
}

#[test]
fn profiles_are_send_sync_and_cheap_to_clone() {
    fn assert_send_sync<T: Send + Sync + Clone>() {}
    assert_send_sync::<Profile>();
    let a = Profile::docs();
    let b = Profile::docs();
    assert!(a.ptr_eq(&b), "docs() is loaded once");
    assert!(Profile::default().ptr_eq(&a));
    let t = std::thread::spawn(move || b.policy_by_name(CUDA, "mm"))
        .join()
        .unwrap();
    assert_eq!(t, CastPolicy::LowerPrecisionFp);
}

#[test]
fn torch_2_15_profile() {
    let t = Profile::torch_2_15();
    assert_eq!(t.name(), "torch-2.15");
    assert!(Profile::by_name("torch-2.15").unwrap().ptr_eq(&t));
    let lower = CastPolicy::LowerPrecisionFp;
    for op in [
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "prelu",
        "scaled_dot_product_attention",
        "linalg_vecdot",
        "conv_tbc",
    ] {
        assert_eq!(t.policy_by_name(CPU, op), lower, "{op}");
    }
    for op in [
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "nll_loss",
        "cross_entropy",
        "binary_cross_entropy_with_logits",
        "poisson_nll_loss",
        "hinge_embedding_loss",
        "margin_ranking_loss",
        "soft_margin_loss",
        "multi_margin_loss",
        "cosine_embedding_loss",
        "triplet_margin_loss",
    ] {
        assert_eq!(t.policy_by_name(CPU, op), CastPolicy::Fp32, "{op}");
    }
    for op in [
        "rms_norm",
        "logsumexp",
        "huber_loss",
        "upsample_nearest2d",
        "upsample_bilinear2d",
    ] {
        assert_eq!(t.policy_by_name(CUDA, op), CastPolicy::Fp32, "{op}");
    }
    assert_eq!(
        t.policy_by_name(CUDA, "einsum"),
        CastPolicy::LowerPrecisionFp
    );
    assert_eq!(t.policy_by_name(CUDA, "vdot"), CastPolicy::Promote);
    for op in [
        "sum",
        "prod",
        "softmax",
        "log_softmax",
        "cumsum",
        "cumprod",
        "norm",
    ] {
        assert_eq!(
            t.policy_by_name(CUDA, op),
            CastPolicy::Fp32SetOptDtype,
            "{op}"
        );
    }
    // Unchanged from docs.
    assert_eq!(t.policy_by_name(CUDA, "mm"), CastPolicy::LowerPrecisionFp);
    assert_eq!(t.policy_by_name(CPU, "prod"), CastPolicy::Fp32);
    assert_eq!(
        t.policy_by_name(CPU, "binary_cross_entropy"),
        CastPolicy::Fp32
    );
    assert_eq!(
        t.policy_by_name(CUDA, "binary_cross_entropy"),
        CastPolicy::Banned
    );
    assert!(matches!(
        t.entry(CPU, "prelu").unwrap().source(),
        Source::Profile { profile, .. } if profile == "torch-2.15"
    ));
    // Overrides apply over it too.
    let u = t.with_override(CPU, "prelu", CastPolicy::None);
    assert_eq!(u.name(), "torch-2.15");
    assert_eq!(u.policy_by_name(CPU, "prelu"), CastPolicy::None);
}

const CUSTOM_PROFILE: &str = r#"{
  "format": "amp-policy-profile/1",
  "profile": "my-profile",
  "base": "docs",
  "source": "a test",
  "changes": [
    {"device": "cuda", "policy": "banned", "ops": ["my_op"], "note": "not safe",
     "message": ["line one", "line two"]},
    {"device": "cpu", "policy": "none", "ops": ["cat"], "note": "leave cat alone"}
  ]
}"#;

#[test]
fn a_profile_from_a_user_data_file() {
    let p = Profile::docs().with_changes_json(CUSTOM_PROFILE).unwrap();
    assert_eq!(p.name(), "my-profile");
    assert_eq!(p.banned_message(CUDA, "my_op"), Some("line one\nline two"));
    assert_eq!(p.policy_by_name(CPU, "cat"), CastPolicy::None);
    assert_eq!(
        p.explain(CPU, "cat"),
        "cat on cpu: none (runs in its input types) — from profile my-profile: leave cat alone; \
         replaces promote from the documented CPU list `CPU Ops that promote to the widest input type`"
    );
}

fn bad(result: Result<Profile, PolicyError>) -> String {
    match result {
        Err(PolicyError::BadData { reason, .. }) => reason,
        Err(other) => panic!("expected BadData, got {other:?}"),
        Ok(p) => panic!("expected BadData, got profile {p:?}"),
    }
}

#[test]
fn bad_profile_files() {
    let docs = Profile::docs();
    assert!(bad(docs.with_changes_json("{")).contains("EOF"));
    let base = CUSTOM_PROFILE.replace("\"base\": \"docs\"", "\"base\": \"torch-2.15\"");
    assert!(bad(docs.with_changes_json(&base)).contains("applies over `torch-2.15`"));
    let fmt = CUSTOM_PROFILE.replace("amp-policy-profile/1", "amp-policy-profile/9");
    assert!(bad(docs.with_changes_json(&fmt)).contains("format"));
    let no_msg = CUSTOM_PROFILE.replace(r#""message": ["line one", "line two"]"#, r#""extra": 1"#);
    assert!(bad(docs.with_changes_json(&no_msg)).contains("unknown field"));
    let no_msg = CUSTOM_PROFILE.replace(
        r#", "note": "not safe",
     "message": ["line one", "line two"]"#,
        r#", "note": "not safe""#,
    );
    assert!(bad(docs.with_changes_json(&no_msg)).contains("needs a message"));
    let twice = CUSTOM_PROFILE.replace(r#""ops": ["cat"]"#, r#""ops": ["cat", "cat"]"#);
    assert!(bad(docs.with_changes_json(&twice)).contains("changed twice"));
    let same = CUSTOM_PROFILE.replace(
        r#""policy": "none", "ops": ["cat"]"#,
        r#""policy": "promote", "ops": ["cat"]"#,
    );
    assert!(bad(docs.with_changes_json(&same)).contains("already promote"));
    let policy = CUSTOM_PROFILE.replace(r#""policy": "none""#, r#""policy": "fp16""#);
    assert!(bad(docs.with_changes_json(&policy)).contains("unknown variant `fp16`"));
    let device = CUSTOM_PROFILE.replace(r#""device": "cpu""#, r#""device": "xla""#);
    assert!(bad(docs.with_changes_json(&device)).contains("unknown variant `xla`"));
}

const CPU_TABLE: &str = r#"{
  "format": "amp-policy-table/1", "device": "cpu", "source": "test",
  "lists": [
    {"title": "low", "policy": "lower_precision_fp", "ops": ["mm", "t_op"]},
    {"title": "f32", "policy": "fp32", "ops": ["t_sum"]}
  ],
  "aliases": [{"name": "t_alias", "of": "t_op", "why": "same op"}]
}"#;

const CUDA_TABLE: &str = r#"{
  "format": "amp-policy-table/1", "device": "cuda", "source": "test",
  "lists": [{"title": "ban", "policy": "banned", "ops": ["t_op"], "message": "no"}]
}"#;

#[test]
fn a_profile_from_user_tables() {
    let p = Profile::from_json("mine", CPU_TABLE, CUDA_TABLE).unwrap();
    assert_eq!(p.name(), "mine");
    assert_eq!(p.policy_by_name(CPU, "t_op"), CastPolicy::LowerPrecisionFp);
    assert_eq!(
        p.policy_by_name(CPU, "t_alias"),
        CastPolicy::LowerPrecisionFp
    );
    assert_eq!(p.listed_policy(CPU, "t_alias"), CastPolicy::None);
    assert_eq!(p.banned_message(CUDA, "t_op"), Some("no"));
    assert_eq!(p.ops(CPU, CastPolicy::LowerPrecisionFp), ["mm", "t_op"]);
    assert_eq!(
        p.explain(CPU, "t_alias"),
        "t_alias on cpu: lower_precision_fp (autocast to the lower-precision dtype) — as `t_op` \
         (same op), from the documented CPU list `low` (profile mine)"
    );
}

#[test]
fn bad_table_files() {
    assert!(bad(Profile::from_json("x", CUDA_TABLE, CUDA_TABLE))
        .contains("table is for `cuda`, expected `cpu`"));
    let twice = CPU_TABLE.replace(r#"["t_sum"]"#, r#"["t_sum", "mm"]"#);
    assert!(bad(Profile::from_json("x", &twice, CUDA_TABLE)).contains("listed twice"));
    let none = CPU_TABLE.replace(r#""policy": "fp32""#, r#""policy": "none""#);
    assert!(bad(Profile::from_json("x", &none, CUDA_TABLE)).contains("cannot have policy none"));
    let msg = CPU_TABLE.replace(
        r#""ops": ["t_sum"]"#,
        r#""ops": ["t_sum"], "message": "why""#,
    );
    assert!(
        bad(Profile::from_json("x", &msg, CUDA_TABLE)).contains("only banned ops carry a message")
    );
    let empty = CPU_TABLE.replace(r#"["t_sum"]"#, r#"[]"#);
    assert!(bad(Profile::from_json("x", &empty, CUDA_TABLE)).contains("no ops"));
    let blank = CPU_TABLE.replace(r#"["t_sum"]"#, r#"[" t_sum"]"#);
    assert!(bad(Profile::from_json("x", &blank, CUDA_TABLE)).contains("whitespace"));
    let alias = CPU_TABLE.replace(r#""of": "t_op""#, r#""of": "t_missing""#);
    assert!(bad(Profile::from_json("x", &alias, CUDA_TABLE)).contains("not listed"));
    let alias = CPU_TABLE.replace(r#""name": "t_alias""#, r#""name": "mm""#);
    assert!(bad(Profile::from_json("x", &alias, CUDA_TABLE)).contains("also listed"));
    let alias = CPU_TABLE.replace(r#""name": "t_alias""#, r#""name": "t_op""#);
    assert!(bad(Profile::from_json("x", &alias, CUDA_TABLE)).contains("names itself"));
    let err = Profile::from_json("x", "[]", CUDA_TABLE).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("bad policy data file `x: cpu table`: "),
        "{err}"
    );
}
