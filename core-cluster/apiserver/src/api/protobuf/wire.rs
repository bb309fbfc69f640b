//! The generic transcoder: protobuf wire bytes <-> `serde_json::Value`, driven by the
//! [`schema`] table.
//!
//! Every message is transcoded field by field from its table entry, except the
//! apimachinery types whose JSON form is not their message form, each handled once here:
//! `Time` and `MicroTime` (seconds and nanos <-> RFC 3339; Go's zero time is absent),
//! `Quantity` (a string), `IntOrString` (a number or a string), `RawExtension` and
//! `FieldsV1` (raw JSON bytes <-> the embedded JSON) and `Duration` (nanoseconds <-> Go's
//! duration string).
//!
//! Decoding follows Go's generated unmarshalers: unknown tags are skipped, the last value
//! of a singular field wins, repeated scalars may come packed or not. Go's marshalers
//! write every non-pointer field, so a body from client-go carries `""` for each unset
//! string: those are dropped, so the server sees what kube-apiserver's Go structs see (an
//! empty string and a missing one are the same there). Numbers and booleans are kept,
//! zero or not, because a pointer field's explicit `0` (`replicas: 0`) must survive.

use base64::{Engine, engine::general_purpose::STANDARD};
use bytes::{Buf, BufMut};
use prost::encoding::{
    DecodeContext, WireType, decode_key, decode_varint, encode_key, encode_varint, skip_field,
};
use serde_json::{Map, Number, Value};

use super::schema::{self, Field, Kind, MapValue};

/// `apimachinery.pkg.apis.meta.v1.Time`.
const TIME: &str = "apimachinery.pkg.apis.meta.v1.Time";
/// `apimachinery.pkg.apis.meta.v1.MicroTime`.
const MICRO_TIME: &str = "apimachinery.pkg.apis.meta.v1.MicroTime";
/// `apimachinery.pkg.apis.meta.v1.Duration`.
const DURATION: &str = "apimachinery.pkg.apis.meta.v1.Duration";
/// `apimachinery.pkg.apis.meta.v1.FieldsV1`.
const FIELDS_V1: &str = "apimachinery.pkg.apis.meta.v1.FieldsV1";
/// `apimachinery.pkg.api.resource.Quantity`.
const QUANTITY: &str = "apimachinery.pkg.api.resource.Quantity";
/// `apimachinery.pkg.util.intstr.IntOrString`.
const INT_OR_STRING: &str = "apimachinery.pkg.util.intstr.IntOrString";
/// `apimachinery.pkg.runtime.RawExtension`.
const RAW_EXTENSION: &str = "apimachinery.pkg.runtime.RawExtension";
/// apiextensions' `JSON`: any JSON value (a schema's `default`, `example`, `enum` items),
/// its bytes in `raw` as `RawExtension`'s.
const APIEXT_JSON: &str = "apiextensions_apiserver.pkg.apis.apiextensions.v1.Json";
/// A schema.
const SCHEMA_PROPS: &str = "apiextensions_apiserver.pkg.apis.apiextensions.v1.JsonSchemaProps";
/// `JSONSchemaPropsOrBool` (`additionalProperties`, `additionalItems`): in JSON a boolean or
/// a schema; in protobuf `allows` (1) and `schema` (2).
const SCHEMA_OR_BOOL: &str =
    "apiextensions_apiserver.pkg.apis.apiextensions.v1.JsonSchemaPropsOrBool";
/// `JSONSchemaPropsOrArray` (`items`): in JSON a schema or a list of schemas; in protobuf
/// `schema` (1) or `jSONSchemas` (2).
const SCHEMA_OR_ARRAY: &str =
    "apiextensions_apiserver.pkg.apis.apiextensions.v1.JsonSchemaPropsOrArray";
/// `JSONSchemaPropsOrStringArray` (`dependencies`' values): in JSON a schema or a list of
/// strings; in protobuf `schema` (1) or `property` (2).
const SCHEMA_OR_STRINGS: &str =
    "apiextensions_apiserver.pkg.apis.apiextensions.v1.JsonSchemaPropsOrStringArray";

/// Go's zero `time.Time` in Unix seconds (0001-01-01T00:00:00Z).
const GO_ZERO_TIME_SECONDS: i64 = -62_135_596_800;

/// How deeply messages may nest (embedded objects included).
const MAX_DEPTH: usize = 64;

/// Every body may decode to this many elements (messages, list elements, map entries)...
const ELEMENT_BASE: usize = 16 * 1024;
/// ...and one more per this many bytes of it. A 2-byte empty message repeated 300,000
/// times would otherwise become 300,000 objects for the handlers to default and validate;
/// real objects spend far more bytes per element.
const BYTES_PER_ELEMENT: usize = 8;

