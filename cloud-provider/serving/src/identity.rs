//! Who is on the other end of a connection.

use std::net::SocketAddr;

/// The identity a verified client certificate names: CN is the user, each O a group
/// (upstream's `staging/src/k8s.io/apiserver/pkg/authentication/request/x509/x509.go`
/// `CommonNameUserConversion`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateIdentity {
    /// The user (CN).
    pub user: String,
    /// The groups (O), in the certificate's order.
    pub groups: Vec<String>,
}

impl CertificateIdentity {
    /// The identity of a DER certificate; `None` when it does not parse or its CN is empty
    /// (upstream: not authenticated by this certificate).
    pub fn from_der(der: &[u8]) -> Option<Self> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject = cert.subject();
        let user = subject.iter_common_name().next()?.as_str().ok()?.to_owned();
        if user.is_empty() {
            return None;
        }
        let groups = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_owned))
            .collect();
        Some(CertificateIdentity { user, groups })
    }

    /// The identity of the leaf of a verified peer chain (rustls' `peer_certificates`).
    pub fn from_chain(chain: Option<&[rustls::pki_types::CertificateDer<'_>]>) -> Option<Self> {
        chain
            .and_then(|chain| chain.first())
            .and_then(|leaf| Self::from_der(leaf))
    }
}

/// A connection's client: its address and, when it presented a verified client certificate,
/// the identity it names. [`serve`](crate::serve) puts it into every request's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// The client's address.
    pub addr: SocketAddr,
    /// The verified client certificate's identity.
    pub certificate: Option<CertificateIdentity>,
}

#[cfg(test)]
mod tests {
    use rcgen::{CertificateParams, DnType, KeyPair};

    use super::*;

    fn der(cn: Option<&str>, orgs: &[&str]) -> Vec<u8> {
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(cn) = cn {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        for org in orgs {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *org);
        }
        let key = KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    /// x509.go `CommonNameUserConversion`: CN is the user, O the groups; no CN, no user.
    #[test]
    fn common_name_is_the_user_and_organizations_the_groups() {
        assert_eq!(
            CertificateIdentity::from_der(&der(Some("system:node:n1"), &["system:nodes"])),
            Some(CertificateIdentity {
                user: "system:node:n1".into(),
                groups: vec!["system:nodes".into()],
            })
        );
        assert_eq!(CertificateIdentity::from_der(&der(None, &["g"])), None);
        assert_eq!(CertificateIdentity::from_der(&der(Some(""), &["g"])), None);
        assert_eq!(CertificateIdentity::from_der(b"not a certificate"), None);
        assert_eq!(CertificateIdentity::from_chain(None), None);
        let chain = [rustls::pki_types::CertificateDer::from(der(
            Some("alice"),
            &[],
        ))];
        assert_eq!(
            CertificateIdentity::from_chain(Some(&chain)).map(|i| i.user),
            Some("alice".to_owned())
        );
    }
}
