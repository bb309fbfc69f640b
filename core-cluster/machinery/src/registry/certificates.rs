//! `certificates.k8s.io/v1` CertificateSigningRequests: upstream's
//! `pkg/apis/certificates/validation` (`ValidateCertificateSigningRequestCreate`, the
//! `…Update`, `…StatusUpdate` and `…ApprovalUpdate` rules), `pkg/registry/certificates/
//! certificates/strategy.go` (the status starts empty; spec and status are kept by updates
//! of the object, as the API server's update path does) and kubectl's columns.
//!
//! The request's PEM is checked here as far as PEM goes (one `CERTIFICATE REQUEST` block);
//! its DER and signature are checked by the API server, which has the X.509 parser.

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use serde_json::{Value, json};

use super::{
    Column, NameRule, ResourceDef,
    events::identity,
    meta::{is_zero_time, validate_name},
    table::{AGE, NAME, human_duration},
    typed,
};
use crate::registry::FieldError;

/// The API group.
pub const CERTIFICATES_GROUP: &str = "certificates.k8s.io";
/// The signer of kubelets' serving certificates.
pub const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// The signer of kubelets' client certificates.
pub const KUBE_APISERVER_CLIENT_KUBELET_SIGNER: &str =
    "kubernetes.io/kube-apiserver-client-kubelet";
/// The condition types approvers and signers set.
pub const APPROVED: &str = "Approved";
/// The condition an approver sets to refuse a request.
pub const DENIED: &str = "Denied";
/// The condition a signer sets when it will not sign.
pub const FAILED: &str = "Failed";
/// The shortest `spec.expirationSeconds` (ten minutes).
pub const MIN_EXPIRATION_SECONDS: i64 = 600;

/// `certificates.KeyUsage` values (`pkg/apis/certificates/types.go`).
pub const KEY_USAGES: &[&str] = &[
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
];

/// The PEM blocks of `text`: (type, base64 body), or why it is not PEM (`encoding/pem`
/// as `pem.Decode` reads it, each block in turn).
pub fn pem_blocks(text: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    use base64::Engine as _;
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("-----BEGIN ") {
        let after = &rest[start + "-----BEGIN ".len()..];
        let Some(end_type) = after.find("-----") else {
            return Err("malformed PEM header".into());
        };
        let label = &after[..end_type];
        let body_start = &after[end_type + 5..];
        let end_marker = format!("-----END {label}-----");
        let Some(end) = body_start.find(&end_marker) else {
            return Err(format!("PEM block {label:?} has no END line"));
        };
        let body: String = body_start[..end]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(body.as_bytes())
            .map_err(|e| format!("PEM block {label:?}: {e}"))?;
        blocks.push((label.to_owned(), der));
        rest = &body_start[end + end_marker.len()..];
    }
    if !rest.trim().is_empty() && !blocks.is_empty() {
        return Err("extra data after the last PEM block".into());
    }
    Ok(blocks)
}

/// The bytes of a `[]byte` field (base64 in JSON).
pub fn bytes_field(v: &Value) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str()?.as_bytes())
        .ok()
}

/// The DER of the request's one `CERTIFICATE REQUEST` PEM block (`parseCSR`'s PEM step).
pub fn request_der(request: &[u8]) -> Result<Vec<u8>, String> {
    let text = std::str::from_utf8(request)
        .map_err(|_| "PEM block type must be CERTIFICATE REQUEST".to_owned())?;
    let blocks = pem_blocks(text).map_err(|_| "PEM block type must be CERTIFICATE REQUEST")?;
    match blocks.into_iter().next() {
        Some((label, der)) if label == "CERTIFICATE REQUEST" => Ok(der),
        _ => Err("PEM block type must be CERTIFICATE REQUEST".into()),
    }
}

/// The conditions of `csr` of type `type_`.
pub fn conditions_of<'a>(csr: &'a Value, type_: &str) -> Vec<&'a Value> {
    csr["status"]["conditions"]
        .as_array()
        .map(|c| c.iter().filter(|c| c["type"] == type_).collect())
        .unwrap_or_default()
}

