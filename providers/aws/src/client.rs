//! SDK clients: configuration (region, credentials, endpoints, adaptive retry), call metrics by
//! operation, and the mapping of SDK errors to [`CloudError`]s.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use aws_config::{
    BehaviorVersion, Region, SdkConfig, retry::RetryConfig, sts::AssumeRoleProvider,
    timeout::TimeoutConfig,
};
use aws_sdk_ec2::config::ConfigBag;
use aws_sdk_ec2::{config::Credentials, error::ProvideErrorMetadata};
use aws_smithy_runtime_api::{
    box_error::BoxError,
    client::{
        interceptors::{
            Intercept,
            context::{BeforeTransmitInterceptorContextRef, FinalizerInterceptorContextRef},
        },
        orchestrator::Metadata,
        result::SdkError,
        runtime_components::RuntimeComponents,
    },
    http::Response as HttpResponse,
};
use aws_smithy_types::config_bag::{Storable, StoreReplace};
use cloud_provider::{
    CloudError,
    prometheus_client::{
        metrics::{counter::Counter, family::Family, histogram::Histogram},
        registry::Registry,
    },
};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::config::{AwsConfig, AwsService};

/// Error codes AWS uses for throttling (as the SDK's retry classifier knows them).
const THROTTLING_CODES: &[&str] = &[
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "EC2ThrottledException",
    "TooManyRequestsException",
    "RequestThrottled",
    "RequestThrottledException",
    "SlowDown",
    "BandwidthLimitExceeded",
    "ProvisionedThroughputExceededException",
];

/// The SDK's HTTP client: hyper 1 with rustls over ring (the crypto provider kube uses too),
/// trusting the platform's certificates. Plain `http://` endpoints (moto) work as well.
pub fn https_client() -> aws_sdk_ec2::config::SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
            aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https()
}

/// A provider config for IMDS lookups, with [`https_client`].
pub(crate) fn imds_provider_config() -> aws_config::provider_config::ProviderConfig {
    aws_config::provider_config::ProviderConfig::default().with_http_client(https_client())
}

/// Whether an AWS error code means "throttled".
pub(crate) fn is_throttling_code(code: &str) -> bool {
    THROTTLING_CODES.contains(&code)
}

/// How the SDK clients behave: retries, timeouts, credentials. The defaults suit production;
/// tests shorten the backoff and pass static credentials.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AwsOptions {
    /// Attempts per call, the first included (adaptive retry). Default 5.
    pub max_attempts: u32,
    /// The first retry backoff. Default 1 s.
    pub initial_backoff: Duration,
    /// The largest retry backoff. Default 20 s.
    pub max_backoff: Duration,
    /// Connect timeout. Default 5 s.
    pub connect_timeout: Duration,
    /// Timeout of one attempt. Default 30 s.
    pub attempt_timeout: Duration,
    /// Static credentials instead of the SDK's default chain (tests, moto).
    pub credentials: Option<Credentials>,
    /// How long looked-up instances are reused by load balancers and routes. Default 10 s.
    pub instance_cache_ttl: Duration,
    /// How long a single instance lookup waits for others to join its DescribeInstances.
    /// Default 20 ms.
    pub coalesce_window: Duration,
    /// How long a load balancer's security group deletion is retried while AWS still reports
    /// it in use (`DependencyViolation`) before asking the controller to come back. Default 30 s.
    pub security_group_delete_timeout: Duration,
    /// How long a failed DescribeInstanceTopology (other than an unsupported region) stops
    /// further calls; the topology labels are left out meanwhile. Default 5 min.
    pub topology_failure_backoff: Duration,
}

impl Default for AwsOptions {
    fn default() -> Self {
        AwsOptions {
            max_attempts: 5,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(20),
            connect_timeout: Duration::from_secs(5),
            attempt_timeout: Duration::from_secs(30),
            credentials: None,
            instance_cache_ttl: Duration::from_secs(10),
            coalesce_window: Duration::from_millis(20),
            security_group_delete_timeout: Duration::from_secs(30),
            topology_failure_backoff: Duration::from_secs(300),
        }
    }
}