/// How many more elements a body may decode to (see [`ELEMENT_BASE`]).
pub(super) struct Budget {
    left: std::cell::Cell<usize>,
    limit: usize,
}

impl Budget {
    /// The budget of a body of `len` bytes.
    pub(super) fn for_body(len: usize) -> Self {
        let limit = ELEMENT_BASE + len / BYTES_PER_ELEMENT;
        Budget {
            left: std::cell::Cell::new(limit),
            limit,
        }
    }

    fn take(&self) -> Result<(), WireError> {
        match self.left.get().checked_sub(1) {
            Some(left) => {
                self.left.set(left);
                Ok(())
            }
            None => Err(WireError::TooManyElements { limit: self.limit }),
        }
    }
}

/// Why a body could not be transcoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    /// The bytes are not a valid encoding of the message.
    #[error("malformed protobuf in {message}: {why}")]
    Malformed {
        /// The message being decoded.
        message: String,
        /// What was wrong.
        why: String,
    },
    /// A JSON value does not fit the field's protobuf type.
    #[error("field {field} of {message}: expected {expected}, got {got}")]
    Type {
        /// The message being encoded.
        message: String,
        /// The JSON name of the field.
        field: String,
        /// The type the field needs.
        expected: &'static str,
        /// The JSON value's type.
        got: &'static str,
    },
    /// The table has no such message.
    #[error("no protobuf message {0}")]
    UnknownMessage(String),
    /// Messages nest deeper than `MAX_DEPTH`.
    #[error("the message nests deeper than {MAX_DEPTH} levels")]
    TooDeep,
    /// The body decodes to more elements than its size allows.
    #[error(
        "the body decodes to more than {limit} elements (messages, list elements and map entries)"
    )]
    TooManyElements {
        /// The body's budget.
        limit: usize,
    },
}

