//! Throttling and unreachable endpoints, without moto (which never throttles): a loopback HTTP
//! server answers every EC2 call with `RequestLimitExceeded` (or every ELBv2 call with
//! `Throttling`/`ThrottlingException`), and the real SDK client retries through its adaptive
//! retry strategy until the provider gives up with a [`ErrorKind::Throttled`] error, the kind
//! the controller manager's shared cloud limiter lowers its rate on.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use cloud_provider::{CloudProvider, ErrorKind, conformance::Fixture};
use cloud_provider_aws::{AwsCloud, AwsOptions};

use crate::common;

const THROTTLED: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error>\
<Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors>\
<RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>";

/// Serves `THROTTLED` with HTTP 503 to every request; returns the endpoint and a request count.
async fn throttling_server() -> anyhow::Result<(String, Arc<AtomicUsize>)> {
    let count = Arc::new(AtomicUsize::new(0));
    let counter = count.clone();
    let endpoint = common::serve(Arc::new(move |_: &str| {
        counter.fetch_add(1, Ordering::SeqCst);
        (503, THROTTLED.to_owned())
    }))
    .await?;
    Ok((endpoint, count))
}

fn config(endpoint: &str) -> String {
    common::config(endpoint, "")
}

/// EC2's `RequestLimitExceeded` left after the SDK's retries (cloud-provider-aws slows the
/// region's calls on it, `retry_handler.go` `CrossRequestRetryDelay`) reaches the controllers
/// as a throttling error, so the shared limiter backs off; without a `Retry-After` it asks for no
/// fixed delay.
#[tokio::test]
async fn repeated_request_limit_exceeded_is_a_throttled_error() -> anyhow::Result<()> {
    let (endpoint, requests) = throttling_server().await?;
    let options = AwsOptions::default()
        .with_static_credentials("testing", "testing")
        .with_max_attempts(4)
        .with_backoff(
            std::time::Duration::from_millis(10),
            std::time::Duration::from_millis(50),
        );
    let cloud = AwsCloud::from_config_text_with(&config(&endpoint), options)?;
    let node = Fixture::node("i-0123456789abcdef0", None);
    let err = cloud
        .instances_v2()
        .expect("instances")
        .instance_metadata(&node)
        .await
        .expect_err("a throttled call cannot succeed");

    assert_eq!(err.kind(), ErrorKind::Throttled, "{err}");
    assert!(err.is_throttled());
    assert_eq!(err.retry_after_delay(), None, "{err}");
    let text = err.to_string();
    assert!(text.contains("RequestLimitExceeded"), "{text}");
    assert!(text.contains("DescribeInstances"), "{text}");
    // The SDK retried up to the bound, no more.
    assert_eq!(requests.load(Ordering::SeqCst), 4);
    let stats = cloud.metrics().snapshot();
    let di = stats
        .get("EC2:DescribeInstances")
        .copied()
        .unwrap_or_else(|| panic!("DescribeInstances not counted: {stats:?}"));
    assert_eq!(di.attempts, 4, "{stats:?}");
    assert_eq!(di.throttled, 4, "{stats:?}");
    assert_eq!(cloud.metrics().total_throttled(), 4);
    Ok(())
}

/// A `Retry-After` header on the throttled answer becomes the error's retry delay, which the
/// shared limiter holds every caller back for.
#[tokio::test]
async fn a_retry_after_header_on_a_throttled_answer_is_kept() -> anyhow::Result<()> {
    let endpoint = common::serve_with_headers(
        Arc::new(|_: &str| (503, THROTTLED.to_owned())),
        "Retry-After: 7\r\n",
    )
    .await?;
    let cloud = AwsCloud::from_config_text_with(&config(&endpoint), fast_retries(2))?;
    let node = Fixture::node("i-0123456789abcdef0", None);
    let err = cloud
        .instances_v2()
        .expect("instances")
        .instance_metadata_batch(&[&node])
        .await
        .pop()
        .expect("one result")
        .expect_err("a throttled call cannot succeed");
    assert!(err.is_throttled(), "{err}");
    assert_eq!(
        err.retry_after_delay(),
        Some(std::time::Duration::from_secs(7)),
        "{err}"
    );
    Ok(())
}

