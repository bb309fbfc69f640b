//! Attaching to any API server, as kube-controller-manager, kube-scheduler and kwok do:
//! `--kubeconfig` (and `--master` over its server), else the in-cluster config of a pod.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The cluster to attach to: kube-controller-manager's `--kubeconfig` and `--master`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ClusterArgs {
    /// Path to a kubeconfig file: the cluster (its current context) and the credentials.
    /// Without it, the in-cluster config of a pod.
    #[arg(long, value_name = "FILE")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// The API server's address, over the kubeconfig's.
    #[arg(long, value_name = "URL")]
    pub(crate) master: Option<String>,
}

/// A client of the cluster `args` name, and the CA that cluster's kubeconfig trusts (PEM,
/// `certificate-authority-data` or `certificate-authority`; the service account's CA in a
/// pod), when it names one.
pub(crate) async fn connect(args: &ClusterArgs) -> anyhow::Result<(kube::Client, Option<String>)> {
    let master = args
        .master
        .as_deref()
        .filter(|m| !m.is_empty())
        .map(|m| {
            m.parse::<axum::http::Uri>()
                .with_context(|| format!("--master {m:?} is not a URL"))
        })
        .transpose()?;
    let (mut config, ca) = match &args.kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("--kubeconfig {}", path.display()))?;
            let ca = kubeconfig_ca(&file, path)?;
            let config = kube::Config::from_custom_kubeconfig(
                file,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .with_context(|| format!("--kubeconfig {}", path.display()))?;
            (config, ca)
        }
        None => match &master {
            Some(master) => (kube::Config::new(master.clone()), None),
            None => {
                let config = kube::Config::incluster().map_err(|e| {
                    anyhow::anyhow!("no --kubeconfig and not running in a cluster: {e}")
                })?;
                let ca =
                    std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
                        .ok();
                (config, ca)
            }
        },
    };
    if let Some(master) = master {
        config.cluster_url = master;
    }
    let client = kube::Client::try_from(config).context("building the API client")?;
    Ok((client, ca))
}

/// The CA of the kubeconfig's current cluster, as PEM.
fn kubeconfig_ca(file: &kube::config::Kubeconfig, path: &Path) -> anyhow::Result<Option<String>> {
    let context = file
        .current_context
        .as_deref()
        .and_then(|name| file.contexts.iter().find(|c| c.name == name))
        .and_then(|c| c.context.as_ref());
    let Some(cluster) = context
        .and_then(|c| file.clusters.iter().find(|n| n.name == c.cluster))
        .and_then(|n| n.cluster.as_ref())
    else {
        return Ok(None);
    };
    if let Some(data) = cluster
        .certificate_authority_data
        .as_deref()
        .filter(|d| !d.is_empty())
    {
        use serde::Deserialize;
        let decoded = k8s_openapi::ByteString::deserialize(serde::de::value::StrDeserializer::<
            serde::de::value::Error,
        >::new(data.trim()))
        .with_context(|| {
            format!(
                "--kubeconfig {}: certificate-authority-data is not base64",
                path.display()
            )
        })?;
        return match String::from_utf8(decoded.0) {
            Ok(pem) => Ok(Some(pem)),
            Err(_) => bail!(
                "--kubeconfig {}: certificate-authority-data is not PEM",
                path.display()
            ),
        };
    }
    match cluster
        .certificate_authority
        .as_deref()
        .filter(|f| !f.is_empty())
    {
        Some(file) => std::fs::read_to_string(file)
            .map(Some)
            .with_context(|| format!("--kubeconfig {}: reading {file}", path.display())),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_comes_from_the_current_contexts_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&ca_file, "FILE PEM\n").unwrap();
        let write = |cluster: &str| {
            let path = dir.path().join("kubeconfig");
            std::fs::write(
                &path,
                format!(
                    "apiVersion: v1\nkind: Config\nclusters:\n- name: other\n  cluster: {{server: https://127.0.0.1:1, certificate-authority-data: b3RoZXI=}}\n- name: c\n  cluster: {{server: https://127.0.0.1:2, {cluster}}}\nusers: [{{name: u, user: {{}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n"
                ),
            )
            .unwrap();
            let file = kube::config::Kubeconfig::read_from(&path).unwrap();
            kubeconfig_ca(&file, &path)
        };
        // "PEM\n" in base64.
        assert_eq!(
            write("certificate-authority-data: UEVNCg==").unwrap(),
            Some("PEM\n".to_owned())
        );
        assert_eq!(
            write("certificate-authority: ca.crt").unwrap(),
            Some("FILE PEM\n".to_owned())
        );
        assert_eq!(write("insecure-skip-tls-verify: true").unwrap(), None);
        let bad = write("certificate-authority-data: '***'").unwrap_err();
        assert!(bad.to_string().contains("not base64"), "{bad:#}");
    }
}