fn malformed(message: &str, why: impl std::fmt::Display) -> WireError {
    WireError::Malformed {
        message: message.to_owned(),
        why: why.to_string(),
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

// ------------------------------------------------------------------ decoding

/// A message that only wraps a list of strings (`ExtraValue`, `Verbs`: Go's named `[]string`
/// types, which protobuf cannot nest in a map or name otherwise) is the bare list in JSON. A
/// struct whose one field is a list of messages (`DownwardAPIProjection`'s `items`) is not.
fn is_bare_list(message: &schema::Message) -> bool {
    matches!(message.fields.as_slice(), [f] if f.json == "items" && f.repeated && f.kind == Kind::String)
}

/// Decodes `bytes` as the message `name`; `None` for a value that is absent in JSON (an
/// empty `Time`, an empty `RawExtension`).
#[cfg(test)]
pub(crate) fn decode(name: &str, bytes: &[u8]) -> Result<Option<Value>, WireError> {
    decode_at(name, bytes, 0, &Budget::for_body(bytes.len()))
}

/// [`decode`] at a nesting depth (an object embedded in a `RawExtension`).
pub(super) fn decode_at(
    name: &str,
    mut buf: &[u8],
    depth: usize,
    budget: &Budget,
) -> Result<Option<Value>, WireError> {
    if depth > MAX_DEPTH {
        return Err(WireError::TooDeep);
    }
    match name {
        TIME | MICRO_TIME => return decode_time(name, buf),
        QUANTITY => {
            let fields = scalars(name, buf)?;
            let s = fields.string(1).unwrap_or_default();
            return Ok(Some(Value::String(if s.is_empty() {
                "0".into()
            } else {
                s
            })));
        }
        INT_OR_STRING => {
            let fields = scalars(name, buf)?;
            return Ok(Some(if fields.varint(1).unwrap_or(0) == 1 {
                Value::String(fields.string(3).unwrap_or_default())
            } else {
                Value::from(fields.varint(2).unwrap_or(0) as i32)
            }));
        }
        DURATION => {
            let fields = scalars(name, buf)?;
            return Ok(Some(Value::String(go_duration(
                fields.varint(1).unwrap_or(0) as i64,
            ))));
        }
        RAW_EXTENSION | FIELDS_V1 | APIEXT_JSON => {
            let raw = scalars(name, buf)?.bytes(1).unwrap_or_default();
            return embedded(name, &raw, depth, budget);
        }
        SCHEMA_OR_BOOL | SCHEMA_OR_ARRAY | SCHEMA_OR_STRINGS => {
            return decode_schema_union(name, buf, depth, budget);
        }
        _ => {}
    }
    let message = schema::message(name).ok_or_else(|| WireError::UnknownMessage(name.into()))?;
    budget.take()?;
    let mut out = Map::new();
    let bare_list = is_bare_list(message);
    while buf.has_remaining() {
        let (tag, wire) = decode_key(&mut buf).map_err(|e| malformed(name, e))?;
        let Some(field) = message.by_tag(tag) else {
            skip_field(wire, tag, &mut buf, DecodeContext::default())
                .map_err(|e| malformed(name, e))?;
            continue;
        };
        decode_field(name, field, wire, &mut buf, &mut out, depth, budget)?;
    }
    if bare_list {
        return Ok(Some(
            out.remove("items").unwrap_or(Value::Array(Vec::new())),
        ));
    }
    if name == SCHEMA_PROPS {
        // Go's `JSONSchemaProps` has these as plain `bool`s: its protobuf carries every one
        // on every schema, false or not, and its JSON (`omitempty`) only the true ones.
        for key in SCHEMA_PLAIN_BOOLS {
            if out.get(*key) == Some(&Value::Bool(false)) {
                out.remove(*key);
            }
        }
    }
    Ok(Some(Value::Object(out)))
}

/// The fields of Go's `JSONSchemaProps` that are plain `bool`s with `omitempty`.
const SCHEMA_PLAIN_BOOLS: &[&str] = &[
    "exclusiveMaximum",
    "exclusiveMinimum",
    "uniqueItems",
    "nullable",
    "x-kubernetes-embedded-resource",
    "x-kubernetes-int-or-string",
];

fn decode_field(
    name: &str,
    field: &Field,
    wire: WireType,
    buf: &mut &[u8],
    out: &mut Map<String, Value>,
    depth: usize,
    budget: &Budget,
) -> Result<(), WireError> {
    // Packed repeated scalars (Go writes them unpacked, but both are valid).
    if field.repeated
        && wire == WireType::LengthDelimited
        && matches!(
            field.kind,
            Kind::Int32 | Kind::Int64 | Kind::Bool | Kind::Double
        )
    {
        let mut packed = length_delimited(name, buf)?;
        let list = list_entry(out, field.json);
        while packed.has_remaining() {
            let wire = match field.kind {
                Kind::Double => WireType::SixtyFourBit,
                _ => WireType::Varint,
            };
            budget.take()?;
            list.push(scalar(name, field.kind, wire, &mut packed)?);
        }
        return Ok(());
    }
    let value = match field.kind {
        Kind::Message(m) if field.inline => {
            expect_wire(name, field, wire, WireType::LengthDelimited)?;
            if let Some(Value::Object(fields)) =
                decode_at(m, length_delimited(name, buf)?, depth + 1, budget)?
            {
                out.extend(fields);
            }
            return Ok(());
        }
        Kind::Message(m) => {
            expect_wire(name, field, wire, WireType::LengthDelimited)?;
            decode_at(m, length_delimited(name, buf)?, depth + 1, budget)?
        }
        Kind::Map(value_type) => {
            expect_wire(name, field, wire, WireType::LengthDelimited)?;
            let entry = length_delimited(name, buf)?;
            budget.take()?;
            let (key, value) = map_entry(name, value_type, entry, depth, budget)?;
            let map = out
                .entry(field.json)
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(map) = map {
                map.insert(key, value);
            }
            return Ok(());
        }
        kind => Some(scalar(name, kind, wire, buf)?),
    };
    if field.repeated {
        // A list keeps every element, absent ones as null (a zero Time in a list).
        budget.take()?;
        list_entry(out, field.json).push(value.unwrap_or(Value::Null));
        return Ok(());
    }
    match value {
        // Go writes every non-pointer string; "" and absent are the same to it.
        Some(Value::String(s)) if s.is_empty() && field.kind == Kind::String => {
            out.remove(field.json);
        }
        Some(v) => {
            out.insert(field.json.to_owned(), v);
        }
        None => {
            out.remove(field.json);
        }
    }
    Ok(())
}

fn list_entry<'a>(out: &'a mut Map<String, Value>, key: &str) -> &'a mut Vec<Value> {
    let slot = out.entry(key).or_insert_with(|| Value::Array(Vec::new()));
    if !slot.is_array() {
        *slot = Value::Array(Vec::new());
    }
    match slot {
        Value::Array(list) => list,
        _ => unreachable!("just made an array"),
    }
}

fn expect_wire(name: &str, field: &Field, got: WireType, want: WireType) -> Result<(), WireError> {
    if got == want {
        Ok(())
    } else {
        Err(malformed(
            name,
            format!(
                "field {} (tag {}) has wire type {got:?}, expected {want:?}",
                field.json, field.tag
            ),
        ))
    }
}

fn length_delimited<'a>(name: &str, buf: &mut &'a [u8]) -> Result<&'a [u8], WireError> {
    let len = decode_varint(buf).map_err(|e| malformed(name, e))?;
    let len = usize::try_from(len)
        .ok()
        .filter(|l| *l <= buf.len())
        .ok_or_else(|| malformed(name, "a length runs past the end of the message"))?;
    let (head, tail) = buf.split_at(len);
    *buf = tail;
    Ok(head)
}