/// Whether `csr` carries a condition of type `type_` with status True.
pub fn has_condition(csr: &Value, type_: &str) -> bool {
    conditions_of(csr, type_)
        .iter()
        .any(|c| c["status"].as_str().is_none_or(|s| s == "True"))
}

/// `ValidateSignerName`: `<domain>/<path>`.
fn validate_signer_name(v: &Value, errors: &mut Vec<FieldError>) {
    let field = "spec.signerName";
    let Some(name) = v.as_str().filter(|s| !s.is_empty()) else {
        errors.push(FieldError::required(field, ""));
        return;
    };
    let form = "must be a fully qualified domain and path of the form 'example.com/signer-name'";
    match name.split_once('/') {
        Some((domain, path)) if !path.is_empty() => {
            if !validate_name(domain, NameRule::Subdomain).is_empty() || !domain.contains('.') {
                errors.push(FieldError::invalid(field, v, form));
            }
            if path.split('/').any(str::is_empty) || path.len() > 253 {
                errors.push(FieldError::invalid(field, v, form));
            }
        }
        _ => errors.push(FieldError::invalid(field, v, form)),
    }
}

/// `validateConditions`: types set and not repeated, Approved and Denied only True and
/// mutually exclusive.
fn validate_conditions(new: &Value, errors: &mut Vec<FieldError>) {
    let Some(conditions) = new["status"]["conditions"].as_array() else {
        return;
    };
    let (mut approved, mut denied) = (false, false);
    let mut seen: Vec<&str> = Vec::new();
    for (i, c) in conditions.iter().enumerate() {
        let path = format!("status.conditions[{i}]");
        let type_ = c["type"].as_str().unwrap_or("");
        if type_.is_empty() {
            errors.push(FieldError::required(format!("{path}.type"), ""));
        }
        let status = c["status"].as_str().unwrap_or("");
        let allowed: &[&str] = if type_ == APPROVED || type_ == DENIED {
            &["True"]
        } else {
            &["False", "True", "Unknown"]
        };
        if status.is_empty() {
            errors.push(FieldError::required(format!("{path}.status"), ""));
        } else if !allowed.contains(&status) {
            errors.push(FieldError::not_supported(
                format!("{path}.status"),
                &c["status"],
                &["True"],
            ));
        }
        match type_ {
            APPROVED => {
                approved = true;
                if denied {
                    errors.push(FieldError::invalid(
                        format!("{path}.type"),
                        &c["type"],
                        "Approved and Denied conditions are mutually exclusive",
                    ));
                }
            }
            DENIED => {
                denied = true;
                if approved {
                    errors.push(FieldError::invalid(
                        format!("{path}.type"),
                        &c["type"],
                        "Approved and Denied conditions are mutually exclusive",
                    ));
                }
            }
            _ => {}
        }
        if seen.contains(&type_) {
            errors.push(FieldError::duplicate(format!("{path}.type"), &c["type"]));
        }
        seen.push(type_);
    }
}

/// `validateCertificate`: PEM `CERTIFICATE` blocks only, at least one.
fn validate_certificate(new: &Value, errors: &mut Vec<FieldError>) {
    let field = "status.certificate";
    let v = &new["status"]["certificate"];
    if v.is_null() || v.as_str() == Some("") {
        return;
    }
    let Some(bytes) = bytes_field(v) else {
        errors.push(FieldError::invalid(
            field,
            &json!("<certificate data>"),
            "not base64",
        ));
        return;
    };
    let text = String::from_utf8_lossy(&bytes);
    match pem_blocks(&text) {
        Err(e) => errors.push(FieldError::invalid(field, &json!("<certificate data>"), e)),
        Ok(blocks) if blocks.is_empty() => errors.push(FieldError::invalid(
            field,
            &json!("<certificate data>"),
            "must contain at least one CERTIFICATE PEM block",
        )),
        Ok(blocks) => {
            if let Some((label, _)) = blocks.iter().find(|(l, _)| l != "CERTIFICATE") {
                errors.push(FieldError::invalid(
                    field,
                    &json!("<certificate data>"),
                    format!("only CERTIFICATE PEM blocks are allowed, found {label:?}"),
                ));
            }
        }
    }
}

