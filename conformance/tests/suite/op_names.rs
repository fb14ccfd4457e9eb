//! The op names the workspace declares (`amp_autograd::ops::names`, the unary and binary
//! ones taken from their kernels) held against the documented policy lists (both
//! profiles, both device types) and against the ops the conformance op table runs, both
//! ways: a name misspelt in any of the three places leaves a name on one side that the
//! other does not know, and the test names it.

use std::collections::BTreeSet;

use amp::policy::{DeviceType, Profile};

/// Declared names that no policy list names and no conformance vector runs: ops on no
/// autocast list (policy `none`) whose own crates' tests pin them. A name here that stops
/// being declared (misspelt, removed) fails the test as a stale entry.
const DECLARED_ONLY: &[&str] = &[
    // elementwise
    "atan",
    "clamp",
    "ceil",
    "cos",
    "erf",
    "floor",
    "maximum",
    "minimum",
    "round",
    "rsub",
    "sign",
    "sin",
    "square",
    "to",
    "where",
    // reductions
    "amax",
    "amin",
    "max",
    "min",
    "std",
    "var",
    // views, shapes and indexing
    "contiguous",
    "expand",
    "gather",
    "index_add",
    "index_select",
    "narrow",
    "permute",
    "select",
    "split",
    "squeeze",
    "unsqueeze",
    "view",
    // pooling and padding in the dimension counts the vectors do not cover
    "_pad_circular",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_max_pool1d",
    "adaptive_max_pool2d",
    "avg_pool1d",
    "constant_pad_nd",
    "max_pool1d",
    "max_unpool1d",
    "reflection_pad3d",
    // the rest
    "dropout",
    "linalg_solve_triangular",
    "outer",
    "pairwise_distance",
];

/// Ops of the policy lists that the workspace does not implement (no declared name):
/// PyTorch lists them, the conformance report counts them as not executable. Printed by
/// the test.
const LISTED_NOT_IMPLEMENTED: &[&str] = &[
    // complex numbers and spectral ops
    "eig",
    "fft_fft",
    "fft_fft2",
    "fft_fftn",
    "fft_hfft",
    "fft_ifft",
    "fft_ifft2",
    "fft_ifftn",
    "fft_ihfft",
    "fft_irfft",
    "fft_irfft2",
    "fft_irfftn",
    "fft_rfft",
    "fft_rfft2",
    "fft_rfftn",
    "linalg_eig",
    "linalg_eigvals",
    "polar",
    "stft",
    "view_as_complex",
    // upsampling
    "_upsample_bicubic2d_aa",
    "_upsample_bilinear2d_aa",
    "_upsample_nearest_exact1d",
    "_upsample_nearest_exact2d",
    "_upsample_nearest_exact3d",
    "upsample_bicubic2d",
    "upsample_bilinear2d",
    "upsample_linear1d",
    "upsample_nearest1d",
    "upsample_nearest2d",
    "upsample_nearest3d",
    "upsample_trilinear3d",
    // the rest
    "conv_tbc",
    "einsum",
    "linalg_vecdot",
    "rms_norm",
    "vdot",
];

/// Ops the conformance table runs (or the lists name) under other declared names: the
/// recurrent and attention modules enter as the ops they are built from (cells, products); the
/// ATen `grid_sampler*` kernels are the aliases of `grid_sample`, which enters the dispatch
/// point under that name and takes their policy.
const RUN_UNDER_ANOTHER_NAME: &[&str] = &[
    "GRU",
    "LSTM",
    "MultiheadAttention",
    "_grid_sampler_2d_cpu_fallback",
    "grid_sampler",
    "grid_sampler_2d",
    "grid_sampler_3d",
];

fn declared() -> BTreeSet<&'static str> {
    let mut names = BTreeSet::new();
    for op in amp::autograd::ops::names::all() {
        names.insert(op.name());
    }
    names
}

/// Every op named by a list (or an alias) of either profile, on either device type.
fn listed() -> BTreeSet<&'static str> {
    let mut names = BTreeSet::new();
    for profile in [Profile::docs(), Profile::torch_2_15()] {
        for device in DeviceType::ALL {
            names.extend(profile.entries(device).map(|e| e.op()));
            names.extend(profile.aliases(device).iter().map(|a| a.name()));
        }
    }
    names
}

/// Every op the conformance op table runs: an op of a vector (or of
/// `CALLS_WITHOUT_VECTORS`) whose call has an entry serving it.
fn run_by_conformance() -> BTreeSet<String> {
    let table = conformance::ops::table();
    let files = conformance::builtin_files();
    let mut pairs: Vec<(&str, &str)> = files.iter().flat_map(|f| f.cases.op_calls()).collect();
    pairs.extend(conformance::ops::CALLS_WITHOUT_VECTORS.iter().copied());
    pairs
        .into_iter()
        .filter(|(op, call)| table.supports(op, call))
        .map(|(op, _)| op.to_owned())
        .collect()
}

fn report(what: &str, names: &[&str]) -> String {
    if names.is_empty() {
        String::new()
    } else {
        format!("{what}: {names:?}\n")
    }
}

#[test]
fn declared_op_names_match_the_policy_lists_and_the_conformance_table() {
    let declared = declared();
    let listed = listed();
    let run = run_by_conformance();
    let run: BTreeSet<&str> = run.iter().map(String::as_str).collect();

    let allowed_undeclared: Vec<&str> = LISTED_NOT_IMPLEMENTED
        .iter()
        .chain(RUN_UNDER_ANOTHER_NAME)
        .copied()
        .collect();
    eprintln!(
        "op_names: {} declared, {} listed, {} run by conformance; listed but not implemented \
         ({}): {:?}",
        declared.len(),
        listed.len(),
        run.len(),
        LISTED_NOT_IMPLEMENTED.len(),
        LISTED_NOT_IMPLEMENTED
    );

    // Declared → known: every declared name is listed, run by conformance, or allowed.
    let unknown: Vec<&str> = declared
        .iter()
        .copied()
        .filter(|n| !listed.contains(n) && !run.contains(n) && !DECLARED_ONLY.contains(n))
        .collect();
    // Listed → declared.
    let listed_undeclared: Vec<&str> = listed
        .iter()
        .copied()
        .filter(|n| !declared.contains(n) && !allowed_undeclared.contains(n))
        .collect();
    // Run by conformance → declared.
    let run_undeclared: Vec<&str> = run
        .iter()
        .copied()
        .filter(|n| !declared.contains(n) && !allowed_undeclared.contains(n))
        .collect();
    // The allow-lists stay true: an entry that no longer needs its exception is removed.
    let stale: Vec<&str> = DECLARED_ONLY
        .iter()
        .copied()
        .filter(|n| !declared.contains(n) || listed.contains(n) || run.contains(n))
        .chain(
            allowed_undeclared
                .iter()
                .copied()
                .filter(|n| declared.contains(n) || !(listed.contains(n) || run.contains(n))),
        )
        .collect();

    let problems = [
        report(
            "declared op names that no policy list names and no conformance vector runs",
            &unknown,
        ),
        report(
            "op names of the policy lists that no op declares",
            &listed_undeclared,
        ),
        report(
            "op names the conformance op table runs that no op declares",
            &run_undeclared,
        ),
        report("stale allow-list entries", &stale),
    ]
    .concat();
    assert!(problems.is_empty(), "op names disagree:\n{problems}");
}