fn scalar(name: &str, kind: Kind, wire: WireType, buf: &mut &[u8]) -> Result<Value, WireError> {
    let want = match kind {
        Kind::Double => WireType::SixtyFourBit,
        Kind::String | Kind::Bytes => WireType::LengthDelimited,
        _ => WireType::Varint,
    };
    if wire != want {
        return Err(malformed(
            name,
            format!("a {kind:?} field has wire type {wire:?}"),
        ));
    }
    Ok(match kind {
        Kind::Double => {
            if buf.len() < 8 {
                return Err(malformed(name, "a double runs past the end"));
            }
            let f = buf.get_f64_le();
            // Go's JSON writes a whole float64 as an integer (`1`, not `1.0`).
            if f.fract() == 0.0 && f.abs() < 1e15 {
                Value::from(f as i64)
            } else {
                Number::from_f64(f).map_or(Value::Null, Value::Number)
            }
        }
        Kind::String => Value::String(utf8(name, length_delimited(name, buf)?)?),
        Kind::Bytes => Value::String(STANDARD.encode(length_delimited(name, buf)?)),
        Kind::Bool => Value::Bool(decode_varint(buf).map_err(|e| malformed(name, e))? != 0),
        Kind::Int32 => Value::from(decode_varint(buf).map_err(|e| malformed(name, e))? as i32),
        _ => Value::from(decode_varint(buf).map_err(|e| malformed(name, e))? as i64),
    })
}

fn utf8(name: &str, bytes: &[u8]) -> Result<String, WireError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| malformed(name, "a string is not UTF-8"))
}

fn map_entry(
    name: &str,
    value_type: MapValue,
    mut entry: &[u8],
    depth: usize,
    budget: &Budget,
) -> Result<(String, Value), WireError> {
    let mut key = String::new();
    let mut value = None;
    while entry.has_remaining() {
        let (tag, wire) = decode_key(&mut entry).map_err(|e| malformed(name, e))?;
        match (tag, value_type) {
            (1, _) => {
                key = scalar(name, Kind::String, wire, &mut entry)?
                    .as_str()
                    .unwrap_or("")
                    .to_owned()
            }
            (2, MapValue::String) => value = Some(scalar(name, Kind::String, wire, &mut entry)?),
            (2, MapValue::Bytes) => value = Some(scalar(name, Kind::Bytes, wire, &mut entry)?),
            (2, MapValue::Message(m)) => {
                if wire != WireType::LengthDelimited {
                    return Err(malformed(name, "a map value has the wrong wire type"));
                }
                value = decode_at(m, length_delimited(name, &mut entry)?, depth + 1, budget)?;
            }
            _ => skip_field(wire, tag, &mut entry, DecodeContext::default())
                .map_err(|e| malformed(name, e))?,
        }
    }
    let value = match (value, value_type) {
        (Some(v), _) => v,
        (None, MapValue::String | MapValue::Bytes) => Value::String(String::new()),
        (None, MapValue::Message(m)) => {
            decode_at(m, &[], depth + 1, budget)?.unwrap_or(Value::Null)
        }
    };
    Ok((key, value))
}

/// The scalar fields of a small well-known message, by tag (the last value wins).
#[derive(Default)]
struct Scalars {
    varints: Vec<(u32, u64)>,
    delimited: Vec<(u32, Vec<u8>)>,
}

impl Scalars {
    fn varint(&self, tag: u32) -> Option<u64> {
        self.varints
            .iter()
            .rev()
            .find(|(t, _)| *t == tag)
            .map(|(_, v)| *v)
    }

    fn bytes(&self, tag: u32) -> Option<Vec<u8>> {
        self.delimited
            .iter()
            .rev()
            .find(|(t, _)| *t == tag)
            .map(|(_, v)| v.clone())
    }

    fn string(&self, tag: u32) -> Option<String> {
        self.bytes(tag)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    }
}

fn scalars(name: &str, mut buf: &[u8]) -> Result<Scalars, WireError> {
    let mut out = Scalars::default();
    while buf.has_remaining() {
        let (tag, wire) = decode_key(&mut buf).map_err(|e| malformed(name, e))?;
        match wire {
            WireType::Varint => out.varints.push((
                tag,
                decode_varint(&mut buf).map_err(|e| malformed(name, e))?,
            )),
            WireType::LengthDelimited => out
                .delimited
                .push((tag, length_delimited(name, &mut buf)?.to_vec())),
            _ => skip_field(wire, tag, &mut buf, DecodeContext::default())
                .map_err(|e| malformed(name, e))?,
        }
    }
    Ok(out)
}