/// `ValidateCertificateSigningRequestCreate` and the update rules.
fn validate_csr(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let spec = &new["spec"];
    match spec["request"].as_str().filter(|s| !s.is_empty()) {
        None => errors.push(FieldError::required("spec.request", "")),
        Some(_) => match bytes_field(&spec["request"]) {
            None => errors.push(FieldError::invalid(
                "spec.request",
                &spec["request"],
                "not base64",
            )),
            Some(pem) => {
                if let Err(e) = request_der(&pem) {
                    errors.push(FieldError::invalid(
                        "spec.request",
                        &json!("<request data>"),
                        e,
                    ));
                }
            }
        },
    }
    validate_signer_name(&spec["signerName"], &mut errors);
    if let Some(seconds) = spec["expirationSeconds"].as_i64()
        && seconds < MIN_EXPIRATION_SECONDS
    {
        errors.push(FieldError::invalid(
            "spec.expirationSeconds",
            &json!(seconds),
            "may not specify a duration less than 600 seconds (10 minutes)",
        ));
    }
    match spec["usages"].as_array().filter(|u| !u.is_empty()) {
        None => errors.push(FieldError::required(
            "spec.usages",
            "usages must be provided",
        )),
        Some(usages) => {
            let mut seen = Vec::new();
            for (i, u) in usages.iter().enumerate() {
                let field = format!("spec.usages[{i}]");
                if !u.as_str().is_some_and(|s| KEY_USAGES.contains(&s)) {
                    errors.push(FieldError::not_supported(&field, u, KEY_USAGES));
                } else if seen.contains(&u) {
                    errors.push(FieldError::duplicate(&field, u));
                }
                seen.push(u);
            }
        }
    }
    validate_conditions(new, &mut errors);
    validate_certificate(new, &mut errors);
    if let Some(old) = old {
        // `ValidateCertificateSigningRequestApprovalUpdate`/`…StatusUpdate`: an
        // Approved or Denied condition is never removed, and an issued certificate never
        // changes.
        for t in [APPROVED, DENIED] {
            if conditions_of(new, t).len() < conditions_of(old, t).len() {
                errors.push(FieldError::forbidden(
                    "status.conditions",
                    &format!("updates may not remove a condition of type {t:?}"),
                ));
            }
        }
        let old_cert = &old["status"]["certificate"];
        if old_cert.as_str().is_some_and(|c| !c.is_empty())
            && new["status"]["certificate"] != *old_cert
        {
            errors.push(FieldError::forbidden(
                "status.certificate",
                "updates may not modify existing certificate content",
            ));
        }
    }
    errors
}

/// kubectl's `Condition` column (`printers.go printCertificateSigningRequest`'s
/// `extractCSRStatus`): Approved or Denied, then Failed, then Issued; Pending without any.
fn condition_cell(o: &Value) -> Value {
    let mut parts = Vec::new();
    if has_condition(o, DENIED) {
        parts.push(DENIED);
    } else if has_condition(o, APPROVED) {
        parts.push(APPROVED);
    } else {
        parts.push("Pending");
    }
    if has_condition(o, FAILED) {
        parts.push(FAILED);
    }
    if o["status"]["certificate"]
        .as_str()
        .is_some_and(|c| !c.is_empty())
    {
        parts.push("Issued");
    }
    json!(parts.join(","))
}