impl AwsOptions {
    /// Sets the attempts per call.
    pub fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// Sets the retry backoff bounds.
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max;
        self
    }

    /// Uses static credentials instead of the default chain.
    pub fn with_static_credentials(mut self, access_key: &str, secret_key: &str) -> Self {
        self.credentials = Some(Credentials::new(
            access_key,
            secret_key,
            None,
            None,
            "ccm-rs-static",
        ));
        self
    }

    /// Sets the instance cache lifetime.
    pub fn with_instance_cache_ttl(mut self, ttl: Duration) -> Self {
        self.instance_cache_ttl = ttl;
        self
    }

    /// Sets how long a failed DescribeInstanceTopology stops further calls.
    pub fn with_topology_failure_backoff(mut self, backoff: Duration) -> Self {
        self.topology_failure_backoff = backoff;
        self
    }

    /// Sets the connect and per-attempt timeouts.
    pub fn with_timeouts(mut self, connect: Duration, attempt: Duration) -> Self {
        self.connect_timeout = connect;
        self.attempt_timeout = attempt;
        self
    }
}

/// Counters for one AWS operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OperationStats {
    /// HTTP attempts sent (retries included).
    pub attempts: u64,
    /// Attempts answered with a throttling error.
    pub throttled: u64,
    /// Attempts that ended in any error (throttling included).
    pub errors: u64,
}

/// A Prometheus label set: one `(name, value)` pair.
type Labels = Vec<(&'static str, String)>;

/// The request-duration histogram family (seconds, upstream's default buckets).
type DurationFamily = Family<Labels, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    // Prometheus' default buckets, as upstream's `cloudprovider_aws_api_request_duration_seconds`.
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ])
}

/// Call metrics by operation, keyed `<SDK service name>:<Operation>` (`EC2:DescribeInstances`…),
/// shared by every client of one provider. The same counts feed the controller manager's
/// `/metrics` under upstream's names (see [`CallMetrics::register`]).
#[derive(Debug)]
pub struct CallMetrics {
    ops: Mutex<BTreeMap<String, OperationStats>>,
    duration: DurationFamily,
    errors: Family<Labels, Counter>,
    throttled: Family<Labels, Counter>,
}

impl Default for CallMetrics {
    fn default() -> Self {
        CallMetrics {
            ops: Mutex::default(),
            duration: Family::new_with_constructor(duration_histogram),
            errors: Family::default(),
            throttled: Family::default(),
        }
    }
}

impl CallMetrics {
    /// A copy of the counters, keyed by `<SDK service name>:<Operation>`.
    pub fn snapshot(&self) -> BTreeMap<String, OperationStats> {
        self.ops.lock().clone()
    }

    /// Total attempts over all operations.
    pub fn total_attempts(&self) -> u64 {
        self.ops.lock().values().map(|s| s.attempts).sum()
    }

    /// Attempts of one operation, e.g. `DescribeInstances` (any service).
    pub fn attempts_of(&self, operation: &str) -> u64 {
        self.ops
            .lock()
            .iter()
            .filter(|(k, _)| k.rsplit(':').next() == Some(operation))
            .map(|(_, s)| s.attempts)
            .sum()
    }

    /// Total throttled attempts.
    pub fn total_throttled(&self) -> u64 {
        self.ops.lock().values().map(|s| s.throttled).sum()
    }

    /// Registers the metrics under upstream's names (cloud-provider-aws `aws_metrics.go`):
    /// `cloudprovider_aws_api_request_duration_seconds{request}` (a histogram of attempt
    /// durations, so its `_count` is the number of calls), `cloudprovider_aws_api_request_errors`
    /// `{request}` and `cloudprovider_aws_api_throttled_requests{operation_name}`; the
    /// `request` and `operation_name` values are `<service>:<Operation>`. Counters get the
    /// OpenMetrics `_total` suffix. A family shows from its first sample on.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "cloudprovider_aws_api_request_duration_seconds",
            "Latency of AWS API calls, per attempt",
            self.duration.clone(),
        );
        registry.register(
            "cloudprovider_aws_api_request_errors",
            "AWS API attempts that ended in an error",
            self.errors.clone(),
        );
        registry.register(
            "cloudprovider_aws_api_throttled_requests",
            "AWS API attempts that were throttled",
            self.throttled.clone(),
        );
    }

    fn record(&self, key: String, throttled: bool, error: bool, elapsed: Option<Duration>) {
        if let Some(elapsed) = elapsed {
            self.duration
                .get_or_create(&vec![("request", key.clone())])
                .observe(elapsed.as_secs_f64());
        }
        if error {
            self.errors
                .get_or_create(&vec![("request", key.clone())])
                .inc();
        }
        if throttled {
            self.throttled
                .get_or_create(&vec![("operation_name", key.clone())])
                .inc();
        }
        let mut ops = self.ops.lock();
        let stats = ops.entry(key).or_default();
        stats.attempts += 1;
        stats.throttled += u64::from(throttled);
        stats.errors += u64::from(error);
    }
}

/// When the current attempt started, kept in the request's config bag.
#[derive(Debug, Clone, Copy)]
struct AttemptStart(Instant);

