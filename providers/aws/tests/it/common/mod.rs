//! A loopback HTTP server standing in for an AWS endpoint where moto cannot produce a
//! condition. It uses a real socket rather than the SDK's `test-util` replay client, so the SDK
//! crates are compiled once with one feature set for the whole workspace.

use std::sync::Arc;

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

/// An answer: HTTP status and XML body.
pub(crate) type Answer = (u16, String);

/// Serves every request with `handler(body)`, one request per connection; returns the
/// endpoint URL.
pub(crate) async fn serve(
    handler: Arc<dyn Fn(&str) -> Answer + Send + Sync>,
) -> anyhow::Result<String> {
    serve_with_headers(handler, "").await
}

/// As [`serve`], with `headers` (whole `Name: value\r\n` lines) added to every answer.
pub(crate) async fn serve_with_headers(
    handler: Arc<dyn Fn(&str) -> Answer + Send + Sync>,
    headers: &'static str,
) -> anyhow::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let handler = handler.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // Read the headers and the body (Content-Length), then answer and close.
                let body = loop {
                    let Ok(n) = sock.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len = text[..end]
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse::<usize>().ok())
                                    .flatten()
                            })
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + len {
                            break text[end + 4..].to_owned();
                        }
                    }
                };
                let (status, xml) = handler(&body);
                let resp = format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: text/xml\r\n{headers}\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{xml}",
                    xml.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    Ok(format!("http://{addr}"))
}

/// The `key=value` pairs of a form-encoded query-protocol body (values as sent).
pub(crate) fn form(body: &str) -> Vec<(String, String)> {
    body.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// A cloud config pointing EC2 and ELB at `endpoint`, with more `[Global]` lines.
pub(crate) fn config(endpoint: &str, global: &str) -> String {
    format!(
        "[Global]\nRegion = us-east-1\nVPC = vpc-1\nKubernetesClusterID = t\n{global}\
         [ServiceOverride \"1\"]\nService = ec2\nURL = {endpoint}\n\
         [ServiceOverride \"2\"]\nService = elasticloadbalancing\nURL = {endpoint}\n"
    )
}