/// certificates.k8s.io/v1 certificatesigningrequests.
pub static CERTIFICATE_SIGNING_REQUESTS: ResourceDef = ResourceDef {
    group: CERTIFICATES_GROUP,
    version: "v1",
    kind: "CertificateSigningRequest",
    plural: "certificatesigningrequests",
    singular: "certificatesigningrequest",
    short_names: &["csr"],
    categories: &[],
    namespaced: false,
    status: true,
    generation: false,
    extra_subresources: &["approval"],
    storage: "certificates.k8s.io/certificatesigningrequests",
    name_rule: NameRule::PathSegment,
    typed: typed::<CertificateSigningRequest>,
    columns: &[
        NAME,
        AGE,
        Column {
            name: "SignerName",
            type_: "string",
            format: "",
            description: "Requested signer for the request.",
            priority: 0,
            cell: |o, _| json!(o["spec"]["signerName"].as_str().unwrap_or("")),
        },
        Column {
            name: "Requestor",
            type_: "string",
            format: "",
            description: "Information about the requesting user.",
            priority: 0,
            cell: |o, _| json!(o["spec"]["username"].as_str().unwrap_or("")),
        },
        Column {
            name: "RequestedDuration",
            type_: "string",
            format: "",
            description: "Requested duration of the issued certificate.",
            priority: 0,
            cell: |o, _| {
                json!(
                    o["spec"]["expirationSeconds"]
                        .as_i64()
                        .map_or_else(|| "<none>".to_owned(), human_duration)
                )
            },
        },
        Column {
            name: "Condition",
            type_: "string",
            format: "",
            description: "Condition of the request.",
            priority: 0,
            cell: |o, _| condition_cell(o),
        },
    ],
    field: |o, p| {
        (p == "spec.signerName").then(|| o["spec"]["signerName"].as_str().unwrap_or("").to_owned())
    },
    field_paths: &["spec.signerName"],
    // Go writes the status (a non-pointer struct) as `{}` when a write leaves it out.
    prepare_update: |o| {
        if o.is_object() {
            super::zero::object_at(o, "status");
        }
    },
    // `PrepareForCreate`: nobody creates a request already approved or issued; the status
    // is the zero one, which Go writes as `{}` (a non-pointer struct).
    prepare_create: |o| {
        if o.is_object() {
            o["status"] = json!({});
        }
    },
    validate: validate_csr,
    to_storage: identity,
    from_storage: identity,
};