impl Storable for AttemptStart {
    type Storer = StoreReplace<Self>;
}

/// Counts every attempt, and every throttled one, by operation.
#[derive(Debug, Clone)]
struct MetricsInterceptor {
    metrics: Arc<CallMetrics>,
}

impl Intercept for MetricsInterceptor {
    fn name(&self) -> &'static str {
        "ccm-rs-call-metrics"
    }

    fn read_before_attempt(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        cfg.interceptor_state()
            .store_put(AttemptStart(Instant::now()));
        Ok(())
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let key = cfg
            .load::<Metadata>()
            .map(|m| format!("{}:{}", m.service(), m.name()))
            .unwrap_or_else(|| "unknown:unknown".to_owned());
        let elapsed = cfg.load::<AttemptStart>().map(|s| s.0.elapsed());
        let error = matches!(context.output_or_error(), Some(Err(_)));
        let throttled = context.response().is_some_and(|resp| {
            resp.status().as_u16() >= 400
                && resp.body().bytes().is_some_and(|body| {
                    let text = String::from_utf8_lossy(body);
                    THROTTLING_CODES
                        .iter()
                        .any(|code| text.contains(&format!("<Code>{code}</Code>")))
                })
        });
        tracing::trace!(operation = %key, error, throttled, "aws attempt");
        self.metrics.record(key, throttled, error, elapsed);
        Ok(())
    }
}

/// The SDK clients of one provider.
#[derive(Debug, Clone)]
pub(crate) struct Clients {
    pub(crate) ec2: aws_sdk_ec2::Client,
    pub(crate) elb: aws_sdk_elasticloadbalancingv2::Client,
    /// The Classic ELB API (same endpoint as ELBv2): only to find and delete what
    /// cloud-provider-aws made.
    pub(crate) classic: aws_sdk_elasticloadbalancing::Client,
    pub(crate) region: String,
}

/// Builds the clients: region from the config (IMDS only when it names none), the default
/// credential chain (or the options' static credentials), AssumeRole for `RoleARN`, endpoint
/// overrides, adaptive retry and the metrics interceptor.
pub(crate) async fn build_clients(
    config: &AwsConfig,
    options: &AwsOptions,
    metrics: &Arc<CallMetrics>,
) -> Result<Clients, CloudError> {
    let region = match config.configured_region() {
        Some(region) => region,
        None => {
            let imds = aws_config::imds::region::ImdsRegionProvider::builder()
                .configure(&imds_provider_config())
                .build();
            imds.region().await.map(|r| r.to_string()).ok_or_else(|| {
                CloudError::message(
                    "no Region or Zone in the cloud-config [Global] section, and the \
                         instance metadata service (IMDS) did not give one",
                )
            })?
        }
    };
    let retry = RetryConfig::adaptive()
        .with_max_attempts(options.max_attempts)
        .with_initial_backoff(options.initial_backoff)
        .with_max_backoff(options.max_backoff);
    let timeouts = TimeoutConfig::builder()
        .connect_timeout(options.connect_timeout)
        .operation_attempt_timeout(options.attempt_timeout)
        .build();
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .http_client(https_client())
        .region(Region::new(region.clone()))
        .retry_config(retry)
        .timeout_config(timeouts);
    if let Some(creds) = &options.credentials {
        loader = loader.credentials_provider(creds.clone());
    }
    let mut sdk: SdkConfig = loader.load().await;
    if let Some(role_arn) = &config.role_arn {
        let mut sts_conf = sdk.to_builder();
        if let Some(o) = config.endpoint_for(AwsService::Sts, &region) {
            sts_conf = sts_conf.endpoint_url(o.url.clone());
        }
        let provider = AssumeRoleProvider::builder(role_arn.clone())
            .session_name("ccm-rs-cloud-controller-manager")
            .configure(&sts_conf.build())
            .build()
            .await;
        sdk = sdk
            .into_builder()
            .credentials_provider(aws_sdk_ec2::config::SharedCredentialsProvider::new(
                provider,
            ))
            .build();
    }
    let interceptor = MetricsInterceptor {
        metrics: metrics.clone(),
    };

    let mut ec2 = aws_sdk_ec2::config::Builder::from(&sdk).interceptor(interceptor.clone());
    if let Some(o) = config.endpoint_for(AwsService::Ec2, &region) {
        ec2 = ec2.endpoint_url(o.url.clone());
        if let Some(signing) = &o.signing_region {
            ec2 = ec2.region(Region::new(signing.clone()));
        }
    }
    let mut elb = aws_sdk_elasticloadbalancingv2::config::Builder::from(&sdk)
        .interceptor(interceptor.clone());
    let mut classic =
        aws_sdk_elasticloadbalancing::config::Builder::from(&sdk).interceptor(interceptor);
    if let Some(o) = config.endpoint_for(AwsService::ElbV2, &region) {
        elb = elb.endpoint_url(o.url.clone());
        classic = classic.endpoint_url(o.url.clone());
        if let Some(signing) = &o.signing_region {
            elb = elb.region(Region::new(signing.clone()));
            classic = classic.region(Region::new(signing.clone()));
        }
    }
    Ok(Clients {
        ec2: aws_sdk_ec2::Client::from_conf(ec2.build()),
        elb: aws_sdk_elasticloadbalancingv2::Client::from_conf(elb.build()),
        classic: aws_sdk_elasticloadbalancing::Client::from_conf(classic.build()),
        region,
    })
}

