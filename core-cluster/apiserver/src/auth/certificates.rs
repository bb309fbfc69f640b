//! The CertificateSigningRequest admission of kube-apiserver:
//!
//! - the requester: `pkg/registry/certificates/certificates/strategy.go PrepareForCreate`
//!   writes `spec.username`, `uid`, `groups` and `extra` from the authenticated user, so a
//!   request cannot name someone else;
//! - the request: `pkg/apis/certificates/validation` `parseCSR` (its DER must be a PKCS#10
//!   certification request whose signature checks; the PEM part is checked with the
//!   resource);
//! - `plugin/pkg/admission/certificates/approval`: a write of `/approval` needs `approve`
//!   on `certificates.k8s.io/signers` named by the request's signer (or `<domain>/*`);
//! - `plugin/pkg/admission/certificates/signing`: a write of `/status` that changes the
//!   certificate or the conditions needs `sign` on the signer likewise
//!   (`IsAuthorizedForSignerName`).

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{
    UserInfo,
    authz::{Attributes, Decision},
    chain::Authorizer,
};
use crate::{
    registry::{
        FieldError,
        certificates::{CERTIFICATES_GROUP, bytes_field, request_der},
    },
    storage::{
        admission::{Admission, AdmissionAttributes, Operation},
        invalid, qualified,
        status::ApiError,
    },
};

/// The admission of CertificateSigningRequests (see the module's documentation).
#[derive(Debug, Clone)]
pub(crate) struct CertificateAdmission {
    authorizer: Arc<Authorizer>,
}

impl CertificateAdmission {
    /// The plugins, deciding `approve` and `sign` with `authorizer`.
    pub(crate) fn new(authorizer: Arc<Authorizer>) -> Self {
        CertificateAdmission { authorizer }
    }

    /// `IsAuthorizedForSignerName`: `verb` on the signer by name, else on `<domain>/*`.
    async fn authorized_for_signer(&self, user: &UserInfo, verb: &str, signer: &str) -> bool {
        let mut names = vec![signer.to_owned()];
        if let Some((domain, _)) = signer.split_once('/') {
            names.push(format!("{domain}/*"));
        }
        for name in names {
            let attrs =
                Attributes::resource(user.clone(), verb, CERTIFICATES_GROUP, "signers", "", &name);
            if self.authorizer.authorize(&attrs).await == Decision::Allow {
                return true;
            }
        }
        false
    }
}

fn is_csr(attrs: &AdmissionAttributes<'_>) -> bool {
    attrs.resource.group == CERTIFICATES_GROUP && attrs.resource.kind == "CertificateSigningRequest"
}

impl Admission for CertificateAdmission {
    fn name(&self) -> &'static str {
        "CertificateApproval"
    }

    fn mutate<'a>(
        &'a self,
        attrs: &'a AdmissionAttributes<'a>,
        object: &'a mut Value,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        if is_csr(attrs) && attrs.operation == Operation::Create && attrs.subresource.is_none() {
            let user = attrs.user;
            if let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) {
                spec.insert("username".into(), json!(user.name));
                for (key, value) in [
                    ("uid", (!user.uid.is_empty()).then(|| json!(user.uid))),
                    (
                        "groups",
                        (!user.groups.is_empty()).then(|| json!(user.groups)),
                    ),
                    ("extra", (!user.extra.is_empty()).then(|| json!(user.extra))),
                ] {
                    match value {
                        Some(v) => spec.insert(key.into(), v),
                        None => spec.remove(key),
                    };
                }
            }
        }
        Box::pin(async { Ok(()) })
    }

    fn admit<'a>(
        &'a self,
        attrs: &'a AdmissionAttributes<'a>,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(async move {
            if !is_csr(attrs) {
                return Ok(());
            }
            let (Some(new), operation) = (attrs.object, attrs.operation) else {
                return Ok(());
            };
            if operation == Operation::Create {
                return check_request(attrs, new);
            }
            let old = attrs.old_object.unwrap_or(&Value::Null);
            let signer = old["spec"]["signerName"].as_str().unwrap_or("");
            let denied = |verb: &str| {
                ApiError::forbidden(
                    &qualified(attrs.resource, attrs.name),
                    &format!("user not permitted to {verb} requests with signerName {signer:?}"),
                )
            };
            let verb = match attrs.subresource {
                Some("approval") => "approve",
                // Only a write that changes the certificate or the conditions signs.
                Some("status")
                    if new["status"]["certificate"] != old["status"]["certificate"]
                        || new["status"]["conditions"] != old["status"]["conditions"] =>
                {
                    "sign"
                }
                _ => return Ok(()),
            };
            if !self.authorized_for_signer(attrs.user, verb, signer).await {
                return Err(denied(verb));
            }
            Ok(())
        })
    }
}

/// `parseCSR`: the request's DER is a PKCS#10 certification request.
fn check_request(attrs: &AdmissionAttributes<'_>, new: &Value) -> Result<(), ApiError> {
    use x509_parser::{certification_request::X509CertificationRequest, prelude::FromDer};
    let Some(pem) = bytes_field(&new["spec"]["request"]) else {
        return Ok(()); // The resource's validation has answered.
    };
    let Ok(der) = request_der(&pem) else {
        return Ok(());
    };
    let problem = match X509CertificationRequest::from_der(&der) {
        Err(e) => Some(format!("x509: malformed certificate request: {e}")),
        Ok((_, csr)) => csr
            .verify_signature()
            .err()
            .map(|e| format!("x509: certificate request signature: {e}")),
    };
    if let Some(problem) = problem {
        return Err(invalid(
            attrs.resource,
            attrs.name,
            vec![FieldError::invalid(
                "spec.request",
                &json!("<request data>"),
                problem,
            )],
        ));
    }
    Ok(())
}