/// `Time` keeps whole seconds (Go's unmarshaler drops the nanos), `MicroTime` keeps
/// microseconds; an empty message or Go's zero time is absent.
fn decode_time(name: &str, buf: &[u8]) -> Result<Option<Value>, WireError> {
    if buf.is_empty() {
        return Ok(None);
    }
    let fields = scalars(name, buf)?;
    let seconds = fields.varint(1).unwrap_or(0) as i64;
    let nanos = fields.varint(2).unwrap_or(0) as i32;
    if seconds == GO_ZERO_TIME_SECONDS && nanos == 0 {
        return Ok(None);
    }
    let nanos = if name == TIME { 0 } else { nanos };
    let ts = jiff::Timestamp::new(seconds, nanos).map_err(|e| malformed(name, e))?;
    let text = if name == TIME {
        ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    } else {
        ts.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
    };
    Ok(Some(Value::String(text)))
}

/// The JSON inside a `RawExtension` or `FieldsV1`; a protobuf object (`k8s\0…`) inside a
/// `RawExtension` is transcoded too.
fn embedded(
    name: &str,
    raw: &[u8],
    depth: usize,
    budget: &Budget,
) -> Result<Option<Value>, WireError> {
    if raw.is_empty() {
        return Ok(None);
    }
    if raw.starts_with(super::MAGIC) {
        return super::decode_envelope_at(raw, depth + 1, budget)
            .map(Some)
            .map_err(|e| malformed(name, e));
    }
    serde_json::from_slice(raw)
        .map(Some)
        .map_err(|e| malformed(name, format!("the embedded object is not JSON: {e}")))
}

/// Go's `time.Duration.String()`: `1h2m3.5s`, `1.5ms`, `0s`.
fn go_duration(nanos: i64) -> String {
    if nanos == 0 {
        return "0s".into();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let n = nanos.unsigned_abs();
    let trim = |whole: u64, frac: u64, digits: usize| {
        let frac = format!("{frac:0digits$}");
        let frac = frac.trim_end_matches('0');
        if frac.is_empty() {
            whole.to_string()
        } else {
            format!("{whole}.{frac}")
        }
    };
    if n < 1_000 {
        return format!("{sign}{n}ns");
    }
    if n < 1_000_000 {
        return format!("{sign}{}µs", trim(n / 1_000, n % 1_000, 3));
    }
    if n < 1_000_000_000 {
        return format!("{sign}{}ms", trim(n / 1_000_000, n % 1_000_000, 6));
    }
    let total_seconds = n / 1_000_000_000;
    let (h, m, s) = (
        total_seconds / 3600,
        (total_seconds / 60) % 60,
        total_seconds % 60,
    );
    let seconds = trim(s, n % 1_000_000_000, 9);
    match (h, m) {
        (0, 0) => format!("{sign}{seconds}s"),
        (0, m) => format!("{sign}{m}m{seconds}s"),
        (h, m) => format!("{sign}{h}h{m}m{seconds}s"),
    }
}

/// Parses Go's duration syntax (`1h2m3.5s`, `300ms`) into nanoseconds.
fn parse_go_duration(text: &str) -> Option<i64> {
    let (negative, mut rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    if rest == "0" {
        return Some(0);
    }
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..number_len].parse().ok()?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += number * scale;
    }
    let total = total.round() as i64;
    Some(if negative { -total } else { total })
}

// ------------------------------------------------------------------ encoding

/// Encodes `value` as the message `name`, appending to `out`.
pub(crate) fn encode(name: &str, value: &Value, out: &mut Vec<u8>) -> Result<(), WireError> {
    encode_at(name, value, out, 0)
}

fn type_error(message: &str, field: &str, expected: &'static str, got: &Value) -> WireError {
    WireError::Type {
        message: message.to_owned(),
        field: field.to_owned(),
        expected,
        got: json_type(got),
    }
}

