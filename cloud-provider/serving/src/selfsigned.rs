//! A serving certificate when none is given.

use std::net::IpAddr;

/// A serving certificate chain and its key, in PEM.
#[derive(Clone)]
pub struct CertKey {
    /// The certificate, then its chain.
    pub cert_pem: String,
    /// The private key.
    pub key_pem: String,
}

impl std::fmt::Debug for CertKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertKey").finish_non_exhaustive()
    }
}

/// Why a certificate could not be generated.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {message}")]
pub struct CertificateError {
    /// Which part.
    pub what: String,
    /// Why.
    pub message: String,
}

fn error(what: impl Into<String>, message: impl std::fmt::Display) -> CertificateError {
    CertificateError {
        what: what.into(),
        message: message.to_string(),
    }
}

/// client-go's `GenerateSelfSignedCertKey`: a CA (`<host>-ca@<unix time>`) and a serving
/// certificate (`<host>@<unix time>`) for `host` (plus `ips` and `dns`) signed by it, valid
/// for a year (from an hour ago); the PEM holds the certificate, then the CA. Keys are ECDSA
/// P-256 (ring makes no RSA keys).
pub fn self_signed(host: &str, ips: &[IpAddr], dns: &[&str]) -> Result<CertKey, CertificateError> {
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
        IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
    };
    let now = time::OffsetDateTime::now_utc();
    let stamp = now.unix_timestamp();
    let year = time::Duration::days(365);
    let name = |cn: String| {
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        dn
    };
    let mut ca = CertificateParams::default();
    ca.distinguished_name = name(format!("{host}-ca@{stamp}"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    (ca.not_before, ca.not_after) = (now - time::Duration::hours(1), now + year);
    let ca_key = KeyPair::generate().map_err(|e| error("CA key", e))?;
    let ca_cert = ca
        .self_signed(&ca_key)
        .map_err(|e| error("CA certificate", e))?;
    let issuer = Issuer::new(ca, ca_key);

    let mut leaf = CertificateParams::default();
    leaf.distinguished_name = name(format!("{host}@{stamp}"));
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.use_authority_key_identifier_extension = true;
    (leaf.not_before, leaf.not_after) = (now - time::Duration::hours(1), now + year);
    let mut names = Vec::new();
    match host.parse::<IpAddr>() {
        Ok(ip) => names.push(SanType::IpAddress(ip)),
        Err(_) => names.push(SanType::DnsName(
            host.to_owned()
                .try_into()
                .map_err(|e| error(format!("host {host:?}"), e))?,
        )),
    }
    names.extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
    for name in dns.iter().filter(|n| **n != host) {
        names.push(SanType::DnsName(
            (*name)
                .to_owned()
                .try_into()
                .map_err(|e| error(format!("name {name:?}"), e))?,
        ));
    }
    leaf.subject_alt_names = names;
    let key = KeyPair::generate().map_err(|e| error("serving key", e))?;
    let cert = leaf
        .signed_by(&key, &issuer)
        .map_err(|e| error("serving certificate", e))?;
    Ok(CertKey {
        cert_pem: format!("{}{}", cert.pem(), ca_cert.pem()),
        key_pem: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    use x509_parser::extensions::GeneralName;

    use super::*;

    /// client-go `GenerateSelfSignedCertKey`: leaf then CA, the leaf issued by the CA, named
    /// `<host>@<time>` with the host, IPs and DNS names as SANs, for serving.
    #[test]
    fn a_self_signed_pair_is_a_serving_leaf_and_its_ca() {
        let pair = self_signed(
            "localhost",
            &[IpAddr::from([127, 0, 0, 1])],
            &["localhost", "ccm"],
        )
        .unwrap();
        let chain: Vec<CertificateDer<'_>> =
            CertificateDer::pem_slice_iter(pair.cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .unwrap();
        assert_eq!(chain.len(), 2);
        let (_, leaf) = x509_parser::parse_x509_certificate(&chain[0]).unwrap();
        let (_, ca) = x509_parser::parse_x509_certificate(&chain[1]).unwrap();
        let cn = |c: &x509_parser::certificate::X509Certificate<'_>| {
            c.subject()
                .iter_common_name()
                .next()
                .unwrap()
                .as_str()
                .unwrap()
                .to_owned()
        };
        assert!(cn(&leaf).starts_with("localhost@"), "{}", cn(&leaf));
        assert!(cn(&ca).starts_with("localhost-ca@"), "{}", cn(&ca));
        assert_eq!(leaf.issuer(), ca.subject());
        assert!(ca.is_ca() && !leaf.is_ca());
        let sans: Vec<String> = leaf
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .iter()
            .map(|n| match n {
                GeneralName::DNSName(d) => d.to_string(),
                GeneralName::IPAddress(ip) => format!("{ip:?}"),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(sans, ["localhost", "[127, 0, 0, 1]", "ccm"]);
        assert!(
            leaf.extended_key_usage()
                .unwrap()
                .unwrap()
                .value
                .server_auth
        );
        // The key is the leaf's and usable by rustls.
        rustls::pki_types::PrivateKeyDer::from_pem_slice(pair.key_pem.as_bytes()).unwrap();
        assert!(!format!("{pair:?}").contains("PRIVATE"));
    }

    #[test]
    fn an_unusable_host_name_is_an_error_not_a_panic() {
        let err = self_signed("h\u{f4}te", &[], &[]).unwrap_err();
        assert!(err.to_string().contains("host"), "{err}");
    }
}
