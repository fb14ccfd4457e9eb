//! The data-file formats: a device table (`amp-policy-table/1`) and a profile's changes
//! over its base (`amp-policy-profile/1`), and their embedded built-in instances.

use std::collections::HashSet;

use serde::Deserialize;

use crate::table::Table;
use crate::{Alias, CastPolicy, DeviceType, Entry, OpId, PolicyError, Source};

/// The documented CUDA lists.
pub(crate) const DOCS_CUDA: (&str, &str) = (
    "data/docs/cuda.json",
    include_str!("../data/docs/cuda.json"),
);
/// The documented CPU lists.
pub(crate) const DOCS_CPU: (&str, &str) =
    ("data/docs/cpu.json", include_str!("../data/docs/cpu.json"));
/// PyTorch 2.15's differences from the documented lists.
pub(crate) const TORCH_2_15: (&str, &str) = (
    "data/profiles/torch-2.15.json",
    include_str!("../data/profiles/torch-2.15.json"),
);

const TABLE_FORMAT: &str = "amp-policy-table/1";
const PROFILE_FORMAT: &str = "amp-policy-profile/1";

/// A ban message: one string, or a list of lines joined with `\n`.
#[derive(Deserialize)]
#[serde(untagged)]
enum Message {
    One(String),
    Lines(Vec<String>),
}