/// The AWS error code of an SDK error, if the service sent one.
pub(crate) fn error_code<E: ProvideErrorMetadata>(err: &SdkError<E, HttpResponse>) -> Option<&str> {
    match err {
        SdkError::ServiceError(se) => se.err().code(),
        _ => None,
    }
}

/// The delay an HTTP `Retry-After` header asks for, in whole seconds (the only form AWS
/// endpoints and proxies in front of them send; an HTTP date is ignored).
fn retry_after_header(response: &HttpResponse) -> Option<Duration> {
    response
        .headers()
        .get("retry-after")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// Maps an SDK error to a [`CloudError`] that says which call failed and why. A throttling code
/// (EC2's `RequestLimitExceeded`, ELBv2's `Throttling`/`ThrottlingException`, …) left after
/// the SDK's adaptive retries becomes [`CloudError::Throttled`], carrying the response's
/// `Retry-After` when there is one, so the controller manager's shared cloud limiter lowers its
/// rate (upstream cloud-provider-aws leaves this to the SDK's retryer alone); an unreachable
/// endpoint says so.
pub(crate) fn aws_error<E>(operation: &str, err: SdkError<E, HttpResponse>) -> CloudError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let detail = aws_sdk_ec2::error::DisplayErrorContext(&err).to_string();
    match &err {
        SdkError::ServiceError(se) => {
            let code = se.err().code().unwrap_or("Unknown");
            let message = se.err().message().unwrap_or_default();
            if is_throttling_code(code) {
                return CloudError::throttled(
                    retry_after_header(se.raw()),
                    format!(
                        "AWS {operation} is throttled ({code}) even after the SDK's adaptive \
                         retries: {message}"
                    ),
                );
            }
            CloudError::context(
                format!("AWS {operation} failed"),
                format!("{code}: {message}"),
            )
        }
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) => CloudError::context(
            format!("AWS {operation} failed: cannot reach the endpoint"),
            detail,
        ),
        _ => CloudError::context(format!("AWS {operation} failed"), detail),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttling_codes() {
        assert!(is_throttling_code("RequestLimitExceeded"));
        assert!(is_throttling_code("Throttling"));
        assert!(!is_throttling_code("InvalidInstanceID.NotFound"));
    }

    #[test]
    fn metrics_count_by_operation() {
        let m = CallMetrics::default();
        m.record("ec2:DescribeInstances".into(), false, false, None);
        m.record("ec2:DescribeInstances".into(), true, true, None);
        m.record(
            "elasticloadbalancing:CreateListener".into(),
            false,
            true,
            None,
        );
        assert_eq!(m.attempts_of("DescribeInstances"), 2);
        assert_eq!(m.total_attempts(), 3);
        assert_eq!(m.total_throttled(), 1);
        assert_eq!(m.snapshot()["ec2:DescribeInstances"].errors, 1);
    }

    /// The counts reach Prometheus under upstream's names (cloud-provider-aws aws_metrics.go).
    #[test]
    fn metrics_are_exposed_under_upstreams_names() {
        let m = CallMetrics::default();
        m.record(
            "EC2:DescribeInstances".into(),
            false,
            false,
            Some(Duration::from_millis(20)),
        );
        m.record(
            "EC2:DescribeInstances".into(),
            true,
            true,
            Some(Duration::from_millis(30)),
        );
        let mut registry = Registry::default();
        m.register(&mut registry);
        let mut text = String::new();
        cloud_provider::prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "cloudprovider_aws_api_request_duration_seconds_count{request=\"EC2:DescribeInstances\"} 2",
            "cloudprovider_aws_api_request_errors_total{request=\"EC2:DescribeInstances\"} 1",
            "cloudprovider_aws_api_throttled_requests_total{operation_name=\"EC2:DescribeInstances\"} 1",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }
}
