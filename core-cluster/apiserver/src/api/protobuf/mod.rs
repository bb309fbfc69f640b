//! `application/vnd.kubernetes.protobuf`: kube-apiserver's protobuf encoding, as a codec
//! at the edge of the server.
//!
//! The server works on `serde_json::Value`s throughout; this module only translates
//! bodies. A request whose `Content-Type` is protobuf (create, update, the reviews,
//! TokenRequest, DeleteOptions; PATCH stays JSON) has its body decoded to JSON before any
//! handler sees it; a client whose `Accept` puts protobuf first gets its JSON answer
//! encoded: objects, lists and `Status` errors as one envelope, watch events as
//! length-prefixed frames.
//!
//! The envelope (upstream's `protobuf.Serializer`): the 4 bytes `k8s\0`, then a
//! `runtime.Unknown` whose `typeMeta` names the apiVersion and kind and whose `raw` is the
//! object's message (the object's own message carries no apiVersion or kind). A watch
//! stream (upstream's `LengthDelimitedFramer` with the raw serializer) is a sequence of
//! frames, each a 4-byte big-endian length and a bare `meta.v1.WatchEvent` whose
//! `object.raw` is the enveloped object.
//!
//! Handlers answer through `json_response`, which encodes the value straight to protobuf
//! when the request asked for it (`encode_answer`); other JSON answers (errors, watch
//! lines) are re-read and encoded by the middleware.
//!
//! The messages come from kube-rs' `k8s-pb`: the envelope and watch event are its prost
//! structs; objects go through one generic transcoder (`wire`) driven by a table
//! generated from k8s-pb (`schema`), so no kind has code of its own.

mod layer;
mod schema;
mod wire;

use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use prost::Message as _;
use serde_json::Value;

pub(crate) use layer::{Streamed, codec, decode, encode_answer, wanted};
pub use wire::WireError;

/// The media type.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";
/// The media type of a watch stream.
pub const WATCH_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";
/// The first bytes of every protobuf-encoded object.
pub const MAGIC: &[u8; 4] = b"k8s\0";

/// Why a protobuf body could not be read or an object could not be written.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtobufError {
    /// The body does not start with `k8s\0`.
    #[error(
        "the body is not a Kubernetes protobuf object: it does not start with the k8s\\0 prefix"
    )]
    NoMagic,
    /// The envelope is not a `runtime.Unknown`.
    #[error("the protobuf envelope could not be decoded: {0}")]
    Envelope(String),
    /// The envelope wraps an encoding other than plain protobuf.
    #[error("unsupported content encoding {0:?} in the protobuf envelope")]
    ContentEncoding(String),
    /// The kind has no protobuf message (upstream: no protobuf for it).
    #[error("{api_version}, Kind={kind} has no protobuf encoding")]
    NoMessage {
        /// The object's apiVersion.
        api_version: String,
        /// The object's kind.
        kind: String,
    },
    /// The object's bytes or JSON do not fit its message.
    #[error(transparent)]
    Wire(#[from] WireError),
}

/// The k8s-pb package of an API group's messages: `api.<first label of the group, or
/// core>`, except the groups whose types live outside `k8s.io/api` (apiextensions-apiserver's
/// CustomResourceDefinitions, kube-aggregator's APIServices, k8s.io/metrics).
pub fn package_of(group: &str) -> String {
    match group {
        "apiextensions.k8s.io" => "apiextensions_apiserver.pkg.apis.apiextensions".to_owned(),
        "apiregistration.k8s.io" => "kube_aggregator.pkg.apis.apiregistration".to_owned(),
        "metrics.k8s.io" => "metrics.pkg.apis.metrics".to_owned(),
        "" => "api.core".to_owned(),
        other => format!("api.{}", other.split('.').next().unwrap_or(other)),
    }
}

/// The k8s-pb message of an apiVersion and kind: `<package of its group>.<version>.<Kind>`
/// ([`package_of`]), or metav1's (`Status`, `DeleteOptions`, `APIResourceList`…, which every
/// group version carries). `None` if the table has neither.
pub fn message_for(api_version: &str, kind: &str) -> Option<String> {
    if kind.is_empty() {
        return None;
    }
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    [
        format!("{}.{version}.{kind}", package_of(group)),
        format!("apimachinery.pkg.apis.meta.v1.{kind}"),
    ]
    .into_iter()
    .find(|name| schema::message(name).is_some())
}