fn encode_at(name: &str, value: &Value, out: &mut Vec<u8>, depth: usize) -> Result<(), WireError> {
    if depth > MAX_DEPTH {
        return Err(WireError::TooDeep);
    }
    match name {
        TIME | MICRO_TIME => return encode_time(name, value, out),
        QUANTITY => {
            let text = match value {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                other => return Err(type_error(name, "", "a quantity", other)),
            };
            put_bytes(1, text.as_bytes(), out);
            return Ok(());
        }
        INT_OR_STRING => {
            match value {
                Value::String(s) => {
                    put_varint(1, 1, out);
                    put_varint(2, 0, out);
                    put_bytes(3, s.as_bytes(), out);
                }
                Value::Number(n) => {
                    let i = n
                        .as_i64()
                        .ok_or_else(|| type_error(name, "", "an integer", value))?;
                    put_varint(1, 0, out);
                    put_varint(2, i as i32 as i64 as u64, out);
                    put_bytes(3, b"", out);
                }
                other => return Err(type_error(name, "", "an integer or a string", other)),
            }
            return Ok(());
        }
        DURATION => {
            let nanos = value
                .as_str()
                .and_then(parse_go_duration)
                .ok_or_else(|| type_error(name, "", "a duration", value))?;
            put_varint(1, nanos as u64, out);
            return Ok(());
        }
        RAW_EXTENSION | FIELDS_V1 | APIEXT_JSON => {
            let raw = serde_json::to_vec(value).map_err(|e| malformed(name, e))?;
            put_bytes(1, &raw, out);
            return Ok(());
        }
        SCHEMA_OR_BOOL | SCHEMA_OR_ARRAY | SCHEMA_OR_STRINGS => {
            return encode_schema_union(name, value, out, depth);
        }
        _ => {}
    }
    let message = schema::message(name).ok_or_else(|| WireError::UnknownMessage(name.into()))?;
    if is_bare_list(message) && value.is_array() {
        let wrapped = serde_json::json!({ "items": value });
        return encode_at(name, &wrapped, out, depth);
    }
    let Value::Object(object) = value else {
        return Err(type_error(name, "", "an object", value));
    };
    for field in &message.fields {
        if let (true, Kind::Message(m)) = (field.inline, field.kind) {
            // The embedded message reads its fields from this same object.
            let mut inner = Vec::new();
            encode_at(m, value, &mut inner, depth + 1)?;
            put_bytes(field.tag, &inner, out);
            continue;
        }
        let Some(v) = object.get(field.json) else {
            continue;
        };
        if v.is_null() {
            continue;
        }
        if field.repeated {
            let Value::Array(items) = v else {
                return Err(type_error(name, field.json, "an array", v));
            };
            for item in items {
                encode_field(name, field, item, out, depth)?;
            }
        } else {
            encode_field(name, field, v, out, depth)?;
        }
    }
    Ok(())
}

fn encode_field(
    name: &str,
    field: &Field,
    value: &Value,
    out: &mut Vec<u8>,
    depth: usize,
) -> Result<(), WireError> {
    let tag = field.tag;
    match field.kind {
        Kind::String => {
            let s = value
                .as_str()
                .ok_or_else(|| type_error(name, field.json, "a string", value))?;
            put_bytes(tag, s.as_bytes(), out);
        }
        Kind::Bytes => {
            let s = value
                .as_str()
                .ok_or_else(|| type_error(name, field.json, "a base64 string", value))?;
            let bytes = STANDARD
                .decode(s)
                .map_err(|_| type_error(name, field.json, "a base64 string", value))?;
            put_bytes(tag, &bytes, out);
        }
        Kind::Bool => {
            let b = value
                .as_bool()
                .ok_or_else(|| type_error(name, field.json, "a boolean", value))?;
            put_varint(tag, u64::from(b), out);
        }
        Kind::Int32 | Kind::Int64 => {
            let i =
                integer(value).ok_or_else(|| type_error(name, field.json, "an integer", value))?;
            let i = if field.kind == Kind::Int32 {
                i64::from(i as i32)
            } else {
                i
            };
            put_varint(tag, i as u64, out);
        }
        Kind::Double => {
            let f = value
                .as_f64()
                .ok_or_else(|| type_error(name, field.json, "a number", value))?;
            encode_key(tag, WireType::SixtyFourBit, out);
            out.put_f64_le(f);
        }
        Kind::Message(m) => {
            if matches!(m, TIME | MICRO_TIME) && value.is_null() {
                return Ok(());
            }
            let mut inner = Vec::new();
            encode_at(m, value, &mut inner, depth + 1)?;
            put_bytes(tag, &inner, out);
        }
        Kind::Map(value_type) => {
            let Value::Object(map) = value else {
                return Err(type_error(name, field.json, "an object", value));
            };
            // Entries in the JSON object's order (Go sorts keys; readers do not care).
            for (key, v) in map {
                let mut entry = Vec::new();
                put_bytes(1, key.as_bytes(), &mut entry);
                // The value is field 2 of the entry, encoded as a field of its type.
                let value_field = Field {
                    tag: 2,
                    json: field.json,
                    kind: match value_type {
                        MapValue::String => Kind::String,
                        MapValue::Bytes => Kind::Bytes,
                        MapValue::Message(m) => Kind::Message(m),
                    },
                    repeated: false,
                    inline: false,
                };
                encode_field(name, &value_field, v, &mut entry, depth)?;
                put_bytes(tag, &entry, out);
            }
        }
    }
    Ok(())
}