impl Message {
    fn into_string(self) -> String {
        match self {
            Message::One(s) => s,
            Message::Lines(lines) => lines.join("\n"),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TableFile {
    format: String,
    device: DeviceType,
    // Provenance, for readers of the file.
    #[serde(rename = "source")]
    _source: String,
    #[serde(default, rename = "notes")]
    _notes: Vec<String>,
    lists: Vec<ListFile>,
    #[serde(default)]
    aliases: Vec<AliasFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListFile {
    title: String,
    policy: CastPolicy,
    ops: Vec<String>,
    #[serde(default)]
    message: Option<Message>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AliasFile {
    name: String,
    of: String,
    why: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    format: String,
    profile: String,
    base: String,
    #[serde(rename = "source")]
    _source: String,
    #[serde(default, rename = "notes")]
    _notes: Vec<String>,
    changes: Vec<ChangeFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChangeFile {
    device: DeviceType,
    policy: CastPolicy,
    ops: Vec<String>,
    note: String,
    #[serde(default)]
    message: Option<Message>,
}

fn check_op(file: &str, op: &str) -> Result<(), PolicyError> {
    if op.is_empty() || op.trim() != op {
        return Err(PolicyError::bad_data(
            file,
            format!("op name {op:?} is empty or has surrounding whitespace"),
        ));
    }
    Ok(())
}

fn check_message(
    file: &str,
    what: &str,
    policy: CastPolicy,
    message: Option<Message>,
) -> Result<Option<String>, PolicyError> {
    match (policy, message) {
        (CastPolicy::Banned, Some(m)) => {
            let m = m.into_string();
            if m.is_empty() {
                Err(PolicyError::bad_data(
                    file,
                    format!("{what}: empty ban message"),
                ))
            } else {
                Ok(Some(m))
            }
        }
        (CastPolicy::Banned, None) => Err(PolicyError::bad_data(
            file,
            format!("{what}: a banned op needs a message"),
        )),
        (_, Some(_)) => Err(PolicyError::bad_data(
            file,
            format!("{what}: only banned ops carry a message"),
        )),
        (_, None) => Ok(None),
    }
}

fn check_alias(file: &str, name: &str, of: &str) -> Result<(OpId, OpId), PolicyError> {
    check_op(file, name)?;
    check_op(file, of)?;
    if name == of {
        return Err(PolicyError::bad_data(
            file,
            format!("alias `{name}` names itself"),
        ));
    }
    Ok((OpId::intern(name), OpId::intern(of)))
}

/// Parses one of the data files: JSON whose `format` field (read by `format_of`) must be
/// `expect`.
fn parse_versioned<T: serde::de::DeserializeOwned>(
    file: &str,
    json: &str,
    expect: &str,
    format_of: impl Fn(&T) -> &String,
) -> Result<T, PolicyError> {
    let parsed: T =
        serde_json::from_str(json).map_err(|e| PolicyError::bad_data(file, e.to_string()))?;
    let format = format_of(&parsed);
    if format != expect {
        return Err(PolicyError::bad_data(
            file,
            format!("format is `{format}`, expected `{expect}`"),
        ));
    }
    Ok(parsed)
}

/// Parses a device table (`amp-policy-table/1`). `expect` is the device the caller wants.
pub(crate) fn parse_table(
    file: &str,
    json: &str,
    expect: DeviceType,
) -> Result<Table, PolicyError> {
    let parsed: TableFile = parse_versioned(file, json, TABLE_FORMAT, |f: &TableFile| &f.format)?;
    if parsed.device != expect {
        return Err(PolicyError::bad_data(
            file,
            format!("table is for `{}`, expected `{expect}`", parsed.device),
        ));
    }
    let mut table = Table::new(parsed.device);
    let mut seen = HashSet::new();
    for list in parsed.lists {
        let what = format!("list `{}`", list.title);
        if list.policy == CastPolicy::None {
            return Err(PolicyError::bad_data(
                file,
                format!("{what}: a documented list cannot have policy none"),
            ));
        }
        if list.ops.is_empty() {
            return Err(PolicyError::bad_data(file, format!("{what}: no ops")));
        }
        let message = check_message(file, &what, list.policy, list.message)?;
        for op in &list.ops {
            check_op(file, op)?;
            if !seen.insert(op.clone()) {
                return Err(PolicyError::bad_data(
                    file,
                    format!("op `{op}` is listed twice on {}", parsed.device),
                ));
            }
            let source = Source::Documented {
                list: list.title.clone(),
            };
            table.set_deferred(Entry::new(
                OpId::intern(op),
                list.policy,
                message.clone(),
                source,
            ));
        }
    }
    for a in parsed.aliases {
        let (id, of) = check_alias(file, &a.name, &a.of)?;
        if table.contains(id) {
            return Err(PolicyError::bad_data(
                file,
                format!("alias `{}` is also listed as an op", a.name),
            ));
        }
        if !table.contains(of) {
            return Err(PolicyError::bad_data(
                file,
                format!("alias `{}` names `{}`, which is not listed", a.name, a.of),
            ));
        }
        table.push_alias_deferred(Alias::new(id, of, a.why));
    }
    table.rebuild();
    Ok(table)
}

/// The result of parsing a profile file: its name and the changed tables.
pub(crate) struct AppliedProfile {
    pub(crate) name: String,
    pub(crate) tables: [Table; 2],
}

/// Applies a profile file (`amp-policy-profile/1`) to the tables of `base_name`.
pub(crate) fn apply_profile(
    file: &str,
    json: &str,
    base_name: &str,
    base: &[Table; 2],
) -> Result<AppliedProfile, PolicyError> {
    let parsed: ProfileFile =
        parse_versioned(file, json, PROFILE_FORMAT, |f: &ProfileFile| &f.format)?;
    if parsed.profile.is_empty() {
        return Err(PolicyError::bad_data(file, "empty profile name"));
    }
    if parsed.base != base_name {
        return Err(PolicyError::bad_data(
            file,
            format!(
                "profile `{}` applies over `{}`, not over `{base_name}`",
                parsed.profile, parsed.base
            ),
        ));
    }
    let mut tables = base.clone();
    let mut seen = HashSet::new();
    for change in parsed.changes {
        let what = format!("change `{}` on {}", change.note, change.device);
        if change.ops.is_empty() {
            return Err(PolicyError::bad_data(file, format!("{what}: no ops")));
        }
        let message = check_message(file, &what, change.policy, change.message)?;
        let table = &mut tables[change.device.index()];
        for op in &change.ops {
            check_op(file, op)?;
            if !seen.insert((change.device, op.clone())) {
                return Err(PolicyError::bad_data(
                    file,
                    format!("op `{op}` is changed twice on {}", change.device),
                ));
            }
            let id = OpId::intern(op);
            if table.own(id).map(Entry::policy) == Some(change.policy) {
                return Err(PolicyError::bad_data(
                    file,
                    format!(
                        "op `{op}` on {} is already {} in `{base_name}`",
                        change.device, change.policy
                    ),
                ));
            }
            let source = Source::Profile {
                profile: parsed.profile.clone(),
                note: change.note.clone(),
            };
            table.set_deferred(Entry::new(id, change.policy, message.clone(), source));
        }
    }
    for t in &mut tables {
        t.rebuild();
    }
    Ok(AppliedProfile {
        name: parsed.profile,
        tables,
    })
}