/// Upstream `populateConditionTimestamps` (`pkg/registry/certificates/certificates/
/// strategy.go`), which the `status` and `approval` subresources run on every write: a
/// condition's unset `lastUpdateTime` is `now`; its unset `lastTransitionTime` is that of
/// the old condition of the same type and status that has one, else `now`.
pub(super) fn populate_condition_timestamps(new: &mut Value, old: &Value, now: &str) {
    let old_conditions = old["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let Some(conditions) = new
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for c in conditions.iter_mut().filter(|c| c.is_object()) {
        if is_zero_time(&c["lastUpdateTime"]) {
            c["lastUpdateTime"] = json!(now);
        }
        if is_zero_time(&c["lastTransitionTime"]) {
            let kept = old_conditions
                .iter()
                .find(|o| {
                    o["type"] == c["type"]
                        && o["status"] == c["status"]
                        && !is_zero_time(&o["lastTransitionTime"])
                })
                .map(|o| o["lastTransitionTime"].clone());
            c["lastTransitionTime"] = kept.unwrap_or_else(|| json!(now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEM: &str =
        "-----BEGIN CERTIFICATE REQUEST-----\nMIIB\n-----END CERTIFICATE REQUEST-----\n";

    fn b64(s: &str) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn csr(conditions: Value) -> Value {
        json!({"metadata": {"name": "x"}, "spec": {"request": b64(PEM),
            "signerName": KUBELET_SERVING_SIGNER, "usages": ["server auth"]},
            "status": {"conditions": conditions}})
    }

    fn fields(errors: &[FieldError]) -> Vec<String> {
        errors
            .iter()
            .map(|e| format!("{}:{}", e.field, e.reason))
            .collect()
    }

    /// `pkg/apis/certificates/validation validateCertificateSigningRequest`: the request is
    /// a `CERTIFICATE REQUEST` PEM block, the signer a domain and path, usages known and
    /// given.
    #[test]
    fn a_request_needs_a_csr_pem_a_signer_and_known_usages() {
        assert!(validate_csr(&csr(json!([])), None).is_empty());
        let bad = json!({"metadata": {"name": "x"}, "spec": {
            "request": b64("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"),
            "signerName": "no-slash", "usages": ["server auth", "flying"]}});
        assert_eq!(
            fields(&validate_csr(&bad, None)),
            [
                "spec.request:FieldValueInvalid",
                "spec.signerName:FieldValueInvalid",
                "spec.usages[1]:FieldValueNotSupported"
            ]
        );
        let empty = json!({"metadata": {"name": "x"}, "spec": {}});
        assert_eq!(
            fields(&validate_csr(&empty, None)),
            [
                "spec.request:FieldValueRequired",
                "spec.signerName:FieldValueRequired",
                "spec.usages:FieldValueRequired"
            ]
        );
    }

    /// `validateConditions`: Approved and Denied are exclusive and only True; an update
    /// may not drop either (`ValidateCertificateSigningRequestApprovalUpdate`).
    #[test]
    fn approved_and_denied_are_exclusive_and_never_removed() {
        let both = csr(json!([{"type": "Approved", "status": "True"},
            {"type": "Denied", "status": "True"}]));
        assert_eq!(
            fields(&validate_csr(&both, None)),
            ["status.conditions[1].type:FieldValueInvalid"]
        );
        let false_approval = csr(json!([{"type": "Approved", "status": "False"}]));
        assert_eq!(
            fields(&validate_csr(&false_approval, None)),
            ["status.conditions[0].status:FieldValueNotSupported"]
        );
        let approved = csr(json!([{"type": "Approved", "status": "True"}]));
        assert_eq!(
            fields(&validate_csr(&csr(json!([])), Some(&approved))),
            ["status.conditions:FieldValueForbidden"]
        );
    }

    /// kubectl's Condition column.
    /// Upstream `csrStrategy.PrepareForCreate`: the status is the zero one, which Go writes
    /// as `{}`.
    #[test]
    fn new_requests_start_with_an_empty_status() {
        let mut c = csr(json!([{"type": "Approved", "status": "True"}]));
        (CERTIFICATE_SIGNING_REQUESTS.prepare_create)(&mut c);
        assert_eq!(c["status"], json!({}));
    }

    /// Upstream `populateConditionTimestamps`: an unset `lastUpdateTime` is now; an unset
    /// `lastTransitionTime` is the old one of a condition of the same type and status,
    /// else now; set times stay.
    #[test]
    fn condition_timestamps_are_populated() {
        let now = "2026-02-02T00:00:00Z";
        let old = csr(json!([{"type": "Approved", "status": "True",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]));
        let mut new = csr(json!([
            {"type": "Approved", "status": "True"},
            {"type": "Failed", "status": "True", "lastUpdateTime": "2026-01-05T00:00:00Z"}]));
        populate_condition_timestamps(&mut new, &old, now);
        assert_eq!(
            new["status"]["conditions"],
            json!([
                {"type": "Approved", "status": "True", "lastUpdateTime": now,
                    "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "Failed", "status": "True", "lastUpdateTime": "2026-01-05T00:00:00Z",
                    "lastTransitionTime": now}])
        );
    }

    #[test]
    fn the_condition_column_reads_as_kubectls() {
        assert_eq!(condition_cell(&csr(json!([]))), "Pending");
        let mut issued = csr(json!([{"type": "Approved", "status": "True"}]));
        issued["status"]["certificate"] = json!(b64("x"));
        assert_eq!(condition_cell(&issued), "Approved,Issued");
        let failed = csr(json!([{"type": "Approved", "status": "True"},
            {"type": "Failed", "status": "True"}]));
        assert_eq!(condition_cell(&failed), "Approved,Failed");
    }
}