/// One of apiextensions' schema unions (`JSONSchemaPropsOrBool`, `…OrArray`,
/// `…OrStringArray`) as its JSON form, as their Go `MarshalJSON` writes them: the schema
/// when it is set (`…OrBool`) or when the list is empty (the other two), else the boolean
/// or the list.
fn decode_schema_union(
    name: &str,
    mut buf: &[u8],
    depth: usize,
    budget: &Budget,
) -> Result<Option<Value>, WireError> {
    budget.take()?;
    let mut allows = false;
    let mut schema = None;
    let mut list = Vec::new();
    while buf.has_remaining() {
        let (tag, wire) = decode_key(&mut buf).map_err(|e| malformed(name, e))?;
        match (name, tag, wire) {
            (SCHEMA_OR_BOOL, 1, WireType::Varint) => {
                allows = scalar(name, Kind::Bool, wire, &mut buf)? == Value::Bool(true);
            }
            (SCHEMA_OR_BOOL, 2, WireType::LengthDelimited)
            | (SCHEMA_OR_ARRAY | SCHEMA_OR_STRINGS, 1, WireType::LengthDelimited) => {
                schema = decode_at(
                    SCHEMA_PROPS,
                    length_delimited(name, &mut buf)?,
                    depth + 1,
                    budget,
                )?;
            }
            (SCHEMA_OR_ARRAY, 2, WireType::LengthDelimited) => {
                budget.take()?;
                let item = decode_at(
                    SCHEMA_PROPS,
                    length_delimited(name, &mut buf)?,
                    depth + 1,
                    budget,
                )?;
                list.push(item.unwrap_or_else(|| Value::Object(Map::new())));
            }
            (SCHEMA_OR_STRINGS, 2, WireType::LengthDelimited) => {
                budget.take()?;
                list.push(scalar(name, Kind::String, wire, &mut buf)?);
            }
            _ => skip_field(wire, tag, &mut buf, DecodeContext::default())
                .map_err(|e| malformed(name, e))?,
        }
    }
    Ok(match (name, schema) {
        (SCHEMA_OR_BOOL, Some(schema)) => Some(schema),
        (SCHEMA_OR_BOOL, None) => Some(Value::Bool(allows)),
        (_, _) if !list.is_empty() => Some(Value::Array(list)),
        (_, schema) => schema,
    })
}

/// [`decode_schema_union`]'s inverse, as the Go types' `UnmarshalJSON` reads the JSON: a
/// boolean is `allows` (a schema object means `allows: true` with the schema), a list is the
/// list, an object the schema.
fn encode_schema_union(
    name: &str,
    value: &Value,
    out: &mut Vec<u8>,
    depth: usize,
) -> Result<(), WireError> {
    let put_schema = |tag: u32, schema: &Value, out: &mut Vec<u8>| {
        let mut inner = Vec::new();
        encode_at(SCHEMA_PROPS, schema, &mut inner, depth + 1)?;
        put_bytes(tag, &inner, out);
        Ok::<(), WireError>(())
    };
    match (name, value) {
        (SCHEMA_OR_BOOL, Value::Bool(b)) => put_varint(1, u64::from(*b), out),
        (SCHEMA_OR_BOOL, Value::Object(_)) => {
            put_varint(1, 1, out);
            put_schema(2, value, out)?;
        }
        (SCHEMA_OR_ARRAY | SCHEMA_OR_STRINGS, Value::Object(_)) => put_schema(1, value, out)?,
        (SCHEMA_OR_ARRAY, Value::Array(items)) => {
            for item in items {
                put_schema(2, item, out)?;
            }
        }
        (SCHEMA_OR_STRINGS, Value::Array(items)) => {
            for item in items {
                let s = item
                    .as_str()
                    .ok_or_else(|| type_error(name, "", "a string", item))?;
                put_bytes(2, s.as_bytes(), out);
            }
        }
        (SCHEMA_OR_BOOL, other) => {
            return Err(type_error(name, "", "a boolean or a schema", other));
        }
        (SCHEMA_OR_ARRAY, other) => {
            return Err(type_error(name, "", "a schema or a list of schemas", other));
        }
        (_, other) => return Err(type_error(name, "", "a schema or a list of strings", other)),
    }
    Ok(())
}

/// An integer JSON value (a float with no fraction counts, as Go's JSON decoder takes it).
fn integer(value: &Value) -> Option<i64> {
    value.as_i64().or_else(|| {
        value
            .as_f64()
            .filter(|f| f.fract() == 0.0 && f.abs() < 9.2e18)
            .map(|f| f as i64)
    })
}

fn put_varint(tag: u32, value: u64, out: &mut Vec<u8>) {
    encode_key(tag, WireType::Varint, out);
    encode_varint(value, out);
}