/// ELBv2 throttles with `Throttling` (and some front ends with `ThrottlingException`), in the
/// query protocol's `ErrorResponse`; both reach the service controller as throttling errors.
#[tokio::test]
async fn elbv2_throttling_codes_are_throttled_errors() -> anyhow::Result<()> {
    for code in ["Throttling", "ThrottlingException"] {
        let requests = Arc::new(AtomicUsize::new(0));
        let counter = requests.clone();
        let endpoint = common::serve(Arc::new(move |body: &str| {
            assert!(
                body.contains("Action=DescribeLoadBalancers"),
                "only DescribeLoadBalancers is expected: {body}"
            );
            counter.fetch_add(1, Ordering::SeqCst);
            (
                400,
                format!(
                    "<ErrorResponse xmlns=\"http://elasticloadbalancing.amazonaws.com/doc/\
                     2015-12-01/\"><Error><Type>Sender</Type><Code>{code}</Code>\
                     <Message>Rate exceeded</Message></Error><RequestId>r</RequestId>\
                     </ErrorResponse>"
                ),
            )
        }))
        .await?;
        let cloud = AwsCloud::from_config_text_with(&config(&endpoint), fast_retries(3))?;
        let service = Fixture::load_balancer_service();
        let err = cloud
            .load_balancer()
            .expect("load balancers")
            .get_load_balancer("kubernetes", &service)
            .await
            .expect_err("a throttled call cannot succeed");
        assert_eq!(err.kind(), ErrorKind::Throttled, "{code}: {err}");
        let text = err.to_string();
        assert!(text.contains(code), "{text}");
        assert!(text.contains("DescribeLoadBalancers"), "{text}");
        assert_eq!(requests.load(Ordering::SeqCst), 3, "{code}");
        assert_eq!(cloud.metrics().total_throttled(), 3, "{code}");
    }
    Ok(())
}

/// Options with `attempts` attempts per call and millisecond backoffs.
fn fast_retries(attempts: u32) -> AwsOptions {
    AwsOptions::default()
        .with_static_credentials("testing", "testing")
        .with_max_attempts(attempts)
        .with_backoff(
            std::time::Duration::from_millis(10),
            std::time::Duration::from_millis(50),
        )
}

#[tokio::test]
async fn unreachable_endpoint_is_a_clear_error() -> anyhow::Result<()> {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let options = AwsOptions::default()
        .with_static_credentials("testing", "testing")
        .with_max_attempts(1);
    let cloud =
        AwsCloud::from_config_text_with(&config(&format!("http://127.0.0.1:{port}")), options)?;
    let node = Fixture::node("i-0123456789abcdef0", None);
    let err = cloud
        .instances_v2()
        .expect("instances")
        .instance_exists(&node)
        .await
        .expect_err("nothing answers");
    assert!(
        err.to_string().contains("cannot reach the endpoint"),
        "{err}"
    );
    let batch = cloud
        .instances_v2()
        .expect("instances")
        .instance_metadata_batch(&[&node, &node])
        .await;
    assert_eq!(batch.len(), 2);
    assert!(
        batch
            .iter()
            .all(|r| r.as_ref().is_err_and(|e| !e.is_instance_not_found()))
    );
    Ok(())
}

#[test]
fn bad_cloud_config_names_the_key() {
    let err = AwsCloud::from_config_text("[Global]\nRegion = us-east-1\nVPCID = vpc-1\n")
        .err()
        .expect("unknown key");
    assert!(err.to_string().contains("\"VPCID\""), "{err}");
    let err = AwsCloud::from_config_text("[Global]\nNodeIPFamilies = ipv7\n")
        .err()
        .expect("bad value");
    assert!(err.to_string().contains("NodeIPFamilies"), "{err}");
    // Through the registry, as the ccm builds it.
    let registry = cloud_provider::Registry::global().expect("registry");
    assert!(registry.contains("aws"));
    let bad = cloud_provider::CloudConfig::new("/etc/aws.conf", "[Global]\nZone = nowhere 1\n");
    let err = registry.create("aws", Some(&bad)).err().expect("bad value");
    let text = format!(
        "{err} {:?}",
        std::error::Error::source(&err).map(|s| s.to_string())
    );
    assert!(text.contains("Global.Zone"), "{text}");
    let ok = cloud_provider::CloudConfig::new("/etc/aws.conf", "[Global]\nRegion = us-east-1\n");
    let cloud = registry.create("aws", Some(&ok)).expect("valid config");
    assert_eq!(cloud.provider_name(), "aws");
}
