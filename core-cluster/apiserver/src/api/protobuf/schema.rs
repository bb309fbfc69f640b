//! The message table: every protobuf message the server encodes or decodes, with each
//! field's tag, JSON name and type, parsed once from `schema.txt`.
//!
//! The table is generated from kube-rs' `k8s-pb` crate (its prost attributes) and the
//! k8s-openapi schemas (the JSON names) by `tests/it/protobuf_schema.rs`, which also checks
//! that the committed file is what k8s-pb gives today.

use std::{collections::HashMap, sync::OnceLock};

/// The committed table.
const TABLE: &str = include_str!("schema.txt");

/// The wire and JSON type of a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `string`: a JSON string.
    String,
    /// `int32`: a JSON number.
    Int32,
    /// `int64`: a JSON number.
    Int64,
    /// `bool`.
    Bool,
    /// `bytes`: a base64 JSON string.
    Bytes,
    /// `double`: a JSON number.
    Double,
    /// An embedded message.
    Message(&'static str),
    /// `map<string, V>`: a JSON object.
    Map(MapValue),
}

/// The value type of a map field (keys are always strings in Kubernetes' messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MapValue {
    /// `map<string, string>`.
    String,
    /// `map<string, bytes>` (`Secret.data`).
    Bytes,
    /// `map<string, Message>` (`ResourceList`).
    Message(&'static str),
}

/// One field of a message.
#[derive(Debug, Clone)]
pub(crate) struct Field {
    /// The protobuf tag.
    pub(crate) tag: u32,
    /// The field's name in JSON.
    pub(crate) json: &'static str,
    /// Its type.
    pub(crate) kind: Kind,
    /// Whether it is a list.
    pub(crate) repeated: bool,
    /// Whether it is an embedded message whose fields JSON inlines into this one (Go's
    /// `json:",inline"`; the table writes its JSON name as `*`).
    pub(crate) inline: bool,
}

/// One message.
#[derive(Debug, Default)]
pub(crate) struct Message {
    /// Its fields, in tag order.
    pub(crate) fields: Vec<Field>,
    by_tag: HashMap<u32, usize>,
}

impl Message {
    /// The field with this tag.
    pub(crate) fn by_tag(&self, tag: u32) -> Option<&Field> {
        self.by_tag.get(&tag).map(|&i| &self.fields[i])
    }

    /// The field with this JSON name (not an inlined one).
    #[cfg(test)]
    pub(crate) fn by_json(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| !f.inline && f.json == name)
    }
}

/// The messages by dotted k8s-pb path (`api.core.v1.Node`).
pub(crate) fn messages() -> &'static HashMap<&'static str, Message> {
    static MESSAGES: OnceLock<HashMap<&'static str, Message>> = OnceLock::new();
    MESSAGES.get_or_init(|| parse(TABLE))
}

/// The message named `name`, if the table has it.
pub(crate) fn message(name: &str) -> Option<&'static Message> {
    messages().get(name)
}

/// Parses the table. The file is generated and checked by a test, so a malformed line
/// is skipped rather than failing the server.
fn parse(table: &'static str) -> HashMap<&'static str, Message> {
    let mut out: HashMap<&'static str, Message> = HashMap::new();
    let mut current: Option<&'static str> = None;
    for line in table.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix("message ") {
            current = Some(name);
            out.entry(name).or_default();
            continue;
        }
        let (Some(name), Some(field)) = (current, parse_field(line)) else {
            continue;
        };
        let message = out.entry(name).or_default();
        message.by_tag.insert(field.tag, message.fields.len());
        message.fields.push(field);
    }
    out
}

fn parse_field(line: &'static str) -> Option<Field> {
    let mut parts = line.split(' ');
    let tag = parts.next()?.parse().ok()?;
    let json = parts.next()?;
    let ty = parts.next()?;
    let (ty, repeated) = match ty.strip_suffix("[]") {
        Some(t) => (t, true),
        None => (ty, false),
    };
    let kind = match ty {
        "string" => Kind::String,
        "int32" => Kind::Int32,
        "int64" => Kind::Int64,
        "bool" => Kind::Bool,
        "bytes" => Kind::Bytes,
        "double" => Kind::Double,
        "map<string>" => Kind::Map(MapValue::String),
        "map<bytes>" => Kind::Map(MapValue::Bytes),
        other => match other.strip_prefix("map<").and_then(|m| m.strip_suffix('>')) {
            Some(m) => Kind::Map(MapValue::Message(m)),
            None => Kind::Message(other),
        },
    };
    Some(Field {
        tag,
        json,
        kind,
        repeated,
        inline: json == "*",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_parses_and_resolves() {
        let node = message("api.core.v1.NodeSpec").expect("NodeSpec");
        let cidr = node
            .by_json("podCIDR")
            .expect("podCIDR keeps its JSON name");
        assert_eq!(cidr.kind, Kind::String);
        assert!(!cidr.repeated);
        assert!(node.by_json("podCIDRs").expect("podCIDRs").repeated);
        let spec = message("api.core.v1.ServiceSpec").expect("ServiceSpec");
        assert!(spec.by_json("externalIPs").is_some());
        assert_eq!(
            spec.by_json("selector").map(|f| f.kind),
            Some(Kind::Map(MapValue::String))
        );
        // Probe's handler is inlined in JSON (`httpGet` sits on the probe itself).
        let probe = message("api.core.v1.Probe").expect("Probe");
        assert!(
            probe
                .fields
                .iter()
                .any(|f| f.inline && f.kind == Kind::Message("api.core.v1.ProbeHandler"))
        );
        // Every message a field names is in the table.
        for m in messages().values() {
            for f in &m.fields {
                if let Kind::Message(name) | Kind::Map(MapValue::Message(name)) = f.kind {
                    assert!(message(name).is_some(), "{name} is missing");
                }
            }
        }
    }
}