fn put_bytes(tag: u32, bytes: &[u8], out: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

fn encode_time(name: &str, value: &Value, out: &mut Vec<u8>) -> Result<(), WireError> {
    let text = value
        .as_str()
        .ok_or_else(|| type_error(name, "", "an RFC 3339 time", value))?;
    let ts: jiff::Timestamp = text
        .parse()
        .map_err(|_| type_error(name, "", "an RFC 3339 time", value))?;
    put_varint(1, ts.as_second() as u64, out);
    let nanos = if name == TIME {
        0
    } else {
        ts.subsec_nanosecond() / 1_000 * 1_000
    };
    put_varint(2, nanos as i64 as u64, out);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_print_and_parse_as_go_does() {
        for (nanos, text) in [
            (0, "0s"),
            (1_500_000, "1.5ms"),
            (90_000_000_000, "1m30s"),
            (3_723_500_000_000, "1h2m3.5s"),
            (-2_000_000_000, "-2s"),
            (750, "750ns"),
        ] {
            assert_eq!(go_duration(nanos), text);
            assert_eq!(parse_go_duration(text), Some(nanos), "{text}");
        }
        assert_eq!(parse_go_duration("5x"), None);
    }

    #[test]
    fn times_drop_nanos_micro_times_keep_microseconds_and_go_zero_is_absent() {
        let mut out = Vec::new();
        encode(
            MICRO_TIME,
            &Value::from("2024-05-01T10:00:00.123456Z"),
            &mut out,
        )
        .unwrap();
        assert_eq!(
            decode(MICRO_TIME, &out).unwrap(),
            Some(Value::from("2024-05-01T10:00:00.123456Z"))
        );
        let mut out = Vec::new();
        encode(TIME, &Value::from("2024-05-01T10:00:00Z"), &mut out).unwrap();
        assert_eq!(
            decode(TIME, &out).unwrap(),
            Some(Value::from("2024-05-01T10:00:00Z"))
        );
        assert_eq!(decode(TIME, &[]).unwrap(), None);
        let mut zero = Vec::new();
        put_varint(1, GO_ZERO_TIME_SECONDS as u64, &mut zero);
        assert_eq!(decode(TIME, &zero).unwrap(), None);
        assert!(matches!(
            encode(TIME, &Value::from("yesterday"), &mut Vec::new()),
            Err(WireError::Type { .. })
        ));
    }

    #[test]
    fn int_or_string_and_quantity() {
        for v in [Value::from(8080), Value::from("http")] {
            let mut out = Vec::new();
            encode(INT_OR_STRING, &v, &mut out).unwrap();
            assert_eq!(decode(INT_OR_STRING, &out).unwrap(), Some(v));
        }
        let mut out = Vec::new();
        encode(QUANTITY, &Value::from("100m"), &mut out).unwrap();
        assert_eq!(decode(QUANTITY, &out).unwrap(), Some(Value::from("100m")));
    }

    #[test]
    fn truncated_and_mistyped_input_is_an_error_not_a_panic() {
        let mut out = Vec::new();
        let cm = serde_json::json!({"metadata": {"name": "a"}, "data": {"k": "v"}});
        encode("api.core.v1.ConfigMap", &cm, &mut out).unwrap();
        for cut in 1..out.len() {
            // Any prefix either decodes (it ended on a field boundary) or is an error.
            let _ = decode("api.core.v1.ConfigMap", &out[..cut]);
        }
        assert!(decode("api.core.v1.ConfigMap", &out[..out.len() - 1]).is_err());
        let bad = serde_json::json!({"metadata": {"name": 5}});
        assert!(matches!(
            encode("api.core.v1.ConfigMap", &bad, &mut Vec::new()),
            Err(WireError::Type { field, .. }) if field == "name"
        ));
    }

    /// A body of many empty repeated messages (2 bytes each) is refused by its element
    /// budget instead of becoming hundreds of thousands of objects; a real Pod with many
    /// containers is within it.
    #[test]
    fn repeated_element_bombs_are_refused_and_real_objects_are_not() {
        let mut spec = Vec::new();
        for _ in 0..300_000 {
            put_bytes(2, &[], &mut spec); // an empty Container
        }
        let mut pod = Vec::new();
        put_bytes(2, &spec, &mut pod);
        assert!(pod.len() < 700_000);
        assert!(matches!(
            decode("api.core.v1.Pod", &pod),
            Err(WireError::TooManyElements { .. })
        ));
        let containers: Vec<Value> = (0..1000)
            .map(|i| {
                serde_json::json!({"name": format!("c{i}"), "image": "busybox",
                                   "args": ["-v", "x"], "env": [{"name": "A", "value": "1"}]})
            })
            .collect();
        let pod = serde_json::json!({"metadata": {"name": "p", "labels": {"a": "b"}},
                                     "spec": {"containers": containers}});
        let mut out = Vec::new();
        encode("api.core.v1.Pod", &pod, &mut out).unwrap();
        let decoded = decode("api.core.v1.Pod", &out).unwrap().unwrap();
        assert_eq!(
            decoded["spec"]["containers"].as_array().unwrap().len(),
            1000
        );
    }
}