/// Whether objects of this apiVersion and kind can be encoded.
pub fn encodable(api_version: &str, kind: &str) -> bool {
    message_for(api_version, kind).is_some()
}

/// Decodes an enveloped object (`k8s\0` + `runtime.Unknown`) to its JSON form, with the
/// envelope's apiVersion and kind.
pub fn decode_object(bytes: &[u8]) -> Result<Value, ProtobufError> {
    decode_envelope_at(bytes, 0, &wire::Budget::for_body(bytes.len()))
}

fn decode_envelope_at(
    bytes: &[u8],
    depth: usize,
    budget: &wire::Budget,
) -> Result<Value, ProtobufError> {
    let body = bytes.strip_prefix(MAGIC).ok_or(ProtobufError::NoMagic)?;
    let unknown = Unknown::decode(body).map_err(|e| ProtobufError::Envelope(e.to_string()))?;
    let encoding = unknown.content_encoding.unwrap_or_default();
    if !encoding.is_empty() {
        return Err(ProtobufError::ContentEncoding(encoding));
    }
    let type_meta = unknown.type_meta.unwrap_or_default();
    let api_version = type_meta.api_version.unwrap_or_default();
    let kind = type_meta.kind.unwrap_or_default();
    let name = message_for(&api_version, &kind).ok_or_else(|| ProtobufError::NoMessage {
        api_version: api_version.clone(),
        kind: kind.clone(),
    })?;
    let raw = unknown.raw.unwrap_or_default();
    let decoded = wire::decode_at(&name, &raw, depth, budget)?;
    let mut object = serde_json::Map::new();
    object.insert("apiVersion".into(), Value::String(api_version));
    object.insert("kind".into(), Value::String(kind));
    if let Some(Value::Object(fields)) = decoded {
        object.extend(fields);
    }
    Ok(Value::Object(object))
}

/// Encodes a JSON object (with its apiVersion and kind) as an enveloped protobuf object.
pub fn encode_object(object: &Value) -> Result<Vec<u8>, ProtobufError> {
    let api_version = object["apiVersion"].as_str().unwrap_or("");
    let kind = object["kind"].as_str().unwrap_or("");
    let name = message_for(api_version, kind).ok_or_else(|| ProtobufError::NoMessage {
        api_version: api_version.to_owned(),
        kind: kind.to_owned(),
    })?;
    let mut raw = Vec::new();
    wire::encode(&name, object, &mut raw)?;
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.to_owned()),
            kind: Some(kind.to_owned()),
        }),
        raw: Some(raw),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    let mut out = Vec::with_capacity(MAGIC.len() + unknown.encoded_len());
    out.extend_from_slice(MAGIC);
    unknown
        .encode(&mut out)
        .map_err(|e| ProtobufError::Envelope(e.to_string()))?;
    Ok(out)
}

/// One watch frame: the 4-byte big-endian length, then a `meta.v1.WatchEvent` whose
/// `object.raw` is the enveloped object.
pub fn encode_watch_frame(event_type: &str, object: &Value) -> Result<Vec<u8>, ProtobufError> {
    let raw = encode_object(object)?;
    let mut out = watch_frame_head(event_type, raw.len());
    out.extend_from_slice(&raw);
    Ok(out)
}

/// Everything of a watch frame before its enveloped object of `raw_len` bytes: the
/// frame's length and the `WatchEvent` up to `object.raw`'s bytes (field 1 `type`, field
/// 2 `object`, its field 1 `raw`), as prost writes them. A frame is this head followed by
/// the object, so the object's bytes can be shared by every watcher that sends it.
pub(crate) fn watch_frame_head(event_type: &str, raw_len: usize) -> Vec<u8> {
    use prost::encoding::{encode_varint, encoded_len_varint};
    let extension_len = 1 + encoded_len_varint(raw_len as u64) + raw_len;
    let event_len = 1
        + encoded_len_varint(event_type.len() as u64)
        + event_type.len()
        + 1
        + encoded_len_varint(extension_len as u64)
        + extension_len;
    let mut head = Vec::with_capacity(4 + event_len - raw_len);
    head.extend_from_slice(&u32::try_from(event_len).unwrap_or(u32::MAX).to_be_bytes());
    head.push(0x0a);
    encode_varint(event_type.len() as u64, &mut head);
    head.extend_from_slice(event_type.as_bytes());
    head.push(0x12);
    encode_varint(extension_len as u64, &mut head);
    head.push(0x0a);
    encode_varint(raw_len as u64, &mut head);
    head
}

#[cfg(test)]
mod tests;
